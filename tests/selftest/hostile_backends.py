"""Hostile backends for the entry-point tests (loaded as ``package.module:object``)."""

from __future__ import annotations

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


class FirstTileOnly:
    """Right on every expert of up to 4,096 elements; on a larger one only its first 4,096 elements
    are quantized, the rest keep their input values (a kernel that runs one 4,096-element tile per
    expert).  ``ci`` must kill it: its large experts (``cases.catalogue.CI_LARGE``)."""

    name = "first-tile-only"
    formats = set(FORMATS)
    TILE = 4096

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = []
        for w, y in zip(weights, reference.fake_quant_experts(weights, amax, fmt, variant, **options)):
            if w.numel() > self.TILE:
                y = y.clone()
                y.view(-1)[self.TILE:] = w.reshape(-1)[self.TILE:]
            out.append(y)
        return out
