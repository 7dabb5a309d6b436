"""Hostile backends for the run-lifecycle tests (loaded as ``tests.harness.hostile_backends:NAME``).

Each meets the contract on paper and misbehaves in one way a real backend could.
"""

from __future__ import annotations

import time

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


class _Reference:
    name = "hostile"
    formats = set(FORMATS)

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return reference.fake_quant_experts(weights, amax, fmt, variant, **options)

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        return reference.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)


class DeclaresThenDeclines(_Reference):
    """Lists nvfp4 in ``formats`` but raises ``NotImplementedError`` for it."""

    name = "declares-then-declines"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        if fmt == "nvfp4":
            raise NotImplementedError("nvfp4 later")
        return super().fake_quant(weights, amax, fmt, variant, **options)


class WritesIntoWeights(_Reference):
    """Right outputs, also written into the input weights (``w.copy_(out)``)."""

    name = "writes-into-weights"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = super().fake_quant(weights, amax, fmt, variant, **options)
        with torch.no_grad():
            for w, y in zip(weights, out):
                w.copy_(y)
        return out


class HalvesAmax(_Reference):
    """Quantizes with the amax it is given, then halves it in place (state that leaks across checks)."""

    name = "halves-amax"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = super().fake_quant(weights, amax, fmt, variant, **options)
        amax.mul_(0.5)
        return out

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        out = super().ste_backward(weights, amax, grads, fmt, mode)
        amax.mul_(0.5)
        return out


class RetriesForever(_Reference):
    """Swallows every ``Exception`` and retries: a timeout must still end the call."""

    name = "retries-forever"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        while True:
            try:
                time.sleep(0.05)
            except Exception:  # noqa: BLE001 - the point of this backend
                continue


class Slow(_Reference):
    """Correct, 0.3 s per call (a run long enough to be signalled mid-way)."""

    name = "slow"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        time.sleep(0.3)
        return super().fake_quant(weights, amax, fmt, variant, **options)


class NoCuda(_Reference):
    name = "no-cuda"
    device = "cuda"


class BogusDevice(_Reference):
    name = "bogus-device"
    device = "warp-drive:7"


declares_then_declines = DeclaresThenDeclines()
writes_into_weights = WritesIntoWeights()
halves_amax = HalvesAmax()
retries_forever = RetriesForever()
slow = Slow()
no_cuda = NoCuda()
bogus_device = BogusDevice()
