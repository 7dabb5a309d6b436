"""Test data for the MoE checks: expert weights and routed tokens whose per-expert amax differ.

Everything is drawn on the CPU from one explicit ``torch.Generator`` seeded with
``case_seed(seed, case_id) = (seed + crc32(case_id)) mod 2**63``, then moved to the device, so the data are
the same on every device and independent of test order.

* Weights: expert ``i`` is ``randn(out, in) * 2**e_i`` with ``e_i`` evenly spaced in ``[-3, 1]``
  (a 16x spread, experts in shuffled order), so every expert's amax differs; biases ``randn * 0.1``.
* Routing: ``calib_splits`` (two calibration batches) leave the experts in ``empty`` without
  tokens; ``all_splits`` routes at least one token to every expert (the calibration-empty ones
  included), to show what their defined amax (0) does.
* Tokens: ``randn(T, in)`` with the rows routed to expert ``i`` scaled by ``2**f_i``,
  ``f_i`` evenly spaced in ``[-1, 2]`` (shuffled), so per-expert input amax differ too.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import torch


def case_seed(seed: int, case_id: str) -> int:
    """``(seed + crc32(case_id)) mod 2**63`` (the ``cases.inputs.case_seed`` rule, for a string id)."""
    return (int(seed) + zlib.crc32(case_id.encode())) % (2**63)


@dataclass(frozen=True)
class ExpertShape:
    """One expert layer's geometry: ``N`` experts ``[out, in]``, ``tokens`` per batch, dtype, bias."""

    num_experts: int
    out_features: int
    in_features: int
    tokens: int
    dtype: torch.dtype = torch.bfloat16
    bias: bool = True

    def __post_init__(self) -> None:
        if self.num_experts < 3:
            raise ValueError(f"num_experts must be >= 3 (two routed experts and an empty one), got {self.num_experts}")
        if self.tokens < 2 * self.num_experts:
            raise ValueError(f"tokens must be >= 2*num_experts, got {self.tokens} for N={self.num_experts}")

    @property
    def id(self) -> str:
        return f"N{self.num_experts}/{self.out_features}x{self.in_features}"

    @property
    def empty(self) -> tuple[int, ...]:
        """Experts that receive no tokens during calibration: expert 1 and, for N >= 6, expert N-2."""
        return (1,) if self.num_experts < 6 else (1, self.num_experts - 2)


@dataclass(frozen=True)
class ExpertData:
    """Weights, biases and routed batches of one case (all on one device)."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor] | None
    calib: list[tuple[torch.Tensor, list[int]]]
    routings: dict[str, tuple[torch.Tensor, list[int]]]
    grad_out: dict[str, torch.Tensor]


def _spread(n: int, lo: float, hi: float, g: torch.Generator) -> torch.Tensor:
    e = torch.linspace(lo, hi, n, dtype=torch.float64)
    return torch.pow(2.0, e[torch.randperm(n, generator=g)]).to(torch.float32)


def _splits(n: int, tokens: int, empty: tuple[int, ...], g: torch.Generator) -> list[int]:
    routed = [i for i in range(n) if i not in empty]
    counts = [0] * n
    for i in routed:
        counts[i] = 1
    extra = torch.randint(0, len(routed), (tokens - len(routed),), generator=g)
    for j in extra.tolist():
        counts[routed[j]] += 1
    return counts


def _tokens(splits: list[int], in_features: int, scales: torch.Tensor, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    x = torch.randn(sum(splits), in_features, generator=g)
    row_scale = torch.repeat_interleave(scales, torch.tensor(splits))
    return (x * row_scale[:, None]).to(dtype)


def make_expert_data(shape: ExpertShape, seed: int, device: torch.device | str = "cpu") -> ExpertData:
    """Deterministic data for ``shape`` from ``seed`` (see module docstring)."""
    g = torch.Generator().manual_seed(seed)
    n, o, i = shape.num_experts, shape.out_features, shape.in_features
    w_scale = _spread(n, -3.0, 1.0, g)
    weights = [(torch.randn(o, i, generator=g) * w_scale[k]).to(shape.dtype) for k in range(n)]
    biases = [(torch.randn(o, generator=g) * 0.1).to(shape.dtype) for _ in range(n)] if shape.bias else None
    x_scale = _spread(n, -1.0, 2.0, g)
    calib = []
    for _ in range(2):
        s = _splits(n, shape.tokens, shape.empty, g)
        calib.append((_tokens(s, i, x_scale, shape.dtype, g), s))
    all_s = _splits(n, shape.tokens, (), g)
    routings = {"calib": calib[0], "all_routed": (_tokens(all_s, i, x_scale, shape.dtype, g), all_s)}
    grad_out = {k: torch.randn(sum(s), o, generator=g).to(shape.dtype) for k, (_, s) in routings.items()}
    dev = torch.device(device)
    mv = lambda t: t.to(dev)  # noqa: E731
    return ExpertData(
        weights=[mv(w) for w in weights],
        biases=[mv(b) for b in biases] if biases is not None else None,
        calib=[(mv(x), s) for x, s in calib],
        routings={k: (mv(x), s) for k, (x, s) in routings.items()},
        grad_out={k: mv(v) for k, v in grad_out.items()},
    )
