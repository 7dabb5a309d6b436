"""The format registry: one ``FormatSpec`` per fake-quant format, the one home of format knowledge.

A spec states what the rest of the package needs to know about a format:

* ``variants`` (name -> the reference function of that op sequence) and ``default_variant``;
* ``options``: the keyword options it takes, their types, the variants that take them and how a
  case id writes them (``Option``);
* ``amax_granularities``: the amax it takes (NVFP4: a global amax, per tensor or per expert only;
  ``{"from_data"}``: no amax at all, ``amax=None``: MX and FP8 block-wise derive every scale from the
  data);
* ``tiles``: the layout of scales derived from the data per tile of the last two dims (``TileScaling``:
  ``1 x size`` along in-features, or ``size_2d x size_2d`` with the option ``tile_2d``), if any;
* ``grid``: the element grid in scaled units (``IntGrid`` of ``bits`` bits or a ``MinifloatGrid``)
  and so the scale numerator ``c`` of the encode scale ``s = RN(c / amax)`` (``scale_numerator``);
* ``block``: two-level block scaling (NVFP4: 16-element blocks, E4M3 block scales), if any;
* input rules: ``rejects_nan`` (NVFP4), and options after which negative input is rejected
  (``Option.nonnegative_input``: INT ``unsigned``).

The numeric code of each format stays in its module (``int_quant``, ``fp8_e4m3``, ``nvfp4``, ``mx``,
``fp8_block``, ``int_group``), whose
docstring is the format's numeric contract; this module only names and describes it.  The reference
dispatch (``reference.api``), the cases, the harness, the self-test mutants and the kernels' option
parsing ask the registry (``format_spec``, ``FORMATS``) instead of spelling format names.

Adding a format: a module with its variant functions (each returns a ``FakeQuantResult``), plus one
``register_format(FormatSpec(...))`` line at the end of this file.  A format registered at run time
(a test's toy format, e.g. ``register_format(int_format("int6", 6))``) is seen by every consumer
until ``unregister_format`` removes it; built-in formats cannot be removed.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any, Callable, ClassVar, Iterator, Mapping, Optional, Union

import torch

from . import fp8_block, fp8_e4m3, int_group, int_quant, mx, nvfp4
from .constants import (
    E2M1_MAX,
    E4M3_MANTISSA_BITS,
    E4M3_MAX,
    E4M3_MIN_NORMAL_EXP,
    FP8_BLOCK,
    INT4_GROUP,
    MX_BLOCK,
    NVFP4_BLOCK,
    NVFP4_GLOBAL_SCALE_NUM,
    int_bounds,
)
from .granularity import AMAX_GRANULARITIES, FROM_DATA, GRANULARITIES
from .result import FakeQuantResult
from .rounding import round_to_minifloat

VariantFn = Callable[..., FakeQuantResult]
"""``fn(x, amax, **options) -> FakeQuantResult`` (see ``reference.api.fake_quant``)."""


# --- element grids ------------------------------------------------------------------------------


@dataclass(frozen=True)
class IntGrid:
    """The integers ``lo..qmax`` of a ``bits``-bit INT format (``reference.constants.int_bounds``).

    ``qmax = 2**(bits-1) - 1`` signed, ``2**bits - 1`` unsigned; ``lo = -qmax - 1`` (wide),
    ``-qmax`` (narrow range) or ``0`` (unsigned).  The encode scale uses ``qmax``.
    """

    bits: int

    min_normal_exp: ClassVar[int] = 0
    """Exponent of the grid's unit ``1 = 2**0``: every integer of the grid is exact at that step."""

    def __post_init__(self) -> None:
        int_bounds(self.bits, unsigned=False, narrow_range=False)  # raises for bits outside [2, 16]

    def bounds(self, *, unsigned: bool = False, narrow_range: bool = False) -> tuple[float, float]:
        """``(lo, qmax)`` for the options."""
        return int_bounds(self.bits, unsigned=unsigned, narrow_range=narrow_range)


@dataclass(frozen=True)
class MinifloatGrid:
    """A sign-magnitude minifloat (``reference.rounding.round_to_minifloat``): ``mantissa_bits``
    explicit mantissa bits, smallest normal ``2**min_normal_exp``, saturating at ``±max_value``."""

    mantissa_bits: int
    min_normal_exp: int
    max_value: float

    def round(self, v: torch.Tensor) -> torch.Tensor:
        """fp32 -> nearest grid value (fp32), ties to even, saturating; NaN stays NaN."""
        return round_to_minifloat(v, mantissa_bits=self.mantissa_bits, min_normal_exp=self.min_normal_exp, max_value=self.max_value)


E4M3_GRID = MinifloatGrid(E4M3_MANTISSA_BITS, E4M3_MIN_NORMAL_EXP, E4M3_MAX)
"""FP8 E4M3 (fn): 3 mantissa bits, smallest normal ``2**-6``, ±448."""
E2M1_GRID = MinifloatGrid(1, 0, E2M1_MAX)
"""FP4 E2M1: ``{0, .5, 1, 1.5, 2, 3, 4, 6}``, ±6."""

Grid = Union[IntGrid, MinifloatGrid]


@dataclass(frozen=True)
class BlockScaling:
    """Two-level scaling: ``size`` consecutive elements of the last dim share a block scale that
    is itself rounded to ``scale_grid`` (NVFP4: 16 elements, E4M3 block scales); the amax the
    format takes is the *global* amax above the block scales."""

    size: int
    scale_grid: MinifloatGrid


@dataclass(frozen=True)
class TileScaling:
    """Scales that come from the data, one per tile of the last two dims ``[..., out, in]``: a tile is
    ``1 x size`` along in-features, or ``size_2d x size_2d`` when the option ``tile_2d`` is set; a
    partial tile is zero-padded (``reference.granularity.to_tiles``).  ``scale`` names the scale's
    encoding (``"e8m0"``, ``"fp32 or pow2"``, ``"e4m3"``).  ``size_option`` names an int option that
    replaces ``size`` (NVFP4 ``block_size``)."""

    size: int
    size_2d: Optional[int]
    scale: str
    size_option: Optional[str] = None

    def tile(self, options: Mapping[str, object]) -> tuple[int, int]:
        """The ``(rows, cols)`` tile for a case's options (``tile_2d``, and ``size_option`` if any)."""
        if self.size_option is not None and self.size_option in options:
            size = square = int(options[self.size_option])  # type: ignore[call-overload]
        else:
            size, square = self.size, self.size_2d or self.size
        return (square, square) if options.get("tile_2d") is True else (1, size)


# --- options ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Option:
    """A keyword option of a format's fake quant.

    * ``type``: ``bool``, ``int`` (with ``minimum``) or a class such as ``torch.Tensor``;
    * ``variants``: the variants that take it (``None``: every variant);
    * ``code``: how a case id writes it (``+{code}`` for a ``True`` bool, ``+{code}{value}`` for an
      int); ``None``: not a case option (e.g. a tensor);
    * ``fuzz_values``: values the fuzzer draws for an int option (bools draw ``True``/``False``);
    * ``nonnegative_input``: when set (``True``), negative input values are rejected (``unsigned``).
    """

    name: str
    type: type
    help: str
    variants: Optional[frozenset[str]] = None
    code: Optional[str] = None
    minimum: Optional[int] = None
    fuzz_values: tuple[Any, ...] = ()
    nonnegative_input: bool = False

    def problem(self, value: object) -> Optional[str]:
        """``None`` when ``value`` has this option's type (and minimum), else what is wrong."""
        if self.type is bool:
            ok, want = isinstance(value, bool), "a bool"
        elif self.type is int:
            ok = isinstance(value, int) and not isinstance(value, bool) and (self.minimum is None or value >= self.minimum)
            want = "an int" + (f" >= {self.minimum}" if self.minimum is not None else "")
        else:
            ok, want = isinstance(value, self.type), f"a {self.type.__module__}.{self.type.__qualname__}"
        return None if ok else f"{self.name} must be {want}, got {value!r}"

    def applies_to(self, variant: str) -> bool:
        return self.variants is None or variant in self.variants


_INT_OPTIONS = (
    Option("narrow_range", bool, "grid -qmax..qmax instead of -qmax-1..qmax", code="narrow"),
    Option("unsigned", bool, "grid 0..2**b-1; negative input is rejected", code="unsigned", nonnegative_input=True),
)


# --- the spec -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class FormatSpec:
    """Everything the package knows about one format (see the module docstring)."""

    name: str
    grid: Grid
    variants: Mapping[str, VariantFn]
    default_variant: str
    options: tuple[Option, ...] = ()
    amax_granularities: frozenset[str] = frozenset(AMAX_GRANULARITIES)
    block: Optional[BlockScaling] = None
    tiles: Optional[TileScaling] = None
    global_scale_numerator: Optional[float] = None
    """``c`` of the global encode scale for block formats (NVFP4: ``448 * 6``)."""
    rejects_nan: Union[bool, frozenset[str]] = False
    """NaN input raises ``ValueError``: ``True`` for every variant, or the set of variants that reject it
    (``rejects_nan_for``)."""
    doc: str = ""

    def __post_init__(self) -> None:
        problems = []
        if not self.name or not self.name.replace("_", "").isalnum() or self.name != self.name.lower():
            problems.append(f"name must be lower-case letters, digits and '_', got {self.name!r}")
        if self.default_variant not in self.variants:
            problems.append(f"default_variant {self.default_variant!r} is not one of the variants {tuple(self.variants)}")
        if not set(self.amax_granularities) <= set(GRANULARITIES) or not self.amax_granularities:
            problems.append(f"amax_granularities must be a non-empty subset of {GRANULARITIES}, got {sorted(self.amax_granularities)}")
        elif FROM_DATA in self.amax_granularities and (len(self.amax_granularities) > 1 or self.tiles is None):
            problems.append(f"{FROM_DATA!r} (no amax) is a format's only granularity, and needs tiles (TileScaling)")
        names = [o.name for o in self.options]
        if len(set(names)) != len(names):
            problems.append(f"options named twice: {names}")
        for o in self.options:
            if o.variants is not None and not o.variants <= set(self.variants):
                problems.append(f"option {o.name} names unknown variants {sorted(o.variants - set(self.variants))}")
        if isinstance(self.rejects_nan, frozenset) and not self.rejects_nan <= set(self.variants):
            problems.append(f"rejects_nan names unknown variants {sorted(self.rejects_nan - set(self.variants))}")
        if (self.block is None) != (self.global_scale_numerator is None):
            problems.append("a block format needs global_scale_numerator, and only a block format has one")
        if problems:
            raise ValueError(f"invalid FormatSpec {self.name!r}: " + "; ".join(problems))
        object.__setattr__(self, "variants", MappingProxyType(dict(self.variants)))
        object.__setattr__(self, "amax_granularities", frozenset(self.amax_granularities))

    # variants

    @property
    def variant_names(self) -> tuple[str, ...]:
        """The variant names, the default first."""
        return (self.default_variant,) + tuple(v for v in self.variants if v != self.default_variant)

    def resolve_variant(self, variant: Optional[str]) -> str:
        """``None``/``"default"`` -> the default; an unknown name raises ``ValueError``."""
        name = self.default_variant if variant in (None, "default") else variant
        if name not in self.variants:
            raise ValueError(f"unknown variant {name!r} for {self.name}; known: {self.variant_names}")
        return name

    # options

    def options_for(self, variant: Optional[str] = None) -> tuple[Option, ...]:
        """The options ``variant`` (default: the default variant) takes."""
        name = self.resolve_variant(variant)
        return tuple(o for o in self.options if o.applies_to(name))

    def option(self, name: str) -> Optional[Option]:
        return next((o for o in self.options if o.name == name), None)

    def check_options(self, variant: Optional[str], options: Mapping[str, object]) -> None:
        """Raise ``TypeError`` for an option ``variant`` does not take or a value of the wrong type."""
        name = self.resolve_variant(variant)
        takes = sorted(o.name for o in self.options_for(name))
        unknown = sorted(set(options) - {o.name for o in self.options})
        if unknown:
            raise TypeError(f"{self.name} does not take option(s) {unknown}; it takes {takes}")
        other = sorted(set(options) - set(takes))
        if other:
            where = "; ".join(f"{o}: an option of the {self.name} variant(s) {sorted(self.option(o).variants)} only" for o in other)
            raise TypeError(f"{self.name} variant {name!r} does not take option(s) {other} ({where}); it takes {takes}")
        for key, value in options.items():
            why = self.option(key).problem(value)
            if why:
                raise TypeError(f"{self.name} option {why}")

    def rejects_nan_for(self, variant: Optional[str] = None) -> bool:
        """Whether ``variant`` (default: the default variant) rejects NaN input."""
        if isinstance(self.rejects_nan, frozenset):
            return self.resolve_variant(variant) in self.rejects_nan
        return bool(self.rejects_nan)

    @property
    def rejects_nan_any(self) -> bool:
        """Some variant rejects NaN input."""
        return bool(self.rejects_nan)

    def rejects_negative(self, options: Mapping[str, object]) -> bool:
        """Whether ``options`` make negative input an error (INT ``unsigned=True``)."""
        return any(o.nonnegative_input and options.get(o.name) is True for o in self.options)

    # amax and scales

    @property
    def takes_amax(self) -> bool:
        """Whether the format takes an amax argument (``False``: ``amax=None``, scales from the data)."""
        return FROM_DATA not in self.amax_granularities

    def granularity_problem(self, granularity: str) -> Optional[str]:
        """``None`` when the format takes an amax of ``granularity``, else why not."""
        if granularity in self.amax_granularities:
            return None
        if not self.takes_amax:
            return f"{self.name} takes no amax (amax=None: its scales come from the data), not a {granularity.replace('_', '-')} one"
        if granularity == FROM_DATA:
            took = " or ".join(g.replace("_", "-") for g in GRANULARITIES if g in self.amax_granularities)
            return f"{self.name} needs a {took} amax tensor, got amax=None"
        took = " or ".join(g.replace("_", "-") for g in GRANULARITIES if g in self.amax_granularities)
        glob = " global" if self.block is not None else ""
        return f"{self.name} takes a {took}{glob} amax, not a {granularity.replace('_', '-')} one"

    def check_granularity(self, granularity: str) -> None:
        """Raise ``ValueError`` unless the format takes an amax of ``granularity``."""
        why = self.granularity_problem(granularity)
        if why:
            raise ValueError(why)

    def scale_numerator(self, *, unsigned: bool = False) -> float:
        """``c`` with encode scale ``s = RN(c / amax)``: INT qmax, FP8 448, NVFP4 448*6 (global scale);
        a format with scales from the data: its element maximum (448, 6)."""
        if self.global_scale_numerator is not None:
            return self.global_scale_numerator
        if isinstance(self.grid, IntGrid):
            return self.grid.bounds(unsigned=unsigned)[1]
        return self.grid.max_value

    @property
    def is_int(self) -> bool:
        """An integer grid (its scaled values are integers; ``grid.bits`` is its width)."""
        return isinstance(self.grid, IntGrid)

    @property
    def power_of_two_blind(self) -> bool:
        """Multiplying amax by ``2**k`` shifts scale, scaled values and dequantization by the same
        exact power of two (minifloat grids, outside subnormals and saturation): amax that differ
        only by a power of two give the same fake quant."""
        return isinstance(self.grid, MinifloatGrid)


def int_format(name: str, bits: int, *, doc: str = "") -> FormatSpec:
    """An INT format of ``bits`` bits: the ``int_quant`` variants with ``num_bits=bits``, INT options."""
    variants = {v: functools.partial(fn, num_bits=bits) for v, fn in int_quant.VARIANTS.items()}
    return FormatSpec(name, IntGrid(bits), variants, int_quant.DEFAULT_VARIANT, _INT_OPTIONS, doc=doc or f"INT{bits} (reference.int_quant)")


# --- the registry -------------------------------------------------------------------------------

_REGISTRY: dict[str, FormatSpec] = {}
_BUILTIN: set[str] = set()


class _FormatNames(Sequence):
    """The registered format names in registration order: a live, read-only tuple-like view."""

    def __getitem__(self, i):  # type: ignore[override]
        return tuple(_REGISTRY)[i]

    def __len__(self) -> int:
        return len(_REGISTRY)

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(_REGISTRY))

    def __contains__(self, name: object) -> bool:
        return name in _REGISTRY

    def __eq__(self, other: object) -> bool:
        return isinstance(other, (tuple, _FormatNames)) and tuple(self) == tuple(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(tuple(_REGISTRY))


FORMATS: Sequence[str] = _FormatNames()
"""Names of the registered formats (backend contract, cases, reports): a live view of the registry."""


def format_spec(fmt: str) -> FormatSpec:
    """The spec of ``fmt``; ``ValueError`` naming the known formats otherwise."""
    spec = _REGISTRY.get(fmt) if isinstance(fmt, str) else None
    if spec is None:
        raise ValueError(f"unknown format {fmt!r}; known: {tuple(_REGISTRY)}")
    return spec


def _check_option_consistency(spec: FormatSpec) -> None:
    """An option name means one thing everywhere: same type and case-id code in every format."""
    for o in spec.options:
        for other in _REGISTRY.values():
            p = other.option(o.name)
            if p is not None and other.name != spec.name and (p.type, p.code) != (o.type, o.code):
                raise ValueError(f"option {o.name!r} of {spec.name} has type/code {(o.type, o.code)}, "
                                 f"but {other.name} declares {(p.type, p.code)}")
            clash = next((q for q in other.options if o.code and q.code == o.code and q.name != o.name), None)
            if clash is not None:
                raise ValueError(f"option code {o.code!r} of {spec.name}.{o.name} is {other.name}.{clash.name}'s already")


def register_format(spec: FormatSpec) -> FormatSpec:
    """Add ``spec`` to the registry (``ValueError`` if the name is taken or its options clash)."""
    if not isinstance(spec, FormatSpec):
        raise TypeError(f"register_format takes a FormatSpec, got {type(spec).__name__}")
    if spec.name in _REGISTRY:
        raise ValueError(f"format {spec.name!r} is registered already")
    _check_option_consistency(spec)
    _REGISTRY[spec.name] = spec
    return spec


def unregister_format(fmt: str) -> None:
    """Remove a format registered at run time (built-in formats stay)."""
    if fmt in _BUILTIN:
        raise ValueError(f"{fmt} is a built-in format and cannot be unregistered")
    format_spec(fmt)
    del _REGISTRY[fmt]


def describe(fmt: str) -> str:
    """One line about ``fmt`` for listings (``moe-fq-parity list``): variants (default first), the amax
    it takes, its scale tiles and its options."""
    spec = format_spec(fmt)
    amax = ("none (amax=None: scales from the data)" if not spec.takes_amax
            else "/".join(g for g in GRANULARITIES if g in spec.amax_granularities) + (" global" if spec.block is not None else ""))
    parts = [f"variants {', '.join(spec.variant_names)}", f"amax {amax}"]
    if spec.tiles is not None:
        t2 = spec.tiles.tile({"tile_2d": True}) if spec.option("tile_2d") is not None else None
        parts.append(f"{spec.tiles.scale} scale per 1x{spec.tiles.size}" + (f" or {t2[0]}x{t2[1]} (tile_2d)" if t2 else ""))
    if spec.options:
        parts.append("options " + ", ".join(o.name + (f" [{'/'.join(sorted(o.variants))}]" if o.variants else "") for o in spec.options))
    return f"{fmt}: {spec.doc}; " + "; ".join(parts)


def case_options() -> dict[str, Option]:
    """Every option a case id can carry (those with a ``code``), over the registered formats."""
    return {o.name: o for spec in _REGISTRY.values() for o in spec.options if o.code is not None}


# --- the built-in formats -----------------------------------------------------------------------

_TILE_2D = Option("tile_2d", bool, "square tiles over the last two dims (the 2D weight layout) instead of 1 x size along in-features",
                  code="2d")
register_format(int_format("int8", 8))
register_format(int_format("int4", 4))
register_format(FormatSpec("fp8_e4m3", E4M3_GRID, fp8_e4m3.VARIANTS, fp8_e4m3.DEFAULT_VARIANT, doc="FP8 E4M3 (reference.fp8_e4m3)"))
register_format(FormatSpec(
    "nvfp4", E2M1_GRID, nvfp4.VARIANTS, nvfp4.DEFAULT_VARIANT,
    options=(
        Option("block_size", int, "elements per block along the last dim", code="bs", minimum=1, fuzz_values=(8, 32)),
        Option("block_amax", torch.Tensor, "per-block amax x.shape[:-1] + (n_blocks,)", variants=frozenset({"modelopt_static"})),
        replace(_TILE_2D, variants=frozenset({"te"})),
    ),
    amax_granularities=frozenset({"per_tensor", "per_expert"}),
    block=BlockScaling(NVFP4_BLOCK, E4M3_GRID),
    tiles=TileScaling(NVFP4_BLOCK, NVFP4_BLOCK, "e4m3", size_option="block_size"),
    global_scale_numerator=NVFP4_GLOBAL_SCALE_NUM,
    rejects_nan=frozenset({"modelopt_static"}),
    doc="NVFP4: E2M1 elements, E4M3 block scales, fp32 global scale (reference.nvfp4)",
))
register_format(FormatSpec(
    "mxfp8", E4M3_GRID, mx.MXFP8_VARIANTS, mx.DEFAULT_VARIANT, options=(_TILE_2D,),
    amax_granularities=frozenset({FROM_DATA}), tiles=TileScaling(MX_BLOCK, MX_BLOCK, "e8m0"),
    doc="MXFP8: E4M3 elements, one E8M0 scale per 32 along in-features or per 32x32 tile (reference.mx)",
))
register_format(FormatSpec(
    "mxfp4", E2M1_GRID, mx.MXFP4_VARIANTS, mx.DEFAULT_VARIANT,
    options=(replace(_TILE_2D, variants=frozenset(mx.MXFP4_VARIANTS) - mx.VARIANTS_1D_ONLY["e2m1"]),),
    amax_granularities=frozenset({FROM_DATA}), tiles=TileScaling(MX_BLOCK, MX_BLOCK, "e8m0"),
    doc="MXFP4: E2M1 elements, one E8M0 scale per 32 along in-features or per 32x32 tile (reference.mx)",
))
register_format(FormatSpec(
    "fp8_block", E4M3_GRID, fp8_block.VARIANTS, fp8_block.DEFAULT_VARIANT,
    options=(replace(_TILE_2D, variants=fp8_block.VARIANTS_2D),
             Option("fp32_scale", bool, "fp32 tile scales instead of powers of two", code="fp32s")),
    amax_granularities=frozenset({FROM_DATA}), tiles=TileScaling(FP8_BLOCK, FP8_BLOCK, "fp32 or pow2"),
    doc="FP8 E4M3 block-wise: one scale per 1x128 block or 128x128 tile (reference.fp8_block)",
))
register_format(FormatSpec(
    "int4_group", IntGrid(4), int_group.VARIANTS, int_group.DEFAULT_VARIANT,
    options=(Option("group_size", int, "elements per group along in-features", code="gs", minimum=1, fuzz_values=(32, 64)),),
    amax_granularities=frozenset({FROM_DATA}), tiles=TileScaling(INT4_GROUP, None, "fp32 (7/amax)", size_option="group_size"),
    rejects_nan=int_group.FINITE_ONLY,
    doc="INT4 group-wise: one scale per group (128 by default) along in-features from the group amax (reference.int_group)",
))
_BUILTIN.update(_REGISTRY)
