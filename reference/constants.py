"""Format constants, defined once.  Every other module imports them from here.

Which formats exist and what each takes (variants, options, granularities, bits) is the
registry's business: ``reference.formats``.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES: tuple[torch.dtype, ...] = (torch.bfloat16, torch.float16, torch.float32)
"""Accepted input dtypes; the output dtype always equals the input dtype."""

E4M3_MAX = 448.0
"""Largest finite FP8 E4M3 (fn) magnitude: 0x7E = 1.75 * 2**8."""
E4M3_MANTISSA_BITS = 3
E4M3_MIN_NORMAL_EXP = -6
"""Smallest normal exponent of E4M3: 2**-6 = 0.015625; subnormal quantum is 2**-9."""

E2M1_MAX = 6.0
"""Largest FP4 E2M1 magnitude (1.5 * 2**2)."""
E2M1_GRID: tuple[float, ...] = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
"""Non-negative E2M1 code points, code 0..7."""

NVFP4_BLOCK = 16
"""NVFP4 block length along the last dimension."""
NVFP4_GLOBAL_SCALE_NUM = E4M3_MAX * E2M1_MAX
"""2688.0 = 448 * 6: the global encode scale is RN(2688 / global_amax)."""

MX_BLOCK = 32
"""MX (OCP microscaling) block: 32 elements along in-features share one E8M0 scale; 2D: 32x32."""
E8M0_BIAS = 127
"""E8M0 scale code ``c`` (0..254) decodes to ``2**(c - 127)``; code 0 is ``2**-127`` (not zero)."""
E8M0_NAN = 255
"""The E8M0 code of NaN (the spec has no infinity and no zero)."""
FP8_BLOCK = 128
"""FP8 block-wise tiles: 1x128 along in-features, or 128x128."""

INT4_GROUP = 128
"""INT4 group-wise block: 128 elements along in-features share one scale (Model-Optimizer ``int4_per_block``)."""

TINY_AMAX = 2.0**-24
"""5.96e-08.  INT: amax < TINY_AMAX gives an all-zero output.  FP8: amax <= TINY_AMAX is treated as 1."""

FP32_MAX = torch.finfo(torch.float32).max
"""3.4028235e38, the clamp applied to NVFP4 scales that overflow (TE reference)."""


def int_bounds(num_bits: int, *, unsigned: bool, narrow_range: bool) -> tuple[float, float]:
    """Return ``(lo, qmax)`` of the integer grid.

    ``qmax = 2**(b-1) - 1`` signed, ``2**b - 1`` unsigned.  ``lo = 0`` unsigned,
    ``-qmax`` with narrow range, ``-qmax - 1`` otherwise.  The scale always uses qmax.
    """
    if num_bits < 2 or num_bits > 16:
        raise ValueError(f"num_bits must be in [2, 16], got {num_bits}")
    qmax = float(2 ** (num_bits - 1 + int(unsigned)) - 1)
    if unsigned:
        return 0.0, qmax
    return (-qmax if narrow_range else -qmax - 1.0), qmax

