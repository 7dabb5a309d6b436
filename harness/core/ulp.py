"""ULP distance and per-element mismatch classification (all ULP logic lives here).

Ordered-integer ULP distance (docs/measured.md §4): view the float's bits as a signed integer ``i`` and
map it to ``o = i if i >= 0 else MIN - i`` (``MIN = -2**15`` for bf16/fp16, ``-2**31`` for fp32).
Then ``|o_a - o_b|`` is monotone, puts adjacent finite values 1 apart and makes ``+0 == -0``.
NaN and ±inf are accounted separately, never through the integer distance.

Classes of an element (reference ``expected``, backend ``got``):

* ``exact``     -- same value (distance 0; ``+0``/``-0`` and NaN/NaN included; sign-of-zero
  differences are also counted in ``signed_zero``);
* ``ulp1``      -- 1 ULP apart;
* ``tie_flip``  -- more than 1 ULP apart *and* the reference's pre-rounding value lies within
  ``TIE_WINDOW_FP32_ULPS`` fp32 ulps of a rounding boundary of the format's grid: the signature
  of a different-but-legitimate fp32 op order (docs/measured.md §2), reported apart from real errors.
  Given the inputs (``compare(..., inputs=x)``), a tie flip is also *one step of the format's grid*:
  ``got`` is within 1 output ULP of the reference's value for the other rounding of that tie
  (``other_side``); a value farther off at a tie is an ``error``.  A tie flip is measured in grid
  steps, not in ULP: its ULP distance is not in ``max_ulp`` nor in the histogram (next to zero, one
  step of an INT8 grid is ~1e9 fp32 ULP, which says nothing about the mismatch);
* ``nan_bits``  -- both NaN with different bits; only under ``nan_bits="strict"`` (by default NaN
  payload and sign are not part of the value and such a pair is ``exact``);
* ``error``     -- everything else, including any NaN/inf disagreement.

What counts as equal (NaN, signed zero, where bitwise identity is demanded) is the policy of
``harness.core.equality``; this module applies it and adds the ULP classes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Optional

import torch

from .bits import check_nan_bits, nan_bits_differ
from .tolerances import MAX_ULP, TIE_WINDOW_FP32_ULPS

from moe_fq_parity.reports.schema import HIST_EDGES

CLASSES = ("exact", "ulp1", "tie_flip", "nan_bits", "error")

_INT_VIEW = {torch.bfloat16: (torch.int16, -(2**15)), torch.float16: (torch.int16, -(2**15)), torch.float32: (torch.int32, -(2**31))}


def ordered_int(x: torch.Tensor) -> torch.Tensor:
    """Monotone int64 image of a bf16/fp16/fp32 tensor (``+0`` and ``-0`` both map to 0)."""
    if x.dtype not in _INT_VIEW:
        raise TypeError(f"ULP distance is defined for bf16/fp16/fp32, got {x.dtype}")
    int_dtype, lowest = _INT_VIEW[x.dtype]
    i = x.contiguous().view(int_dtype).to(torch.int64)
    return torch.where(i < 0, lowest - i, i)


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise ``|ordered(a) - ordered(b)|`` (int64).  Meaningless where either is NaN/inf."""
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{tuple(a.shape)} with {b.dtype}{tuple(b.shape)}")
    return (ordered_int(a) - ordered_int(b)).abs()


def other_side(pre_round: torch.Tensor, inputs: torch.Tensor, grid_round: Callable[[torch.Tensor], torch.Tensor], dtype: torch.dtype,
               window: int = TIE_WINDOW_FP32_ULPS) -> torch.Tensor:
    """The output (``dtype``) of the *other* rounding of each near-tie pre-rounding value.

    For a value ``p = x * s`` within ``window`` fp32 ulps of a tie, the grid rounds ``p`` to ``g``
    and the values just across the tie to ``g'``; the element's scale is ``s = p / x`` (``x != 0``
    wherever ``p`` is near a tie) and the other side's output is ``RN_dtype(g' / s)``, computed in
    float64.  Exact to the output rounding for INT and FP8 (one scale per element); for NVFP4
    ``s`` is the product of the block and global scales (the same to an fp32 rounding), so the
    result may sit 1 output ULP off, which ``compare`` allows.
    """
    lo, hi = pre_round.clone(), pre_round.clone()
    for _ in range(window):
        lo = torch.nextafter(lo, torch.full_like(lo, -float("inf")))
        hi = torch.nextafter(hi, torch.full_like(hi, float("inf")))
    g, g_lo, g_hi = grid_round(pre_round), grid_round(lo), grid_round(hi)
    g_other = torch.where(g_lo == g, g_hi, g_lo).double()
    scale = pre_round.double() / inputs.double()
    return (g_other / scale).to(dtype)


def near_tie(pre_round: torch.Tensor, grid_round: Callable[[torch.Tensor], torch.Tensor], window: int = TIE_WINDOW_FP32_ULPS) -> torch.Tensor:
    """True where moving the fp32 value ``window`` ulps down or up changes its grid rounding."""
    lo = pre_round.clone()
    hi = pre_round.clone()
    for _ in range(window):
        lo = torch.nextafter(lo, torch.full_like(lo, -float("inf")))
        hi = torch.nextafter(hi, torch.full_like(hi, float("inf")))
    a, b = grid_round(lo), grid_round(hi)
    return ~((a == b) | (torch.isnan(a) & torch.isnan(b)))


@dataclass
class Comparison:
    """Counts and offenders of one expected/got pair (flat indices into the tensor)."""

    numel: int
    counts: dict[str, int]
    signed_zero: int
    nan_mismatch: int
    inf_mismatch: int
    max_ulp: int
    histogram: list[int]
    mismatch_index: torch.Tensor = field(repr=False)
    mismatch_class: torch.Tensor = field(repr=False)
    mismatch_ulp: torch.Tensor = field(repr=False)

    @classmethod
    def identical(cls, numel: int, finite: int) -> "Comparison":
        """What ``compare`` (and ``equality.bitwise``) returns for two tensors with the same bits:
        every element exact, ``finite`` of them in histogram bucket 0."""
        counts = dict.fromkeys(CLASSES, 0)
        counts["exact"] = numel
        return cls(numel=numel, counts=counts, signed_zero=0, nan_mismatch=0, inf_mismatch=0, max_ulp=0,
                   histogram=[finite] + [0] * (len(HIST_EDGES) - 1), mismatch_index=torch.zeros(0, dtype=torch.int64),
                   mismatch_class=torch.zeros(0, dtype=torch.int8), mismatch_ulp=torch.zeros(0, dtype=torch.int64))

    def passes(self, mode: str) -> bool:
        """Verdict under ``strict`` (bit-exact: all exact and no sign-of-zero difference) or
        ``1-ulp`` (exact or 1 ULP; tie flips and errors fail)."""
        limit = MAX_ULP[mode]
        if self.counts["error"] or self.counts["tie_flip"] or self.counts["nan_bits"]:
            return False
        if limit == 0:
            return self.counts["ulp1"] == 0 and self.signed_zero == 0
        return True


def compare(
    expected: torch.Tensor,
    got: torch.Tensor,
    pre_round: Optional[torch.Tensor] = None,
    grid_round: Optional[Callable[[torch.Tensor], torch.Tensor]] = None,
    *,
    nan_bits: str = "any",
    inputs: Optional[torch.Tensor] = None,
) -> Comparison:
    """Classify every element of ``got`` against ``expected`` (same shape and dtype).

    ``pre_round``/``grid_round`` (from ``reference.fake_quant_traced``) enable tie-flip detection;
    without them a >1 ULP mismatch is an ``error``.  ``inputs`` (the fake-quant input, same shape):
    a tie flip must also be one grid step (``other_side``, within 1 output ULP), else it is an
    ``error``.  ``max_ulp`` and ``histogram`` cover the finite pairs that are not tie flips.  ``nan_bits`` (``harness.core.equality``):
    ``"any"`` counts every NaN/NaN pair exact, ``"strict"`` counts a pair with different bits as
    ``nan_bits``.
    """
    check_nan_bits(nan_bits)
    e = expected.detach().reshape(-1)
    g = got.detach().reshape(-1).to(e.device)
    if e.dtype != g.dtype or e.numel() != g.numel():
        raise ValueError(f"cannot compare {e.dtype}[{e.numel()}] with {g.dtype}[{g.numel()}]")
    e_nan, g_nan = torch.isnan(e), torch.isnan(g)
    e_inf, g_inf = torch.isinf(e), torch.isinf(g)
    finite = ~(e_nan | g_nan | e_inf | g_inf)
    nan_mismatch = e_nan ^ g_nan
    inf_mismatch = (e_inf | g_inf) & ~(e_nan | g_nan) & (e != g)
    dist = torch.where(finite, ulp_distance(e, g), torch.zeros((), dtype=torch.int64, device=e.device))
    nan_payload = nan_bits_differ(e, g) if nan_bits == "strict" else torch.zeros_like(nan_mismatch)
    mismatch = (finite & (dist > 0)) | nan_mismatch | inf_mismatch | nan_payload
    idx = torch.nonzero(mismatch).reshape(-1)
    cls = torch.full((idx.numel(),), CLASSES.index("error"), dtype=torch.int8, device=e.device)
    cls = torch.where(nan_payload[idx], torch.tensor(CLASSES.index("nan_bits"), dtype=torch.int8, device=e.device), cls)
    d = dist[idx]
    fin = finite[idx]
    cls = torch.where(fin & (d == 1), torch.tensor(CLASSES.index("ulp1"), dtype=torch.int8, device=e.device), cls)
    if pre_round is not None and grid_round is not None and idx.numel():
        big = fin & (d > 1)
        if bool(big.any()):
            v = pre_round.detach().reshape(-1).to(e.device)[idx[big]]
            tie = near_tie(v, grid_round)
            if inputs is not None and bool(tie.any()):
                x = inputs.detach().reshape(-1).to(e.device)[idx[big]]
                step = torch.zeros_like(tie)
                at = torch.nonzero(tie & (x != 0)).reshape(-1)
                if at.numel():
                    other = other_side(v[at], x[at], grid_round, e.dtype)
                    got_at = g[idx[big]][at]
                    step[at] = torch.isfinite(other) & (ulp_distance(other, got_at) <= 1)
                tie = tie & step
            sub = cls[big]
            sub = torch.where(tie, torch.tensor(CLASSES.index("tie_flip"), dtype=torch.int8, device=e.device), sub)
            cls[big] = sub
    counts = {c: int((cls == k).sum()) for k, c in enumerate(CLASSES)}
    counts["exact"] = e.numel() - idx.numel()
    signed_zero = int(((e == 0) & (g == 0) & (torch.signbit(e) != torch.signbit(g))).sum())
    measured = finite.clone()
    measured[idx[cls == CLASSES.index("tie_flip")]] = False  # a tie flip is one grid step, not a ULP distance
    fd = dist[measured]
    hist = []
    for lo, hi in zip(HIST_EDGES, HIST_EDGES[1:] + (None,)):
        m = fd >= lo if hi is None else (fd >= lo) & (fd < hi)
        hist.append(int(m.sum()))
    max_ulp = int(fd.max()) if fd.numel() else 0
    return Comparison(
        numel=e.numel(),
        counts=counts,
        signed_zero=signed_zero,
        nan_mismatch=int(nan_mismatch.sum()),
        inf_mismatch=int(inf_mismatch.sum()),
        max_ulp=max_ulp,
        histogram=hist,
        mismatch_index=idx.cpu(),
        mismatch_class=cls.cpu(),
        mismatch_ulp=d.cpu(),
    )

