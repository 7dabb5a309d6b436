"""Value patterns for formats whose scales come from the data per tile (``FormatSpec.tiles``: MX, FP8
block-wise, NVFP4 with ``tile_2d``): every tile of every expert gets one designed pattern (registered as distributions by
``cases.distributions``).

The tile (``1 x 32``, ``32 x 32``, ``1 x 128``, ``128 x 128``, ``1 x 16``, ``16 x 16``) is the registry's
(``FormatSpec.tiles.tile(case options)``), so a pattern covers exactly one scale.  Values are exact
in the case dtype; the tile max is the element at the tile's first position (sign alternating).

* ``tile_edges`` -- the tile amax sits exactly on a scale boundary or one input-dtype ulp either side
  of it: ``A = m * 2**k`` with ``m`` in ``BOUNDARY_MANTISSAS`` (1: the floor/ceil binade edge;
  1.5 = 6/4 and 1.75 = 448/256: where ``A / max`` is a power of two, the ceil / rceil / TE / DeepGEMM /
  FP8-block pow2 edge; 1.9375 and 1.75: where torchao's EVEN rounding carries, E4M3 and E2M1), ``k``
  spread over the dtype's range; the other elements are ``u * A`` (``u`` uniform in (-1, 1)) rounded
  to the dtype, a quarter of them at exact grid fractions ``A * j / 8``.  In a square tile (``r x c``,
  ``r > 1``) the rows below the first hold values ``2**-d`` smaller, ``d`` cycling through
  ``ROW_DROPS``: each ``1 x c`` row block then has a maximum of its own, so a 1D tiling's scales differ
  from the tile's under every scale rule (``tests/cases/test_cases.py`` checks it on every smoke case).
* ``tile_specials`` -- tiles cycling through: all ±0; one +inf; one NaN (formats that reject NaN:
  -inf); tiny amax ``2**-127`` and ``2**-130`` (fp32 subnormal; in the dtype where it holds them);
  ``1.75 * 2**-119 = 448 * 2**-127`` and one ulp either side (Transformer Engine's code-0 edge);
  every element a subnormal of the dtype; the dtype's max (a ceil rule overflows to inf); an amax
  at ``1e-4`` and one ulp either side (DeepGEMM's amax floor); a plain random tile.
"""

from __future__ import annotations

import math

import torch

from moe_fq_parity.reference.formats import FormatSpec, format_spec

from .case import Case

Shapes = list[tuple[int, int]]

BOUNDARY_MANTISSAS = (1.0, 1.5, 1.75, 1.9375)
"""Tile-amax mantissas on the scale boundaries of the tiled formats' variants (module docstring)."""

ROW_DROPS = (0, 3, 16, 8)
"""Binades by which row ``j`` of a square tile lies below the tile's values (``d = ROW_DROPS[j % 4]``; row 0
holds the tile max).  Under the tile's scale a row 3 binades down lies below E2M1's smallest normal
(1 of 6), one 16 binades down below E4M3's (``2**-6`` of 448), so even power-of-two scales (E8M0, FP8
block-wise pow2, UE8M0) quantize those rows differently from row blocks scaled on their own maximum;
8 binades down is the middle ground, and any drop moves an fp32 or E4M3 block scale."""

SPECIAL_TILES = ("zeros", "inf", "nan", "tiny127", "tiny130", "te_code0", "te_code0_up", "te_code0_down", "subnormal", "dtype_max",
                 "floor1e-4", "floor1e-4_up", "floor1e-4_down", "random")
"""The ``tile_specials`` patterns, in the order tiles cycle through them."""


def tiled(spec: FormatSpec) -> bool:
    """The format has scales per tile (``FormatSpec.tiles``)."""
    return spec.tiles is not None


def tiled_with_nan(spec: FormatSpec) -> bool:
    """Scales per tile and NaN input taken by some variant (``tile_specials`` writes NaN where the case's
    variant takes it, else ``-inf``)."""
    return tiled(spec) and not all(spec.rejects_nan_for(v) for v in spec.variant_names)


def _tile_index(case: Case, o: int, k: int) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """``(tile id per element [o, k], first-element mask [o, k], tile)`` for the case's tile."""
    r, c = format_spec(case.fmt).tiles.tile(case.option_dict)  # type: ignore[union-attr]
    rows, cols = torch.arange(o).unsqueeze(1), torch.arange(k).unsqueeze(0)
    per_row = -(-k // c)
    tid = (rows // r) * per_row + cols // c
    first = (rows % r == 0) & (cols % c == 0)
    return tid, first, (r, c)


def _ulp_step(a: torch.Tensor, dtype: torch.dtype, steps: torch.Tensor) -> torch.Tensor:
    """``a`` (exact in ``dtype``) moved ``steps`` (-1, 0, +1) ulps of ``dtype``, back in fp32."""
    d = a.to(dtype)
    up = torch.nextafter(d, torch.full_like(d, math.inf))
    down = torch.nextafter(d, torch.full_like(d, -math.inf))
    return torch.where(steps > 0, up, torch.where(steps < 0, down, d)).to(torch.float32)


def _fill(case: Case, gen: torch.Generator, o: int, k: int, amax_per_tile: torch.Tensor, e: int, dtype: torch.dtype,
          row_drops: bool = False) -> torch.Tensor:
    """Elements ``u * A`` of their tile, the tile's first element ``±A``, rounded to the dtype;
    ``row_drops``: in square tiles, ``u * A * 2**-ROW_DROPS[j % 4]`` in row ``j`` of the tile."""
    tid, first, (r, _) = _tile_index(case, o, k)
    a = amax_per_tile[tid]
    u = torch.rand((o, k), generator=gen) * 2 - 1
    grid = (torch.randint(-8, 9, (o, k), generator=gen).to(torch.float32) / 8)
    u = torch.where(torch.rand((o, k), generator=gen) < 0.25, grid, u)
    if row_drops and r > 1:
        u = u * torch.pow(2.0, -torch.tensor(ROW_DROPS, dtype=torch.float32))[torch.arange(o) % r % len(ROW_DROPS)].unsqueeze(1)
    x = (u * a).to(dtype).to(torch.float32)
    x = torch.where(x.abs() > a, a * torch.sign(x), x)  # never above the tile amax after rounding
    sign = torch.where((tid + e) % 2 == 0, 1.0, -1.0)
    return torch.where(first, sign * a, x)


def _exponents(dtype: torch.dtype) -> tuple[int, int]:
    """Tile-amax exponents that keep every boundary amax and its neighbours normal and finite in the dtype."""
    fi = torch.finfo(dtype)
    return max(math.frexp(fi.tiny)[1] + 4, -40), min(math.frexp(fi.max)[1] - 2, 40)


def tile_edges(case: Case, gen: torch.Generator, shapes: Shapes, dtype: torch.dtype) -> list[torch.Tensor]:
    """fp32 values of ``tile_edges`` (module docstring), exact in ``dtype``."""
    lo, hi = _exponents(dtype)
    values = []
    for e, (o, k) in enumerate(shapes):
        tid, _, _ = _tile_index(case, o, k)
        n_tiles = int(tid.max()) + 1 if tid.numel() else 0
        t = torch.arange(n_tiles)
        m = torch.tensor(BOUNDARY_MANTISSAS)[(t + e) % len(BOUNDARY_MANTISSAS)]
        steps = ((t // len(BOUNDARY_MANTISSAS) + e) % 3) - 1
        kexp = torch.randint(lo, hi + 1, (n_tiles,), generator=gen)
        a = _ulp_step(m * torch.pow(2.0, kexp.to(torch.float32)), dtype, steps)
        values.append(_fill(case, gen, o, k, a, e, dtype, row_drops=True) if n_tiles else torch.zeros((o, k)))
    return values


def _special_amax(dtype: torch.dtype) -> dict[str, float]:
    fi = torch.finfo(dtype)
    one = lambda v, s: float(_ulp_step(torch.tensor(v), dtype, torch.tensor(s)))  # noqa: E731
    te0 = 448.0 * 2.0**-127
    return {"tiny127": 2.0**-127, "tiny130": 2.0**-130, "te_code0": te0, "te_code0_up": one(te0, 1), "te_code0_down": one(te0, -1),
            "dtype_max": fi.max, "floor1e-4": 1e-4, "floor1e-4_up": one(1e-4, 1), "floor1e-4_down": one(1e-4, -1), "random": 1.0}


def tile_specials(case: Case, gen: torch.Generator, shapes: Shapes, dtype: torch.dtype) -> list[torch.Tensor]:
    """fp32 values of ``tile_specials`` (module docstring), exact in ``dtype``."""
    fi = torch.finfo(dtype)
    amaxes = _special_amax(dtype)
    rejects_nan = format_spec(case.fmt).rejects_nan_for(case.variant)
    int_dtype = torch.int32 if dtype == torch.float32 else torch.int16
    values = []
    for e, (o, k) in enumerate(shapes):
        tid, first, _ = _tile_index(case, o, k)
        n_tiles = int(tid.max()) + 1 if tid.numel() else 0
        kinds = [SPECIAL_TILES[(t + e) % len(SPECIAL_TILES)] for t in range(n_tiles)]
        a = torch.tensor([amaxes.get(kind, 1.0) for kind in kinds] or [0.0]).to(dtype).to(torch.float32)
        x = _fill(case, gen, o, k, a, e, dtype) if n_tiles else torch.zeros((o, k))
        kind_of = torch.tensor([SPECIAL_TILES.index(kind) for kind in kinds] or [0])[tid] if n_tiles else torch.zeros((o, k), dtype=torch.long)
        is_kind = lambda name: kind_of == SPECIAL_TILES.index(name)  # noqa: E731
        signed_zero = torch.where(torch.rand((o, k), generator=gen) < 0.5, 0.0, -0.0)
        x = torch.where(is_kind("zeros"), signed_zero, x)
        x = torch.where(is_kind("inf") & first, torch.tensor(math.inf), x)
        x = torch.where(is_kind("nan") & first, torch.tensor(-math.inf if rejects_nan else math.nan), x)
        sub = torch.randint(1, 0x7F if dtype == torch.bfloat16 else 0x3FF, (o, k), generator=gen).to(int_dtype).view(dtype).to(torch.float32)
        sub = torch.where(torch.rand((o, k), generator=gen) < 0.5, sub, -sub)
        x = torch.where(is_kind("subnormal"), sub, x)
        values.append(x.to(dtype).to(torch.float32) if fi.bits < 32 else x)
    return values
