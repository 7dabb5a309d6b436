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
    FP32_MAX,
    NVFP4_BLOCK,
    NVFP4_GLOBAL_SCALE_NUM,
    TINY_AMAX,
    int_bounds,
)
from moe_fq_parity.reference.formats import format_spec

FMT_INT, FMT_FP8, FMT_NVFP4 = 0, 1, 2
"""Kernel-side format codes (constexpr)."""

_IMPLEMENTED: dict[str, tuple[int, str]] = {
    "int8": (FMT_INT, "cuda"),
    "int4": (FMT_INT, "cuda"),
    "fp8_e4m3": (FMT_FP8, "cuda"),
    "nvfp4": (FMT_NVFP4, "te"),
}
"""What the kernels implement: format -> (kernel code, the reference variant reproduced bit for bit).
The kernel's own declaration: a format registered in ``reference.formats`` is not implemented
here until it is listed."""

DECLINED: dict[str, str] = {
    "mxfp8": "MX (E8M0 block scales from the data) is in the reference spec, not yet in the kernel",
    "mxfp4": "MX (E8M0 block scales from the data) is in the reference spec, not yet in the kernel",
    "fp8_block": "FP8 block-wise (1x128 / 128x128 tile scales from the data) is in the reference spec, not yet in the kernel",
    "int4_group": "INT4 group-wise (one scale per 128 from the block amax) is in the reference spec, not yet in the kernel",
}
"""Registered formats the kernels decline, with the reason (``decline_reason``)."""


def decline_reason(fmt: str) -> str:
    """Why the kernels do not implement the registered format ``fmt`` (``""`` when they do)."""
    if fmt in _IMPLEMENTED:
        return ""
    return DECLINED.get(fmt, f"{fmt} is not implemented by the kernels")


DEFAULT_VARIANTS: dict[str, str] = {f: v for f, (_, v) in _IMPLEMENTED.items()}
"""The reference variant each kernel format reproduces bit for bit."""
FORMATS: tuple[str, ...] = tuple(_IMPLEMENTED)
"""The formats the kernels implement."""

IO_BF16, IO_FP16, IO_FP32 = 0, 1, 2
IO_CODES: dict[torch.dtype, int] = {torch.bfloat16: IO_BF16, torch.float16: IO_FP16, torch.float32: IO_FP32}
BITS_DTYPE: dict[torch.dtype, torch.dtype] = {
    torch.bfloat16: torch.int16,
    torch.float16: torch.int16,
    torch.float32: torch.int32,
}
"""Integer dtype of the same width: the kernels move raw bits and round with integer ops."""


@dataclass(frozen=True)
class QuantSpec:
    """A validated format + options, as the kernel launch needs them.

    * ``code``: ``FMT_INT | FMT_FP8 | FMT_NVFP4``.
    * ``lo``, ``qmax``: INT grid bounds (0 for the other formats).
    * ``unsigned``: INT only; negative input is an error (checked in-kernel, raised on the host).
    """

    fmt: str
    code: int
    lo: float = 0.0
    qmax: float = 0.0
    unsigned: bool = False


def parse_spec(fmt: str, variant: str | None, options: dict) -> QuantSpec:
    """Validate ``fmt``/``variant``/``options`` (the reference registry's rules) into a ``QuantSpec``.

    Raises ``ValueError`` for an unknown format, a format or variant the kernels do not implement
    or a block size other than 16, ``TypeError`` for options the implemented variant does not take
    (``block_amax`` included: it belongs to the ``modelopt_static`` variant) or of the wrong type.
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
    if options.get("tile_2d"):
        raise ValueError("the nvfp4 kernel implements 1x16 blocks only, not the 16x16 tiles of tile_2d=True")
    block = options.get("block_size", NVFP4_BLOCK)
    if block != NVFP4_BLOCK:
        raise ValueError(f"the nvfp4 kernel implements block_size={NVFP4_BLOCK} only, got {block!r}")
    return QuantSpec(fmt, FMT_NVFP4)
