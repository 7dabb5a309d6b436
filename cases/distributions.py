"""Value distributions that find bugs, each a small function of ``(case, generator, shapes)``.

Every distribution returns fp32 values that the case dtype holds exactly (the caller casts), and
some also return the amax they were built for (``design`` amax policy):

* ``normal``   -- ``randn * 0.02`` (a weight-like baseline).
* ``outliers`` -- heavy tails (``t * max(|t| - 1, 1)``, ``t ~ N(0, 1)``) plus one element in 1000
  made 10..1000x larger.
* ``spread``   -- per-expert scales spread over 8 orders of magnitude (flips in small-amax experts
  stay visible instead of hiding under the largest expert's tolerance).
* ``ties``     -- constructed exact ties and near-ties of the element rounding: ``x = m * 2**-k``
  with ``m`` a grid midpoint (``k + 0.5``, an E4M3 or E2M1 midpoint), its neighbours one input-dtype
  ulp either side, and grid points; the designed amax makes the encode scale exactly ``2**k`` on a
  third of the experts/rows and one fp32 ulp either side of it on the others, so ``x*s`` lands on
  the tie or one fp32 ulp from it.  NVFP4: per-block scales ``2**j`` (block max ``6 * 2**(j-k)``),
  and every fourth block a block-scale tie (block max ``6 * m8 * 2**-k``, ``m8`` an E4M3 midpoint).
* ``outties``  -- ties of the final fp32 -> bf16 cast (INT, FP8): scale ``2**k / (1 + 2**-8)`` and
  inputs ``2**(p-k)``, so ``y = q / s`` lands on a bf16 midpoint.
* ``neartie``  -- near ties at an arbitrary (not power-of-two) scale (INT, FP8): per expert (per row
  for per-channel) a random input ``x0`` and grid midpoint ``m``, amax ``= c / (m / x0)`` in fp32, so
  ``x0 * s`` lands within a few fp32 ulps of ``m``; a quarter of the elements are ``±x0``.  Op orders
  whose scale differs in the last bit (``reciprocal``, ``step``) flip some of these (docs/measured.md §2, §5).
* ``edges``    -- values at amax, one input ulp either side of it, at 2x amax (clipping), designed amax.
* ``special``  -- ±0, subnormals of the input dtype, the dtype's max; NaN and ±inf for INT/FP8
  (defined there); designed amax cycles over experts/rows: the max of the ordinary values (the
  specials clip or vanish), the dtype's max (tiny scale), ``max(16 * smallest normal, 2**-112)``
  (a scale large enough that subnormal inputs land on non-zero codes where the format allows).
* ``nan``      -- NVFP4 only: NaN inputs, which the spec rejects (``ValueError``).
* ``zeros``    -- all ±0 (calibrated amax = 0).
* ``arange``   -- deterministic index-dependent values (expert, row, column) for indexing bugs.
* ``tile_edges``, ``tile_specials`` -- one designed pattern per scale tile of the formats with
  scales per tile (``cases.tile_data``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from moe_fq_parity.reference.formats import FORMATS, FormatSpec, format_spec
from moe_fq_parity.reference.rounding import exact_pow2

from .case import Case
from .tile_data import tile_edges, tile_specials, tiled, tiled_with_nan
from .grids import block_scale_midpoints, grid_points, midpoints, scale_numerator

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}

Shapes = list[tuple[int, int]]


@dataclass(frozen=True)
class Generated:
    """fp32 expert values (exact in the case dtype) and, for ``design`` distributions, per-expert amax
    (``()`` per expert or ``[out]`` per channel)."""

    values: list[torch.Tensor]
    design_amax: Optional[list[torch.Tensor]] = None


@dataclass(frozen=True)
class Distribution:
    """A registered distribution: its generator, the formats it applies to (``applies``, a
    predicate on the format's registry spec; ``None``: every format), whether it designs amax and
    whether it is built for its designed amax only (``design_only``: the tie distributions)."""

    fn: Callable[[Case, torch.Generator, Shapes], Generated]
    applies: Optional[Callable[[FormatSpec], bool]] = None
    designs_amax: bool = False
    design_only: bool = False

    def applies_to(self, fmt: str) -> bool:
        """Whether this distribution can build data for the registered format ``fmt``."""
        return self.applies is None or self.applies(format_spec(fmt))

    def formats(self) -> list[str]:
        """The registered formats it applies to, sorted."""
        return sorted(f for f in FORMATS if self.applies_to(f))


def _dtype(case: Case) -> torch.dtype:
    return TORCH_DTYPES[case.dtype]


def _exact(x: torch.Tensor, case: Case) -> torch.Tensor:
    """Round fp32 values to the case dtype and back (what the inputs will hold)."""
    return x.to(_dtype(case)).to(torch.float32)


def _pow2(k: torch.Tensor) -> torch.Tensor:
    return exact_pow2(k.to(torch.int32))


def _nonnegative(case: Case) -> bool:
    """The case's options make negative input an error (INT ``unsigned``): build magnitudes."""
    return format_spec(case.fmt).rejects_negative(case.option_dict)


def _signs(gen: torch.Generator, shape: tuple[int, ...], case: Case) -> torch.Tensor:
    if _nonnegative(case):
        return torch.ones(shape)
    return torch.randint(0, 2, shape, generator=gen).to(torch.float32) * 2 - 1


def _neighbours(units: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``units`` and their neighbours one ulp of ``dtype`` below and above (fp32)."""
    u = units.to(dtype)
    lo = torch.nextafter(u, torch.full_like(u, -math.inf))
    hi = torch.nextafter(u, torch.full_like(u, math.inf))
    return torch.cat([u, lo, hi]).to(torch.float32)


def _exponent_range(pool: torch.Tensor, top: float, case: Case, want: tuple[int, int]) -> tuple[int, int]:
    """Exponents ``k`` keeping ``pool * 2**-k`` normal and ``top * 2**-k`` finite in the case dtype."""
    fi = torch.finfo(_dtype(case))
    smallest = float(pool[pool > 0].min())
    k_hi = math.floor(math.log2(smallest / fi.tiny))
    k_lo = math.ceil(math.log2(2 * top / fi.max))
    lo, hi = max(want[0], k_lo), min(want[1], k_hi)
    if lo > hi:
        raise ValueError(f"no exponent keeps {case.fmt} ties exact in {case.dtype}")
    return lo, hi


def _nudge(amax: torch.Tensor, steps: torch.Tensor) -> torch.Tensor:
    """Move each fp32 amax ``steps`` (-1, 0, +1) fp32 ulps."""
    up = torch.nextafter(amax, torch.full_like(amax, math.inf))
    down = torch.nextafter(amax, torch.full_like(amax, -math.inf))
    return torch.where(steps > 0, up, torch.where(steps < 0, down, amax))


def _row_exponents(case: Case, gen: torch.Generator, rows: int, lo: int, hi: int) -> torch.Tensor:
    """One exponent per expert (broadcast to rows) or one per row (per channel)."""
    count = rows if case.granularity == "per_channel" else 1
    return torch.randint(lo, hi + 1, (count,), generator=gen).expand(rows).clone()


def _row_steps(case: Case, i: int, rows: int) -> torch.Tensor:
    """Scale nudge per row: cycles -1, 0, +1 over experts (per expert) or rows (per channel)."""
    r = torch.arange(rows) if case.granularity == "per_channel" else torch.zeros(rows, dtype=torch.int64)
    return ((r + i) % 3) - 1


def _design(case: Case, per_row: torch.Tensor) -> torch.Tensor:
    return per_row if case.granularity == "per_channel" else (per_row[0] if per_row.numel() else torch.zeros(()))


def _scale_options(case: Case) -> dict:
    opts = case.option_dict
    return {"unsigned": bool(opts.get("unsigned")), "narrow_range": bool(opts.get("narrow_range"))}


def _ties_elementwise(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    opts = _scale_options(case)
    pool = torch.cat([_neighbours(midpoints(case.fmt, **opts), _dtype(case)), grid_points(case.fmt, **opts)]).abs()
    c = scale_numerator(case.fmt, unsigned=opts["unsigned"])
    lo, hi = _exponent_range(pool, float(pool.max()), case, (-2, 12))
    values, amax = [], []
    for i, (o, k) in enumerate(shapes):
        kexp = _row_exponents(case, gen, max(o, 1), lo, hi)
        idx = torch.randint(0, pool.numel(), (o, k), generator=gen)
        x = pool[idx] * _signs(gen, (o, k), case) * _pow2(-kexp[:o]).unsqueeze(-1)
        values.append(_exact(x, case))
        base = torch.full((max(o, 1),), c) * _pow2(-kexp)
        amax.append(_design(case, _nudge(base, _row_steps(case, i, max(o, 1)))))
    return Generated(values, amax)


def _ties_block(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    spec = format_spec(case.fmt)
    bs = int(case.option_dict.get("block_size", spec.block.size))
    emax, smax = spec.grid.max_value, spec.block.scale_grid.max_value
    pool = torch.cat([_neighbours(midpoints(case.fmt), _dtype(case)), grid_points(case.fmt)]).abs()
    m8 = block_scale_midpoints(case.fmt)
    m8 = m8[(m8 >= 2.0**spec.block.scale_grid.min_normal_exp) & (m8 <= 400)]
    j_lo, j_hi = -6, 6
    lo, hi = _exponent_range(pool * 2.0**j_lo, emax * 2.0**j_hi * smax, case, (0, 10))
    c = scale_numerator(case.fmt)
    values, amax = [], []
    for i, (o, k) in enumerate(shapes):
        kexp = int(torch.randint(lo, hi + 1, (1,), generator=gen))
        nb = -(-k // bs)
        col_block = torch.arange(k) // bs
        j = torch.randint(j_lo, j_hi + 1, (o, nb), generator=gen)
        unit = pool[torch.randint(0, pool.numel(), (o, k), generator=gen)]
        scale = _pow2(j - kexp)[:, col_block] if o else torch.zeros(0, k)
        x = unit * scale
        first = (torch.arange(k) % bs == 0).expand(o, k)
        x = torch.where(first, emax * scale, x)
        tie_blocks = (torch.arange(nb) % 4 == 3)[col_block].expand(o, k)
        bmax = emax * m8[torch.randint(0, m8.numel(), (o, nb), generator=gen)] * 2.0**-kexp
        bmax = _exact(bmax, case)[:, col_block] if o else torch.zeros(0, k)
        frac = torch.rand((o, k), generator=gen) * 2 - 1
        x = torch.where(tie_blocks, torch.where(first, bmax, frac * bmax), x)
        values.append(_exact(x * _signs(gen, (o, k), case), case))
        step = torch.tensor([(i % 3) - 1])
        amax.append(_nudge(torch.tensor([c * 2.0**-kexp]), step)[0])
    return Generated(values, amax)


def _ties(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    return (_ties_elementwise if format_spec(case.fmt).block is None else _ties_block)(case, gen, shapes)


def _outties(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    opts = _scale_options(case)
    c = scale_numerator(case.fmt, unsigned=opts["unsigned"])
    p_hi = math.floor(math.log2(c))
    p_lo = format_spec(case.fmt).grid.min_normal_exp
    pool = _pow2(torch.arange(p_lo, p_hi + 1))
    lo, hi = _exponent_range(pool, c * 2, case, (-2, 12))
    values, amax = [], []
    for i, (o, k) in enumerate(shapes):
        kexp = _row_exponents(case, gen, max(o, 1), lo, hi)
        x = pool[torch.randint(0, pool.numel(), (o, k), generator=gen)] * _pow2(-kexp[:o]).unsqueeze(-1)
        values.append(_exact(x * _signs(gen, (o, k), case), case))
        base = torch.full((max(o, 1),), c * (1 + 2.0**-8)) * _pow2(-kexp)
        amax.append(_design(case, _nudge(base, _row_steps(case, i, max(o, 1)))))
    return Generated(values, amax)


def _neartie(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    opts = _scale_options(case)
    c = torch.tensor(scale_numerator(case.fmt, unsigned=opts["unsigned"]))
    mids = midpoints(case.fmt, **opts)
    mids = mids[mids.abs() >= (1.0 if format_spec(case.fmt).is_int else 2.0)]
    values, amax = [], []
    for o, k in shapes:
        rows = max(o, 1) if case.granularity == "per_channel" else 1
        x0 = _exact(10.0 ** (-3 + 3 * torch.rand((rows,), generator=gen)), case)
        m = mids[torch.randint(0, mids.numel(), (rows,), generator=gen)].abs()
        a = c / (m / x0)
        x = _exact(torch.randn((o, k), generator=gen) * (a[:o].unsqueeze(-1) if rows > 1 else a) / 3, case)
        pick = torch.rand((o, k), generator=gen) < 0.25
        sign = _signs(gen, (o, k), case)
        x0_full = (x0[:o].unsqueeze(-1) if rows > 1 else x0).expand(o, k)
        values.append(torch.where(pick, sign * x0_full, x))
        amax.append(a if case.granularity == "per_channel" else a[0])
    return Generated(values, amax)


def _normal(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    return Generated([_exact(torch.randn((o, k), generator=gen) * 0.02, case) for o, k in shapes])


def _outliers(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    values = []
    for o, k in shapes:
        t = torch.randn((o, k), generator=gen)
        x = t * torch.clamp_min(t.abs() - 1, 1) * 0.02
        count = max(1, x.numel() // 1000) if x.numel() else 0
        pos = torch.randint(0, max(x.numel(), 1), (count,), generator=gen)
        boost = 10.0 ** (1 + 2 * torch.rand((count,), generator=gen))
        x.view(-1)[pos] *= boost
        values.append(_exact(x, case))
    return Generated(values)


def _spread(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    n = len(shapes)
    scales = 10.0 ** torch.linspace(-6, 2, n)[torch.randperm(n, generator=gen)]
    return Generated([_exact(torch.randn((o, k), generator=gen) * float(s), case) for (o, k), s in zip(shapes, scales)])


def _scatter_per_row(x: torch.Tensor, gen: torch.Generator, specials: torch.Tensor) -> torch.Tensor:
    """Write ``specials`` (``[rows, m]`` or ``[m]``) at random columns of every row of ``x``."""
    o, k = x.shape
    if not x.numel():
        return x
    m = specials.shape[-1]
    cols = torch.randint(0, k, (o, m), generator=gen)
    return x.scatter(1, cols, specials.expand(o, m).clone())


def _edges(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    dtype = _dtype(case)
    values, amax = [], []
    for o, k in shapes:
        rows = max(o, 1) if case.granularity == "per_channel" else 1
        a = _exact(10.0 ** (-3 + 4 * torch.rand((rows,), generator=gen)), case)
        ad = a.to(dtype)
        nxt = torch.nextafter(ad, torch.full_like(ad, math.inf)).float()
        prv = torch.nextafter(ad, torch.full_like(ad, -math.inf)).float()
        ring = torch.stack([a, nxt, prv, 2 * a], dim=-1)
        ring = torch.cat([ring, -ring], dim=-1)
        if _nonnegative(case):
            ring = ring.abs()
        x = torch.randn((o, k), generator=gen) * (a[:o].unsqueeze(-1) if rows > 1 else a) / 3
        x = _exact(x, case)
        x = _scatter_per_row(x, gen, ring[:o] if rows > 1 else ring[0])
        values.append(x)
        amax.append(a if case.granularity == "per_channel" else a[0])
    return Generated(values, amax)


def _special_values(case: Case) -> torch.Tensor:
    dtype = _dtype(case)
    fi = torch.finfo(dtype)
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    sub_bits = torch.tensor([1, 2, 3, 0x55, 0x7F if dtype == torch.bfloat16 else 0x3FF], dtype=int_dtype)
    subs = sub_bits.view(dtype).to(torch.float32)
    vals = [torch.tensor([0.0, -0.0, fi.tiny, fi.max]), subs, -subs]
    if not format_spec(case.fmt).rejects_nan_for(case.variant):
        vals.append(torch.tensor([math.nan, math.inf, -math.inf]))
    return torch.cat(vals)


def _finite_amax(case: Case, x: torch.Tensor) -> torch.Tensor:
    finite = torch.where(torch.isfinite(x), x.abs(), torch.zeros(()))
    if case.granularity == "per_channel":
        return finite.amax(dim=-1) if x.shape[-1] else torch.zeros(x.shape[0])
    return finite.max() if x.numel() else torch.zeros(())


def _special(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    specials = _special_values(case)
    if _nonnegative(case):
        specials = specials[~(specials < 0) & ~torch.signbit(specials)]
    fi = torch.finfo(_dtype(case))
    values, amax = [], []
    for i, (o, k) in enumerate(shapes):
        x = _exact(torch.randn((o, k), generator=gen) * 0.02, case)
        plain = _finite_amax(case, x)
        regimes = torch.stack(torch.broadcast_tensors(plain, torch.tensor(fi.max), torch.tensor(max(fi.tiny * 16, 2.0**-112))))
        which = (torch.arange(plain.numel()) + i) % 3 if plain.dim() else torch.tensor(i % 3)
        amax.append(regimes.gather(0, which.reshape(1, *plain.shape))[0] if plain.dim() else regimes[which])
        values.append(_scatter_per_row(x, gen, specials))
    return Generated(values, amax)


def _nan(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    values = []
    for o, k in shapes:
        x = _exact(torch.randn((o, k), generator=gen) * 0.02, case)
        values.append(_scatter_per_row(x, gen, torch.tensor([math.nan])))
    return Generated(values)


def _zeros(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    return Generated([torch.where(torch.rand((o, k), generator=gen) < 0.5, 0.0, -0.0) for o, k in shapes])


def _arange(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    values = []
    for e, (o, k) in enumerate(shapes):
        r = torch.arange(o).unsqueeze(-1)
        c = torch.arange(k)
        q = ((r * 7 + c * 3 + e * 11) % 255 - 127).to(torch.float32)
        values.append(_exact(q * 2.0 ** -(7 - e % 4), case))
    return Generated(values)


def _single_scale(spec: FormatSpec) -> bool:
    return spec.block is None and spec.tiles is None


DISTRIBUTIONS: dict[str, Distribution] = {
    "normal": Distribution(_normal),
    "outliers": Distribution(_outliers),
    "spread": Distribution(_spread),
    "ties": Distribution(_ties, designs_amax=True, design_only=True),
    "outties": Distribution(_outties, applies=_single_scale, designs_amax=True, design_only=True),
    "neartie": Distribution(_neartie, applies=_single_scale, designs_amax=True, design_only=True),
    "edges": Distribution(_edges, designs_amax=True),
    "special": Distribution(_special, designs_amax=True),
    "nan": Distribution(_nan, applies=lambda spec: spec.rejects_nan),
    "zeros": Distribution(_zeros),
    "arange": Distribution(_arange),
    "tile_edges": Distribution(lambda c, g, s: Generated(tile_edges(c, g, s, _dtype(c))), applies=tiled),
    "tile_specials": Distribution(lambda c, g, s: Generated(tile_specials(c, g, s, _dtype(c))), applies=tiled_with_nan),
}
"""``outties``/``neartie`` need one encode scale per expert/row (no block scales: INT, FP8);
``nan`` is for formats where some variant rejects NaN input (NVFP4 ``modelopt_static``, INT4 group-wise):
there the check is that it is rejected; a variant that takes NaN is compared as on any input."""


def generate(case: Case, gen: torch.Generator, shapes: Shapes) -> Generated:
    """Run ``case.dist``; cases whose options reject negative input (INT ``unsigned``) get magnitudes."""
    out = DISTRIBUTIONS[case.dist].fn(case, gen, shapes)
    if _nonnegative(case):
        out = Generated([torch.where(v < 0, -v, v) for v in out.values], out.design_amax)
    return out
