"""Suite entries (``Case`` fields) of the formats whose scales come from the data per tile (``FormatSpec.tiles``).

Which formats: those that take no amax (``FormatSpec.takes_amax`` is false: MX, FP8 block-wise; their
cases have granularity ``from_data`` and amax policy ``none``) and the amax-taking formats with an
option ``tile_2d`` (NVFP4 16x16), whose 2D-tile cases are added here while the generic suites of
``cases.catalogue`` cover their 1D layout.  Everything is read from the registry; the shapes put
several tiles in each expert and end in a partial tile in both dims (MX and 2D tiles zero-pad it;
``reference.mx`` states which upstream refuses it instead).

* ``smoke``: every variant on ``tile_edges``, the default variant's ``tile_specials`` and ``zeros``,
  every bool option (see ``smoke``).
* ``ci``: every variant on ``tile_edges`` (1D and 2D) and ``tile_specials`` (1D); the default variant
  on the generic distributions, the list / ragged / empty-expert layouts, fp16 and fp32, N = 4, 8, 16;
  every bool option (``fp32_scale``, fp32 input included).
* ``nightly``: ``ci`` plus N in 4..128 at ``[512, 1024]``, odd shapes per variant, the Nemotron-3
  routed shapes; ``ultra``: the Ultra production case and the routed Ultra shapes (default variant, 1D
  and 2D tiles).
"""

from __future__ import annotations

from itertools import product
from typing import Any, Callable

from moe_fq_parity.reference import FORMATS, format_spec, variants

from .distributions import DISTRIBUTIONS
from .shapes import NEMOTRON, NEMOTRON_EXPERTS, N_VALUES, ODD_SHAPES, ULTRA_PRODUCTION

Entry = dict[str, Any]
"""The fields of one ``Case``; ``cases.catalogue`` validates and builds them."""


def tiled_formats() -> list[str]:
    """Registered formats with scales per tile: those without amax, and those with ``tile_2d``."""
    return [f for f in FORMATS if format_spec(f).tiles is not None and (not format_spec(f).takes_amax or _has_2d(f))]


def _has_2d(fmt: str) -> bool:
    return format_spec(fmt).option("tile_2d") is not None


def _shape(fmt: str, opts: tuple) -> tuple[int, int]:
    """One full tile and partial ones in both dims for square tiles (``[r + 3, c + 5]``: ``[131, 133]``
    for 128x128, ``[35, 37]`` for 32x32); two blocks and a partial one in 8 rows for ``1 x c`` blocks."""
    r, c = format_spec(fmt).tiles.tile(dict(opts))  # type: ignore[union-attr]
    return (r + 3, c + 5) if r > 1 else (8, 2 * c + 5)


def _n(fmt: str, opts: tuple, n: int) -> int:
    """``n`` experts, a quarter (at least 1) for tiles of more than 4096 elements (128x128: the CI's
    element budget; the nightly suite sweeps N)."""
    r, c = format_spec(fmt).tiles.tile(dict(opts))  # type: ignore[union-attr]
    return n if r * c <= 4096 else max(1, n // 4)


def _base(fmt: str) -> dict:
    """Granularity and amax policy of a format's cases: ``from_data``/``none`` without amax, else
    per-expert calibrated (or designed, set by the caller)."""
    return {"granularity": "from_data", "amax": "none"} if not format_spec(fmt).takes_amax else {"granularity": "per_expert", "amax": "max"}


def _layouts(fmt: str, variant: str) -> list[tuple[tuple[str, object], ...]]:
    """Option sets: 1D and, where the variant takes it, 2D tiles (an amax format: 2D only)."""
    two_d = "tile_2d" in {o.name for o in format_spec(fmt).options_for(variant)}
    out = [] if format_spec(fmt).takes_amax else [()]
    return out + ([(("tile_2d", True),)] if two_d else [])


def _make(fmt: str, variant: str, opts: tuple, **kw) -> list[Entry]:
    """One entry (the fields of a ``Case``), none where the distribution does not apply to ``fmt``."""
    fields = {**_base(fmt), "fmt": fmt, "variant": variant, "options": opts, **kw}
    if fields["dist"] in DISTRIBUTIONS and not DISTRIBUTIONS[fields["dist"]].applies_to(fmt):
        return []
    spec = format_spec(fmt)
    if fields["dist"] == "tile_specials" and spec.is_int and spec.rejects_nan_for(variant):
        return []  # INT4 group-wise rejects NaN and inf alike: such specials only repeat the ``nan`` case's rejection
    return [fields]


def smoke() -> list[Entry]:
    """Small (two experts, one for 128x128 tiles) and enough to kill every block-scaled mutant
    (``moe-fq-parity selftest --suite smoke``): every variant on its tile boundaries (the default
    variant in 1D and 2D, the others in their first layout), every variant's specials, the default's zero
    tiles (1D), fp16 boundaries, and every bool option on fp32 boundaries and bf16 specials.  Every case with an option
    set gives other bits with the option flipped (``tests/cases/test_cases.py``): 2D cases put
    rows of other magnitudes in each tile (``cases.tile_data.ROW_DROPS``)."""
    out: list[Entry] = []
    for fmt in tiled_formats():
        default = variants(fmt)[0]
        for var in variants(fmt):
            layouts = _layouts(fmt, var)
            for opts in layouts if var == default else layouts[:1]:
                out += _make(fmt, var, opts, layout="stacked", n=_n(fmt, opts, 2), shape=_shape(fmt, opts), dist="tile_edges")
            for opts in layouts[:1]:  # zero, tiny, subnormal, inf and NaN tiles: where the rules differ most
                out += _make(fmt, var, opts, layout="stacked", n=_n(fmt, opts, 2), shape=_shape(fmt, opts), dist="tile_specials")
        # all-zero tiles give +-0 under any tiling, so 1D tiles (a 2D case could not tell the tilings apart)
        out += _make(fmt, default, (), layout="stacked", n=_n(fmt, (), 2), shape=_shape(fmt, ()), dist="zeros")
        for opts in _layouts(fmt, default)[:1]:  # fp16 input: amax values that bf16 would round
            out += _make(fmt, default, opts, layout="stacked", n=_n(fmt, opts, 2), shape=_shape(fmt, opts), dist="tile_edges", dtype="fp16")
        for o in format_spec(fmt).options:
            if o.type is bool and o.name != "tile_2d" and o.code is not None:
                for var in sorted(o.variants or variants(fmt)):
                    opts = tuple(sorted(_layouts(fmt, var)[0] + ((o.name, True),)))
                    out += _make(fmt, var, opts, layout="stacked", n=_n(fmt, opts, 2), shape=_shape(fmt, opts), dist="tile_edges",
                                 dtype="fp32")  # fp32 output shows a one-ulp op-order difference
                    # bf16 specials: the option's rule on subnormal, tiny, inf and NaN tiles (bf16's range reaches them)
                    out += _make(fmt, var, opts, layout="stacked", n=_n(fmt, opts, 2), shape=_shape(fmt, opts), dist="tile_specials")
    return out


_CI_DEFAULT = ("outliers", "zeros", "special", "nan")
"""``nan`` applies to the formats that reject NaN input (INT4 group-wise, NVFP4): the check is the rejection."""


def ci() -> list[Entry]:
    out = smoke()
    for fmt in tiled_formats():
        default = variants(fmt)[0]
        for var in variants(fmt):
            layouts = _layouts(fmt, var)
            for opts, dist in product(layouts, ("tile_edges", "tile_specials")):
                if dist == "tile_specials" and opts and len(layouts) > 1:
                    continue  # the specials once per variant (1D); the boundaries in every layout
                out += _make(fmt, var, opts, layout="stacked", n=_n(fmt, opts, 4), shape=_shape(fmt, opts), dist=dist)
        for opts in _layouts(fmt, default):
            shape = _shape(fmt, opts)
            for dist in _CI_DEFAULT:
                out += _make(fmt, default, opts, layout="stacked", n=_n(fmt, opts, 8), shape=shape, dist=dist)
            out += _make(fmt, default, opts, layout="list", n=_n(fmt, opts, 8), shape=shape, empty=1, dist="tile_specials")
            out += _make(fmt, default, opts, layout="ragged", n=_n(fmt, opts, 16), shape=shape, empty=2, dist="tile_edges")
            for dtype in ("fp16", "fp32"):
                dist = "tile_specials" if dtype == "fp32" and DISTRIBUTIONS["tile_specials"].applies_to(fmt) else "tile_edges"
                out += _make(fmt, default, opts, layout="list", n=_n(fmt, opts, 4), shape=shape, dtype=dtype, dist=dist)
        for o in format_spec(fmt).options:
            if o.type is bool and o.name != "tile_2d" and o.code is not None:
                for var in sorted(o.variants or variants(fmt)):
                    for opts, dist in product(_layouts(fmt, var), ("tile_edges", "tile_specials")):
                        both = tuple(sorted(opts + ((o.name, True),)))
                        out += _make(fmt, var, both, layout="stacked", n=_n(fmt, opts, 4), shape=_shape(fmt, opts), dist=dist)
                    both = tuple(sorted(((o.name, True),)))
                    out += _make(fmt, var, both, layout="list", n=4, shape=_shape(fmt, ()), dist="tile_edges", dtype="fp32")
    return out


def nightly() -> list[Entry]:
    out = ci()
    for fmt in tiled_formats():
        default = variants(fmt)[0]
        for opts, n in product(_layouts(fmt, default), N_VALUES):
            out += _make(fmt, default, opts, layout="stacked", n=n, shape=(512, 1024), dist="tile_edges")
        for var in variants(fmt):
            for opts, shape, dist in product(_layouts(fmt, var), ODD_SHAPES, ("tile_edges", "tile_specials", "outliers")):
                out += _make(fmt, var, opts, layout="stacked", n=8, shape=shape, dist=dist)
        ep = {"nano": 4, "super": 16, "ultra": 32}
        for model, shapes in NEMOTRON.items():
            for shape, opts in product(shapes.values(), _layouts(fmt, default)):
                out += _make(fmt, default, opts, layout="stacked", n=NEMOTRON_EXPERTS[model] // ep[model], shape=shape, dist="outliers")
    return out + ultra()


def ultra() -> list[Entry]:
    out: list[Entry] = []
    n, shape = ULTRA_PRODUCTION
    for fmt in tiled_formats():
        default = variants(fmt)[0]
        for opts in _layouts(fmt, default):
            out += _make(fmt, default, opts, layout="stacked", n=n, shape=shape, dist="outliers")
            for s in NEMOTRON["ultra"].values():
                out += _make(fmt, default, opts, layout="stacked", n=NEMOTRON_EXPERTS["ultra"] // 32, shape=s, dist="outliers")
    return out


SUITE_HOOKS: dict[str, Callable[[], list[Entry]]] = {"smoke": smoke, "ci": ci, "nightly": nightly, "ultra": ultra}
"""Suite name -> this module's entries for it (``cases.catalogue`` builds and appends them)."""
