"""Inputs that tell fake-quant op orders apart: every bf16 bit pattern, and constructed near ties.

Random data almost never separates two legitimate fp32 op orders (docs/measured.md §6): a bf16 ``x``
(8 significant bits) times a random fp32 scale lands within a few fp32 ulps of a rounding
boundary about once in millions.  Two constructions make it happen on purpose, for a format
with scale numerator ``num`` and grid ``G`` (``cases.grids``: INT qmax and integers, FP8 448 and E4M3):

* **input tie**: pick a grid midpoint ``b`` and a bf16 ``x``; set ``s* = b / x`` and
  ``amax = RN(num / s*)`` (+-0..2 fp32 ulps).  Then ``x * s`` sits on or next to the tie ``b``
  for every variant's scale ``s``, and a one-ulp difference between the variants' scales picks
  different sides.
* **output tie**: pick a grid value ``g`` and a bf16 midpoint ``t`` (halfway between two
  adjacent bf16 values); set ``s* = g / t``.  Every ``x`` in ``g``'s bin dequantizes to about
  ``t``, so ``RN(g / s)`` and ``RN(g * RN(1 / s))`` can round to different bf16 values.

Each constructed amax comes with its input row: the ``x`` (input tie) or the bf16 preimage of
``g`` (output tie), its bf16 neighbours, and their negations.  Seeds follow the project's one rule,
``cases.inputs.seed_for_id(name, seed)``, into an explicit ``torch.Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_fq_parity.cases.inputs import seed_for_id
from moe_fq_parity.harness.core.equality import bits_hex_all
from moe_fq_parity.cases.grids import grid_points, midpoints, scale_numerator
from moe_fq_parity.reference.constants import TINY_AMAX
from moe_fq_parity.reference.formats import format_spec

BF16_PATTERNS = 1 << 16
ULP_OFFSETS = (-2, -1, 0, 1, 2)
"""fp32 ulp offsets applied to each constructed amax."""


def generator(seed: int, name: str) -> torch.Generator:
    """A CPU generator seeded with ``cases.inputs.seed_for_id(name, seed)`` (the project's one seed rule)."""
    return torch.Generator().manual_seed(seed_for_id(name, seed))


def all_bf16(*, finite_only: bool = False) -> torch.Tensor:
    """Every bf16 bit pattern, in bit order ``-32768..32767`` as int16 (``[65536]``)."""
    bits = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)
    x = bits.view(torch.bfloat16)
    return x[torch.isfinite(x)] if finite_only else x


hex_bits = bits_hex_all
"""Bit patterns of a bf16/fp16/fp32 tensor as hex strings (``0x3F80``): ``harness.core.equality.bits_hex_all``."""


def _ulp_shift(a: torch.Tensor, k: int) -> torch.Tensor:
    """``a`` moved ``k`` fp32 (or bf16, by dtype) ulps up (k > 0) or down."""
    to = torch.full_like(a, float("inf") if k > 0 else -float("inf"))
    for _ in range(abs(k)):
        a = torch.nextafter(a, to)
    return a


def _bf16_row(x: torch.Tensor) -> torch.Tensor:
    """``[M]`` bf16 -> ``[M, 6]``: ``x``, its two bf16 neighbours, and the negations."""
    row = torch.stack([x, _ulp_shift(x, -1), _ulp_shift(x, 1)], dim=1)
    return torch.cat([row, -row], dim=1)


@dataclass(frozen=True)
class NearTies:
    """Constructed amax values ``[M]`` (fp32) with their input rows ``[M, 6]`` (bf16) and labels."""

    amax: torch.Tensor
    x: torch.Tensor
    kind: tuple[str, ...]

    def __len__(self) -> int:
        return int(self.amax.numel())


def near_ties(fmt: str, count: int, *, seed: int) -> NearTies:
    """``count`` constructions (half input ties, half output ties), each at every ``ULP_OFFSETS``.

    Only constructions whose amax is finite, > 2**-24 and whose row is finite are kept, so the
    result may hold slightly fewer than ``count * len(ULP_OFFSETS)`` rows.
    """
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    gen = generator(seed, f"near_ties/{fmt}")
    if format_spec(fmt).block is not None:
        raise ValueError(f"near-tie construction covers single-scale formats (INT, FP8), not {fmt!r}")
    num = scale_numerator(fmt)
    grid = grid_points(fmt)
    grid = grid[grid > 0]
    mids = midpoints(fmt)
    mids = mids[mids > 0]
    n_in = (count + 1) // 2
    n_out = count - n_in
    # input ties: x in a few binades around 1, tie b anywhere in the grid's range
    x_in = _random_bf16(n_in, gen, lo_exp=-8, hi_exp=8)
    b = mids[torch.randint(0, mids.numel(), (n_in,), generator=gen)]
    s_in = b.double() / x_in.double()
    # output ties: g a non-zero grid value, t a bf16 midpoint
    g = grid[torch.randint(0, grid.numel(), (n_out,), generator=gen)]
    lo = _random_bf16(n_out, gen, lo_exp=-8, hi_exp=8)
    t = (lo.double() + _ulp_shift(lo, 1).double()) / 2
    s_out = g.double() / t
    amax_list, x_list, kinds = [], [], []
    for s, kind, x_of in ((s_in, "input_tie", lambda a: x_in), (s_out, "output_tie", lambda a: (g.double() * a.double() / num).to(torch.bfloat16))):
        base = (num / s).to(torch.float32)
        for k in ULP_OFFSETS:
            a = _ulp_shift(base, k)
            amax_list.append(a)
            x_list.append(x_of(a))
            kinds += [f"{kind}{k:+d}"] * a.numel()
    amax = torch.cat(amax_list)
    x = _bf16_row(torch.cat(x_list))
    keep = torch.isfinite(amax) & (amax > TINY_AMAX) & torch.isfinite(x.to(torch.float32)).all(dim=1)
    idx = torch.nonzero(keep).reshape(-1)
    return NearTies(amax[idx], x[idx], tuple(kinds[i] for i in idx.tolist()))


def _random_bf16(n: int, gen: torch.Generator, *, lo_exp: int, hi_exp: int) -> torch.Tensor:
    """``n`` positive bf16 values: uniform mantissa, exponent uniform in ``[lo_exp, hi_exp)``."""
    mant = torch.randint(0, 128, (n,), generator=gen, dtype=torch.int32)
    exp = torch.randint(lo_exp, hi_exp, (n,), generator=gen, dtype=torch.int32) + 127
    return ((exp << 7) | mant).to(torch.int16).view(torch.bfloat16)


def edge_amax() -> dict[str, float]:
    """Named amax values for the all-patterns run: unit, the 2**-24 boundary, zero, bf16 max."""
    tiny = torch.tensor(TINY_AMAX, dtype=torch.float32)
    return {
        "unit": 1.0,
        "zero": 0.0,
        "tiny": float(tiny),
        "tiny+1ulp": float(_ulp_shift(tiny, 1)),
        "bf16_max": float(torch.finfo(torch.bfloat16).max),
    }
