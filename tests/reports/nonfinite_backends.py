"""A backend that is wrong exactly where the input is not finite (loaded by spec in the strict-JSON tests)."""

from __future__ import annotations

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


class ZeroAtNonFinite:
    """The reference everywhere except at NaN/±inf inputs, where it returns +0: every offender of
    a failing record then has a non-finite input (and mostly a non-finite expected value)."""

    name = "zero-at-nonfinite"
    formats = set(FORMATS)

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = reference.fake_quant_experts(weights, amax, fmt, variant, **options)
        return [torch.where(torch.isfinite(w), o, torch.zeros_like(o)) for w, o in zip(weights, out)]

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        return reference.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)


zero_at_nonfinite = ZeroAtNonFinite()
