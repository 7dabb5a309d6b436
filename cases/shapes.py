"""Per-expert shapes: Nemotron-3 routed-expert shapes, ragged and empty experts (layout only)."""

from __future__ import annotations

NEMOTRON: dict[str, dict[str, tuple[int, int]]] = {
    "nano": {"fc1": (1856, 2688), "fc2": (2688, 1856)},
    "super": {"fc1": (2688, 1024), "fc2": (1024, 2688)},
    "ultra": {"fc1": (5120, 2048), "fc2": (2048, 5120)},
}
"""Routed-expert ``[out, in]`` of Nemotron 3 Nano / Super / Ultra (NVIDIA's Megatron-LM post-training example configs)."""

NEMOTRON_EXPERTS = {"nano": 128, "super": 512, "ultra": 512}
"""Routed experts per MoE layer; local N under expert parallelism is experts // EP."""

ULTRA_PRODUCTION = (32, (5120, 8192))
"""The upstream per-expert work's Ultra production case: N=32 experts of ``[5120, 8192]`` bf16."""

N_VALUES = (4, 8, 16, 32, 64, 128)

ODD_SHAPES = ((7, 13), (33, 47), (65, 129), (100, 250))
"""Shapes that are multiples of no block size (NVFP4's 16, Triton's power-of-two tiles)."""


def empty_experts(n: int, empty: int) -> frozenset[int]:
    """Indices of the ``empty`` experts with 0 rows, spread evenly over ``range(n)``."""
    return frozenset((2 * k + 1) * n // (2 * empty) for k in range(empty)) if empty else frozenset()


def expert_shapes(layout: str, n: int, shape: tuple[int, int], empty: int) -> list[tuple[int, int]]:
    """``(out_i, in_i)`` of the ``n`` experts of a case with ``layout``, largest ``shape`` and ``empty``
    empty experts (``Case.expert_shapes``).

    ``ragged``: rows cycle through 1/4..4/4 of ``out`` (rounded up) and columns lose 0, 5 or 10
    (never below 1), so the last NVFP4 block of a row is often short.  Empty experts have 0 rows.
    """
    out, inn = shape
    empties = empty_experts(n, empty)
    shapes = []
    for i in range(n):
        if layout == "ragged":
            o, k = max(1, -(-out * (i % 4 + 1) // 4)), max(1, inn - 5 * (i % 3))
        else:
            o, k = out, inn
        shapes.append((0 if i in empties else o, k))
    return shapes


WIDE_ACCEPTANCE = (128, (1024, 2048))
"""An acceptance case of the kernel benchmark: N=128 experts of ``[1024, 2048]`` bf16 (many small
experts of a row length that tiles exactly)."""
