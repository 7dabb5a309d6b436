"""Format constants and option parsing for the Triton kernels (host side).

The format constants come from ``reference.constants`` (pure torch, the one place they are
defined) and what a format takes from the reference's registry (``reference.formats``); only the
kernel's own declaration of what it implements (``DEFAULT_VARIANTS``), kernel-side codes and dtype
maps are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_fq_parity.reference.constants import (  # noqa: F401  (re-exported for the kernel modules)
    E2M1_MAX,
    E4M3_MAX,
    FLOAT_DTYPES,
    FP8_BLOCK,
    FP32_MAX,
    INT4_GROUP,
    MX_BLOCK,
    NVFP4_BLOCK,
    NVFP4_GLOBAL_SCALE_NUM,
    TINY_AMAX,
    int_bounds,
)
from moe_fq_parity.reference.formats import format_spec

FMT_INT, FMT_FP8, FMT_NVFP4, FMT_INT4G, FMT_FP8B, FMT_FP8B_FP32S, FMT_MXFP8, FMT_MXFP4 = range(8)
"""Kernel-side format codes (constexpr).  From ``FMT_INT4G`` on the scales come from the data (one
per block along the row, no amax: ``FIRST_FROM_DATA``); ``FMT_FP8B_FP32S`` is ``fp8_block`` with
``fp32_scale=True``."""
FIRST_FROM_DATA = FMT_INT4G

_IMPLEMENTED: dict[str, tuple[int, str]] = {
    "int8": (FMT_INT, "cuda"),
    "int4": (FMT_INT, "cuda"),
    "fp8_e4m3": (FMT_FP8, "cuda"),
    "nvfp4": (FMT_NVFP4, "te"),
    "int4_group": (FMT_INT4G, "cuda"),
    "fp8_block": (FMT_FP8B, "te"),
    "mxfp8": (FMT_MXFP8, "floor"),
    "mxfp4": (FMT_MXFP4, "floor"),
}
"""What the kernels implement: format -> (kernel code, the reference variant reproduced bit for bit).
The kernel's own declaration: a format registered in ``reference.formats`` is not implemented
here until it is listed."""

DECLINED: dict[str, str] = {}
"""Registered formats the kernels decline, with the reason (``decline_reason``)."""

OPTION_VALUES: dict[str, tuple] = {"block_size": (NVFP4_BLOCK,)}
"""The values the kernel implements of the registry options where it implements only some
(the others raise ``ValueError``); an option not named here is implemented for every value."""

def decline_reason(fmt: str) -> str:
    """Why the kernels do not implement the registered format ``fmt`` (``""`` when they do)."""
    if fmt in _IMPLEMENTED:
        return ""
    return DECLINED.get(fmt, f"{fmt} is not implemented by the kernels")


DEFAULT_VARIANTS: dict[str, str] = {f: v for f, (_, v) in _IMPLEMENTED.items()}
"""The reference variant each kernel format reproduces bit for bit."""
FORMATS: tuple[str, ...] = tuple(_IMPLEMENTED)
"""The formats the kernels implement."""
AMAX_FORMATS: tuple[str, ...] = tuple(f for f, (code, _) in _IMPLEMENTED.items() if code < FIRST_FROM_DATA)
"""The formats the kernels implement that take an amax (the others' scales come from the data)."""

IO_BF16, IO_FP16, IO_FP32 = 0, 1, 2
IO_CODES: dict[torch.dtype, int] = {torch.bfloat16: IO_BF16, torch.float16: IO_FP16, torch.float32: IO_FP32}
BITS_DTYPE: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
}
"""Integer dtype of the same width: the kernels move raw bits and round with integer ops."""


_BLOCK_OF: dict[int, int] = {FMT_NVFP4: NVFP4_BLOCK, FMT_INT4G: INT4_GROUP, FMT_FP8B: FP8_BLOCK, FMT_FP8B_FP32S: FP8_BLOCK,
                             FMT_MXFP8: MX_BLOCK, FMT_MXFP4: MX_BLOCK}
"""Elements per block along the row of the block-scaled kernel formats."""


@dataclass(frozen=True)
class QuantSpec:
    """A validated format + options, as the kernel launch needs them.

    * ``code``: one of the ``FMT_*`` codes.
    * ``lo``, ``qmax``: INT grid bounds (INT and INT4 group-wise; 0 for the other formats).
    * ``unsigned``: INT only; negative input is an error (checked in-kernel, raised on the host).
    * ``block``: elements per block along the row for block-scaled formats (0: none).
    * ``tile_rows``: rows per block: 1 (``1 x block`` blocks along the row) or ``block`` (the square
      tiles of ``tile_2d=True``).
    """

    fmt: str
    code: int
    lo: float = 0.0
    qmax: float = 0.0
    unsigned: bool = False
    block: int = 0
    tile_rows: int = 1

    @property
    def from_data(self) -> bool:
        """The scales come from the data: the format takes no amax (``amax=None``)."""
        return self.code >= FIRST_FROM_DATA


def parse_spec(fmt: str, variant: str | None, options: dict) -> QuantSpec:
    """Validate ``fmt``/``variant``/``options`` (the reference registry's rules) into a ``QuantSpec``.

    Raises ``ValueError`` for an unknown format, a format or variant the kernels do not implement or
    an NVFP4 block size other than 16; ``TypeError`` for options the implemented
    variant does not take (``block_amax`` included: it belongs to the ``modelopt_static`` variant) or
    of the wrong type.
    """
    spec = format_spec(fmt)
    if fmt not in _IMPLEMENTED:
        raise ValueError(f"the kernels do not implement the format {fmt!r} ({decline_reason(fmt)}); they implement {FORMATS}")
    code, implemented = _IMPLEMENTED[fmt]
    if variant not in (None, "default", implemented):
        raise ValueError(f"the kernel implements only the default variant {implemented!r} of {fmt}, got {variant!r}")
    spec.check_options(implemented, options)
    if code == FMT_INT:
        unsigned = bool(options.get("unsigned", False))
        lo, qmax = spec.grid.bounds(unsigned=unsigned, narrow_range=bool(options.get("narrow_range", False)))
        return QuantSpec(fmt, FMT_INT, lo, qmax, unsigned)
    if code == FMT_FP8:
        return QuantSpec(fmt, FMT_FP8)
    if code == FMT_INT4G:
        lo, qmax = spec.grid.bounds(unsigned=False, narrow_range=False)
        return QuantSpec(fmt, FMT_INT4G, lo, qmax, block=INT4_GROUP)
    if code == FMT_FP8B and options.get("fp32_scale", False):
        code = FMT_FP8B_FP32S
    if code == FMT_NVFP4:
        block = options.get("block_size", NVFP4_BLOCK)
        if block not in OPTION_VALUES["block_size"]:
            raise ValueError(f"the nvfp4 kernel implements block_size={NVFP4_BLOCK} only, got {block!r}")
    block = _BLOCK_OF[code]
    return QuantSpec(fmt, code, block=block, tile_rows=block if options.get("tile_2d", False) else 1)
