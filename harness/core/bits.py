"""Raw bit patterns of float tensors: the primitives both the equality policy (``harness.core.equality``)
and the ULP classification (``harness.core.ulp``) build on.

A leaf module: it imports neither of them.  Nothing here is a parity verdict; ``bits_equal`` answers
"same bits?" (determinism and identity questions), ``equality.same_bits`` applies the NaN policy.
"""

from __future__ import annotations

import torch

from .tolerances import NAN_BITS_MODES

BIT_VIEWS: dict[torch.dtype, tuple[torch.dtype, int, int]] = {
    torch.float32: (torch.int32, 8, 0xFFFFFFFF), torch.bfloat16: (torch.int16, 4, 0xFFFF), torch.float16: (torch.int16, 4, 0xFFFF)}
"""Float dtype -> (integer dtype of the same width, hex digits, mask) for bit views."""


def check_nan_bits(nan_bits: str) -> str:
    """``nan_bits`` if it is one of ``NAN_BITS_MODES``, else ``ValueError`` naming the choices."""
    if nan_bits not in NAN_BITS_MODES:
        raise ValueError(f"nan_bits must be one of {NAN_BITS_MODES}, got {nan_bits!r}")
    return nan_bits


def raw_bits(t: torch.Tensor) -> torch.Tensor:
    """The bits of a float tensor as integers of the same width (contiguous); other dtypes as they are."""
    if t.dtype in BIT_VIEWS:
        return t.contiguous().view(BIT_VIEWS[t.dtype][0])
    if t.dtype == torch.float64:
        return t.contiguous().view(torch.int64)
    return t.contiguous()


def is_nan(t: torch.Tensor) -> torch.Tensor:
    """``torch.isnan`` for float tensors; all ``False`` for integer and bool tensors."""
    return torch.isnan(t) if t.is_floating_point() else torch.zeros(t.shape, dtype=torch.bool, device=t.device)


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise equality of the raw bit patterns (``+0 != -0``; NaN only equal to the same NaN bits).

    ``ValueError`` when dtype or shape differ.  For deciding parity use ``equality.same_bits`` (the policy).
    """
    if a.dtype != b.dtype or a.shape != b.shape:
        raise ValueError(f"cannot compare {a.dtype}{tuple(a.shape)} with {b.dtype}{tuple(b.shape)}")
    return raw_bits(a) == raw_bits(b.to(a.device))


def nan_bits_differ(expected: torch.Tensor, got: torch.Tensor) -> torch.Tensor:
    """Where both are NaN but their bits (payload or sign) differ."""
    g = got.to(expected.device)
    return is_nan(expected) & is_nan(g) & ~bits_equal(expected, g)
