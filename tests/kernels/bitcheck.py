"""Shared helpers of the kernel tests: test data and the one bit-for-bit comparison.

``assert_same_bits`` compares every expert, collects every mismatch (count, max ULP, the first
offenders with input/got/want bit patterns) and only then fails, so one run shows the whole damage.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from moe_fq_parity.harness.core.bits import bits_equal
from moe_fq_parity.harness.core.ulp import ulp_distance

INT_VIEW = {torch.bfloat16: torch.int16, torch.float16: torch.int16, torch.float32: torch.int32}
AMAX_MODES = ("max", "below", "above", "odd", "tiny", "edge", "zero")
"""How each expert's amax relates to its data: = max|w|; 0.6 max (clips); 1.7 max; an fp32 value
no bf16 holds; 1e-30 (< 2**-24); exactly 2**-24; 0."""


@dataclass(frozen=True)
class Mismatch:
    expert: int
    index: int
    x: str
    got: str
    want: str


def hexbits(t: torch.Tensor) -> str:
    width = 4 if t.element_size() == 2 else 8
    return f"0x{int(t.reshape(()).view(INT_VIEW[t.dtype]).item()) & ((1 << (4 * width)) - 1):0{width}X}"


def assert_same_bits(
    got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], xs: Sequence[torch.Tensor] | None = None, *, case: str = ""
) -> None:
    """Fail unless every ``got[i]`` has exactly the bits of ``want[i]`` (0 ULP, NaN bits included)."""
    assert len(got) == len(want), f"{case}: {len(got)} outputs for {len(want)} experts"
    bad: list[Mismatch] = []
    total, max_ulp = 0, 0
    for i, (g, w) in enumerate(zip(got, want)):
        assert g.dtype == w.dtype and g.shape == w.shape, f"{case}: expert {i} is {g.dtype}{tuple(g.shape)}, want {w.dtype}{tuple(w.shape)}"
        g, w = g.detach().cpu(), w.detach().cpu()
        ne = ~bits_equal(g, w)
        n = int(ne.sum())
        if not n:
            continue
        total += n
        finite = torch.isfinite(g.float()) & torch.isfinite(w.float())
        if bool((ne & finite).any()):
            max_ulp = max(max_ulp, int(ulp_distance(g, w)[ne & finite].max()))
        for j in torch.nonzero(ne.reshape(-1))[:5].reshape(-1).tolist():
            x = hexbits(xs[i].detach().cpu().reshape(-1)[j]) if xs is not None else "?"
            bad.append(Mismatch(i, j, x, hexbits(g.reshape(-1)[j]), hexbits(w.reshape(-1)[j])))
    assert total == 0, f"{case}: {total} elements differ (max finite ULP {max_ulp}); first: {bad[:8]}"


def expert_weights(
    gen: torch.Generator, shapes: Sequence[tuple[int, ...]], dtype: torch.dtype, *, specials: bool = True, nonneg: bool = False
) -> list[torch.Tensor]:
    """Random experts with per-expert scales 10**U(-3, 3), a few outliers and (``specials``) NaN,
    ±inf, ±0 and dtype subnormals sprinkled in (never zeros-only data)."""
    tiny = torch.finfo(dtype).tiny
    out = []
    for s in shapes:
        n = int(torch.Size(s).numel())
        scale = 10.0 ** (torch.rand((), generator=gen) * 6 - 3)
        w = torch.randn(n, generator=gen) * scale
        if n:
            w[torch.randint(0, n, (max(1, n // 50),), generator=gen)] *= 20.0
        if specials and n >= 16:
            picks = torch.randperm(n, generator=gen)[:8]
            vals = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0, tiny / 4, -tiny / 2, 3 * tiny])
            w[picks] = vals
        if nonneg:
            w = w.abs()
        out.append(w.reshape(s).to(dtype))
    return out


def amax_for(w: torch.Tensor, mode: str, *, per_channel: bool) -> torch.Tensor:
    """fp32 amax of one expert (``()`` or ``[rows]``) in one of ``AMAX_MODES``."""
    wf = w.detach().float().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).abs()
    if per_channel:
        base = wf.amax(dim=-1) if w.shape[-1] else torch.zeros(w.shape[:-1], device=w.device)
    else:
        base = wf.amax() if w.numel() else torch.zeros((), device=w.device)
    base = base.float()
    if mode == "max":
        return base
    if mode == "below":
        return base * 0.6
    if mode == "above":
        return base * 1.7
    if mode == "odd":
        return base * (1.0 + 2.0**-20) + 2.0**-30
    if mode == "tiny":
        return torch.full_like(base, 1e-30)
    if mode == "edge":
        return torch.full_like(base, 2.0**-24)
    if mode == "zero":
        return torch.zeros_like(base)
    raise ValueError(mode)


def amax_stack(ws: Sequence[torch.Tensor], modes: Sequence[str], *, per_channel: bool) -> torch.Tensor:
    return torch.stack([amax_for(w, m, per_channel=per_channel) for w, m in zip(ws, modes)])
