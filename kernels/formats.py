"""Format constants and option parsing for the Triton kernels (host side).

The format constants come from ``reference.constants`` (pure torch, the one place they are
defined); only kernel-side codes and dtype maps are defined here.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_fq_parity.reference.constants import (  # noqa: F401  (re-exported for the kernel modules)
    E2M1_MAX,
    E4M3_MAX,
    FLOAT_DTYPES,
    FORMAT_BITS,
    FORMATS,
    FP32_MAX,
    NVFP4_BLOCK,
    NVFP4_GLOBAL_SCALE_NUM,
    TINY_AMAX,
    int_bounds,
)

DEFAULT_VARIANTS: dict[str, str] = {"int8": "cuda", "int4": "cuda", "fp8_e4m3": "cuda", "nvfp4": "te"}
"""The reference variant each kernel format reproduces bit for bit."""

FMT_INT, FMT_FP8, FMT_NVFP4 = 0, 1, 2
"""Kernel-side format codes (constexpr)."""

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


_OPTIONS: dict[str, frozenset[str]] = {
    "int8": frozenset({"unsigned", "narrow_range"}),
    "int4": frozenset({"unsigned", "narrow_range"}),
    "fp8_e4m3": frozenset(),
    "nvfp4": frozenset({"block_size"}),
}


def parse_spec(fmt: str, variant: str | None, options: dict) -> QuantSpec:
    """Validate ``fmt``/``variant``/``options`` (mirroring ``reference.api``) into a ``QuantSpec``.

    Raises ``ValueError`` for an unknown format, a non-default variant or a block size other than 16,
    ``TypeError`` for options the format does not take (``block_amax`` included: it belongs to the
    ``modelopt_static`` variant, which the kernel does not implement).
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; known: {FORMATS}")
    if variant not in (None, "default", DEFAULT_VARIANTS[fmt]):
        raise ValueError(
            f"the kernel implements only the default variant {DEFAULT_VARIANTS[fmt]!r} of {fmt}, got {variant!r}"
        )
    unknown = set(options) - _OPTIONS[fmt]
    if unknown:
        raise TypeError(f"{fmt} does not take option(s) {sorted(unknown)}; it takes {sorted(_OPTIONS[fmt])}")
    if fmt in FORMAT_BITS:
        unsigned = bool(options.get("unsigned", False))
        lo, qmax = int_bounds(FORMAT_BITS[fmt], unsigned=unsigned, narrow_range=bool(options.get("narrow_range", False)))
        return QuantSpec(fmt, FMT_INT, lo, qmax, unsigned)
    if fmt == "fp8_e4m3":
        return QuantSpec(fmt, FMT_FP8)
    block = options.get("block_size", NVFP4_BLOCK)
    if block != NVFP4_BLOCK:
        raise ValueError(f"the nvfp4 kernel implements block_size={NVFP4_BLOCK} only, got {block!r}")
    return QuantSpec(fmt, FMT_NVFP4)
