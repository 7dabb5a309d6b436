"""Hostile backends for the entry-point tests (loaded as ``package.module:object``)."""

from __future__ import annotations

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


class WrongDevice:
    """Returns correct values on the wrong device (``meta``)."""

    name = "wrong-device"
    formats = set(FORMATS)

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return [o.to("meta") for o in reference.fake_quant_experts(weights, amax, fmt, variant, **options)]


class ReturnsNone:
    name = "returns-none"
    formats = set(FORMATS)

    def fake_quant(self, weights, amax, fmt, **options):
        return None


class ProbeRaises:
    """``available()`` itself raises: the backend is unavailable with that reason, never a pass."""

    name = "probe-raises"
    formats = set(FORMATS)

    def available(self):
        raise RuntimeError("driver not found")

    def fake_quant(self, weights, amax, fmt, **options):
        return reference.fake_quant_experts(weights, amax, fmt, **options)


not_a_backend = 42
