"""The adversarial block classes on which upstream-named variants are judged (and the atlas is drawn).

A *class* is a named set of whole scale tiles of one format, laid out as ``[E, T*r, c]`` experts of
``T`` tiles ``(r, c)`` stacked along the rows (``1 x c`` blocks along in-features, or square ``r x c``
tiles), bf16 by default, so that every upstream code path that quantizes a 2-D tensor tile by tile
takes each expert as it is (no padding: every dim is a whole number of tiles).  Everything derives
from a seed by ``cases.inputs.seed_for_id`` (``"upstream/<fmt>/<r>x<c>/<class>"``).

The classes (``CLASSES``, in this order):

* ``boundary``  -- for every binade ``2**e`` of the dtype's range (normal and subnormal), tiles whose
  amax is exactly a scale boundary and one input ulp either side: ``2**e`` (floor/ceil edges),
  ``max * 2**e`` (the edge of ``ceil(log2(A / max))`` and of ``RN(A * RN(1/max))`` rules: 448, 6, 7),
  ``(2 - 2**-m) * 2**e`` (the mantissa-rounding edge, ``m`` the element's mantissa bits), and the
  fixed edges ``1e-4`` (DeepSeek's and DeepGEMM's amax floor) and ``448 * 2**-127`` (the E8M0 code-0
  edge); the tile's other elements are ``FILL`` random values below the amax (the rest ``+0``);
* ``tie``       -- elements at exact midpoints of the element grid under a power-of-two scale: tile amax
  ``max * 2**k`` and the other elements every grid midpoint times ``2**k`` (random signs);
* ``zero``      -- all ``+0``, all ``-0``, mixed signed zeros;
* ``denormal``  -- every element a dtype subnormal (random, random signs), the smallest subnormal alone;
* ``inf``       -- one ``+inf`` or ``-inf`` among finite values (first or last position), all ``+-inf``;
* ``nan``       -- one NaN among finite values (first or last), NaN beside ``inf``, all NaN, NaN among
  subnormals (only for a format whose variants all take NaN input: ``nan=True``);
* ``dtype_max`` -- tiles holding ``+-max`` of the dtype (a power-of-two scale overflows there);
* ``op_order``  -- random tiles (magnitudes ``2**U(-133, 127)``) on which two variants of the format
  disagree (every registered variant and option set of the format, evaluated here), ``OP_ORDER_TILES``
  of them: where the op order of the scale and element arithmetic shows;
* ``random``    -- ``randn`` tiles at magnitudes ``2**U(-133, 127)``.

Square tiles hold ``FILL`` random values at random positions and ``+0`` elsewhere (what decides a
tile's scale and every rounding is there; a full random 128 x 128 tile would only repeat them), so
a class of square tiles stays small.

Memory: the largest class (``boundary``, 1 x 128 tiles) is about 2,400 tiles, 0.6 MB of bf16; the
128 x 128 classes subsample the binades (every ``SQUARE_BINADE_STEP``-th) and stay below 40 MB.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch

from moe_fq_parity.reference.formats import FormatSpec, IntGrid, format_spec

from .inputs import seed_for_id

CLASSES = ("boundary", "tie", "zero", "denormal", "inf", "nan", "dtype_max", "op_order", "random")
"""The adversarial classes, in report order."""
FILL = 15
"""Random elements below the amax in a ``boundary`` tile and in a square tile (the rest are ``+0``)."""
TILES_PER_EXPERT = 16
"""Tiles per expert: a per-expert amax (NVFP4's global amax) spans a few binades of ``boundary``."""
RANDOM_TILES = 64
"""Tiles of the ``random`` class."""
OP_ORDER_TILES = 64
"""Tiles kept in ``op_order`` (drawn from ``OP_ORDER_CANDIDATES`` random tiles)."""
OP_ORDER_CANDIDATES = 2048
SQUARE_BINADE_STEP = 8
"""Square tiles: ``boundary`` takes every 8th binade (each tile is ``r * c`` elements)."""
SMALLEST_SUBNORMAL_EXP = {torch.bfloat16: -133, torch.float16: -24, torch.float32: -149}
"""Exponent of the smallest subnormal of each input dtype: ``boundary`` starts at that binade."""
FIXED_EDGES = (1e-4, 448.0 * 2.0**-127)
"""Boundaries that are not powers of two times a constant: DeepSeek / DeepGEMM's amax floor and the
E8M0 code-0 edge of ``A * RN(1/448)``."""


@dataclass(frozen=True)
class BlockClass:
    """One adversarial class of one format and tile: ``x`` is ``[E, T*r, c]`` (``dtype``)."""

    name: str
    fmt: str
    tile: tuple[int, int]
    x: torch.Tensor

    @property
    def tiles(self) -> int:
        r, c = self.tile
        return self.x.numel() // (r * c)


def tile_of(fmt: str, options: Optional[dict] = None) -> tuple[int, int]:
    """The registry's tile of ``fmt`` for case ``options`` (``tile_2d``, a size option)."""
    spec = format_spec(fmt)
    if spec.tiles is None:
        raise ValueError(f"{fmt} has no scale tiles (FormatSpec.tiles)")
    return spec.tiles.tile(dict(options or {}))


def _elem(spec: FormatSpec) -> tuple[float, int]:
    """(element maximum, mantissa bits) of the format's grid (an INT grid: ``qmax``, 0)."""
    if isinstance(spec.grid, IntGrid):
        return float(spec.grid.bounds()[1]), 0
    return float(spec.grid.max_value), spec.grid.mantissa_bits


def _gen(fmt: str, tile: tuple[int, int], name: str, seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed_for_id(f"upstream/{fmt}/{tile[0]}x{tile[1]}/{name}", seed))


def _neighbours(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Each ``v`` (rounded to ``dtype``) and its next values down and up, finite and > 0, fp32."""
    d = v.to(dtype)
    up = torch.nextafter(d, torch.full_like(d, math.inf))
    down = torch.nextafter(d, torch.full_like(d, -math.inf))
    out = torch.stack([down, d, up], dim=-1).reshape(-1).to(torch.float32)
    return out[torch.isfinite(out) & (out > 0)]


def _tiles_below(amax: torch.Tensor, tile: tuple[int, int], dtype: torch.dtype, gen: torch.Generator, fill: int) -> torch.Tensor:
    """``[n, r, c]`` fp32 values exact in ``dtype``: tile ``i`` holds ``+-amax[i]`` at a random position and
    ``fill`` random values of magnitude below it (rounded toward zero), ``+0`` elsewhere."""
    r, c = tile
    n, size = amax.numel(), r * c
    fill = min(fill, size - 1)
    a = amax.to(torch.float32).reshape(-1, 1)
    pos = torch.argsort(torch.rand(n, size, generator=gen), dim=1)[:, : fill + 1]
    vals = a * torch.rand(n, fill + 1, generator=gen) * torch.where(torch.rand(n, fill + 1, generator=gen) < 0.5, -1.0, 1.0)
    vals[:, 0] = a.reshape(-1) * torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    vals = _toward_zero(vals, dtype)
    out = torch.zeros(n, size)
    out.scatter_(1, pos, vals)
    return out.reshape(n, r, c)


def _toward_zero(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``v`` rounded toward zero to ``dtype`` (never above its magnitude), back in fp32."""
    if dtype == torch.bfloat16:
        return (v.view(torch.int32) & ~0xFFFF).view(torch.float32)
    if dtype == torch.float32:
        return v
    d = v.to(dtype)
    over = d.to(torch.float32).abs() > v.abs()
    return torch.where(over, torch.nextafter(d, torch.zeros_like(d)), d).to(torch.float32)


def _boundary_amax(spec: FormatSpec, dtype: torch.dtype, square: bool) -> torch.Tensor:
    emax, mbits = _elem(spec)
    fi = torch.finfo(dtype)
    lo = SMALLEST_SUBNORMAL_EXP[dtype]
    step = SQUARE_BINADE_STEP if square else 1
    e = torch.arange(lo, 128, step, dtype=torch.float64)
    edges = torch.cat([2.0**e, emax * 2.0**e, (2 - 2.0**-max(mbits, 1)) * 2.0**e, torch.tensor(FIXED_EDGES, dtype=torch.float64)])
    edges = edges[(edges < fi.max) & (edges >= 2.0**lo)]
    return torch.sort(_neighbours(edges.to(torch.float32), dtype)).values


def _midpoints(spec: FormatSpec) -> torch.Tensor:
    """The positive midpoints of adjacent grid values (fp32, exact)."""
    if isinstance(spec.grid, IntGrid):
        q = torch.arange(0, int(spec.grid.bounds()[1]), dtype=torch.float32)
        return q + 0.5
    emax, mbits = _elem(spec)
    grid_min = 2.0 ** (spec.grid.min_normal_exp - mbits)
    vals = torch.unique(spec.grid.round(torch.arange(0, int(emax / grid_min) + 1, dtype=torch.float32) * grid_min))
    return (vals[1:] + vals[:-1]) * 0.5


def _tie_tiles(spec: FormatSpec, tile: tuple[int, int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    emax, _ = _elem(spec)
    mids = _midpoints(spec)
    r, c = tile
    size = r * c
    tiles = []
    for k in (-120, -60, -20, -3, 0, 5, 40, 100):
        a = emax * 2.0**k
        if not a < torch.finfo(dtype).max:
            continue
        vals = torch.cat([torch.tensor([a]), mids * 2.0**k])
        vals = vals[(vals.to(dtype).to(torch.float32) == vals)]
        for start in range(0, max(vals.numel() - 1, 1), size - 1):
            t = torch.zeros(size)
            chunk = vals[1:][start:start + size - 1]
            sign = torch.where(torch.rand(chunk.numel(), generator=gen) < 0.5, -1.0, 1.0)
            t[1:1 + chunk.numel()] = chunk * sign
            t[0] = a
            tiles.append(t[torch.randperm(size, generator=gen)] if r > 1 else t)
    return torch.stack(tiles).reshape(-1, r, c)


def _subnormals(n: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    top = {torch.bfloat16: 0x7F, torch.float16: 0x3FF}.get(dtype, 0x7FFFFF)
    it = torch.int32 if dtype == torch.float32 else torch.int16
    sub = torch.randint(1, top + 1, (n,), generator=gen).to(it).view(dtype).to(torch.float32)
    return torch.where(torch.rand(n, generator=gen) < 0.5, sub, -sub)


def _special_tiles(name: str, spec: FormatSpec, tile: tuple[int, int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    r, c = tile
    size = r * c
    inf, nan = math.inf, math.nan
    base = _tiles_below(torch.tensor([1.0, 448.0, 2.0**-120, 3.0e38, 1e-4]), tile, dtype, gen, FILL if r > 1 else size - 1).reshape(-1, size)
    rows: list[torch.Tensor] = []
    if name == "zero":
        rows = [torch.zeros(size), torch.full((size,), -0.0), torch.where(torch.rand(size, generator=gen) < 0.5, 0.0, -0.0)]
    elif name == "denormal":
        rows = [_subnormals(size, dtype, gen), _subnormals(size, dtype, gen), torch.zeros(size)]
        smallest = float(torch.tensor(1, dtype=torch.int32 if dtype == torch.float32 else torch.int16).view(dtype))
        rows[2][0] = smallest
        rows.append(torch.where(torch.rand(size, generator=gen) < 0.5, _subnormals(size, dtype, gen), torch.zeros(size)))
    elif name in ("inf", "nan"):
        for b in base:
            for pos in (0, size - 1):
                for special in ((inf, -inf) if name == "inf" else (nan,)):
                    t = b.clone()
                    t[pos] = special
                    rows.append(t)
        if name == "inf":
            rows += [torch.full((size,), inf), torch.full((size,), -inf), torch.where(torch.arange(size) % 2 == 0, inf, -inf)]
        else:
            t = base[0].clone()
            t[0], t[-1] = nan, inf
            rows += [t, torch.full((size,), nan)]
            sub = _subnormals(size, dtype, gen)
            sub[size // 2] = nan
            rows.append(sub)
    elif name == "dtype_max":
        top = float(torch.finfo(dtype).max)
        for sign in (1.0, -1.0):
            t = _tiles_below(torch.tensor([top]), tile, dtype, gen, FILL if r > 1 else size - 1).reshape(size)
            t[t.abs().argmax()] = sign * top
            rows.append(t)
        rows.append(torch.full((size,), top))
    return torch.stack(rows).reshape(-1, r, c)


def _random_tiles(n: int, tile: tuple[int, int], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    r, c = tile
    mag = torch.exp2(torch.randint(-133, 127, (n, 1), generator=gen).to(torch.float32))
    if r == 1:
        t = torch.randn(n, r * c, generator=gen) * mag
    else:
        t = _tiles_below(mag.reshape(-1) * 3, tile, dtype, gen, FILL).reshape(n, r * c) * torch.rand(n, 1, generator=gen)
    big = torch.finfo(dtype).max  # randn * 2^126 can pass the dtype's max (inf after the cast): random tiles stay finite
    return t.clamp(-big, big).to(dtype).to(torch.float32).reshape(n, r, c)


def variant_calls(fmt: str, options: Optional[dict] = None, *, nan: bool = False) -> list[tuple[str, dict]]:
    """Every ``(variant, options)`` of ``fmt`` on the tile of ``options``: each variant that takes the
    options' tile (``tile_2d``) with every combination of its other bool case options (FP8 block-wise
    ``fp32_scale``), ``options`` included; with ``nan``, only variants that take NaN input."""
    spec = format_spec(fmt)
    options = dict(options or {})
    calls = []
    for v in spec.variant_names:
        takes = {o.name for o in spec.options_for(v)}
        if not set(options) <= takes or (nan and spec.rejects_nan_for(v)):
            continue
        bools = [o.name for o in spec.options_for(v) if o.type is bool and o.code is not None and o.name not in options and o.name != "tile_2d"]
        for mask in range(1 << len(bools)):
            calls.append((v, {**options, **{b: True for i, b in enumerate(bools) if mask >> i & 1}}))
    return calls


def call_name(variant: str, options: dict) -> str:
    """``te``, ``te+fp32_scale``: a variant and its true bool options other than ``tile_2d`` (the layout)."""
    return "+".join([variant, *sorted(k for k, v in options.items() if v is True and k != "tile_2d")])


def _op_order_tiles(fmt: str, options: dict, tile: tuple[int, int], dtype: torch.dtype, gen: torch.Generator, amax_of) -> torch.Tensor:
    from moe_fq_parity.reference.api import fake_quant  # floor 0: the reference evaluates the candidates

    r, c = tile
    n = OP_ORDER_CANDIDATES if r == 1 else OP_ORDER_CANDIDATES // 16
    cand = _random_tiles(n, tile, dtype, gen)
    x = cand.to(dtype)
    outs = [fake_quant(x, amax_of(x), fmt, v, **opts).reshape(n, -1) for v, opts in variant_calls(fmt, options)]
    if len(outs) < 2:
        return cand[:OP_ORDER_TILES]
    bits = [o.view(torch.int16) if o.element_size() == 2 else o.view(torch.int32) for o in outs]
    differ = torch.zeros(n, dtype=torch.bool)
    for b in bits[1:]:
        differ |= (b != bits[0]).any(dim=1)
    return cand[torch.nonzero(differ).reshape(-1)[:OP_ORDER_TILES]]


def per_expert_max(x: torch.Tensor) -> torch.Tensor:
    """fp32 ``max |x|`` per expert of ``[E, rows, cols]`` over its finite elements (0 for none): the
    ``tensor`` amax policy (max calibration that skips NaN and inf)."""
    a = x.to(torch.float32).abs()
    a = torch.where(torch.isfinite(a), a, torch.zeros_like(a))
    return a.reshape(a.shape[0], -1).amax(dim=1)


def block_classes(fmt: str, options: Optional[dict] = None, *, dtype: torch.dtype = torch.bfloat16, seed: int = 0,
                  classes: Optional[tuple[str, ...]] = None) -> list[BlockClass]:
    """The adversarial classes of ``fmt`` (module docstring) on its tile for ``options`` (``tile_2d``:
    the square tile; a size option such as ``group_size``).  The ``nan`` class is built only when some
    variant of the format takes NaN input.  ``classes`` selects some of ``CLASSES`` (default: all)."""
    spec = format_spec(fmt)
    tile = tile_of(fmt, options)
    square = tile[0] > 1
    wanted = CLASSES if classes is None else classes
    unknown = sorted(set(wanted) - set(CLASSES))
    if unknown:
        raise ValueError(f"unknown block class(es) {unknown}; known: {CLASSES}")
    amax_of = (lambda x: per_expert_max(x)) if spec.takes_amax else (lambda x: None)  # noqa: E731
    out = []
    for name in wanted:
        gen = _gen(fmt, tile, name, seed)
        if name == "nan" and all(spec.rejects_nan_for(v) for v in spec.variant_names):
            continue
        if name == "boundary":
            t = _tiles_below(_boundary_amax(spec, dtype, square), tile, dtype, gen, FILL)
        elif name == "tie":
            t = _tie_tiles(spec, tile, dtype, gen)
        elif name == "random":
            t = _random_tiles(RANDOM_TILES, tile, dtype, gen)
        elif name == "op_order":
            t = _op_order_tiles(fmt, dict(options or {}), tile, dtype, gen, amax_of)
        else:
            t = _special_tiles(name, spec, tile, dtype, gen)
        out.append(BlockClass(name, fmt, tile, _experts(t, tile).to(dtype)))
    return out


def _experts(tiles: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """``[n, r, c]`` tiles -> ``[E, TILES_PER_EXPERT * r, c]`` (the last expert padded with ``+0`` tiles)."""
    r, c = tile
    n = tiles.shape[0]
    pad = (-n) % TILES_PER_EXPERT
    if pad:
        tiles = torch.cat([tiles, torch.zeros(pad, r, c)])
    return tiles.reshape(-1, TILES_PER_EXPERT * r, c)
