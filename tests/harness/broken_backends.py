"""Deliberately wrong backends, loaded through ``package.module:object`` in the harness tests.

Each wraps the reference and breaks one thing, so every failure path of the checks is exercised.
"""

from __future__ import annotations

import time

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS, split_expert_amax


class _Base:
    formats = set(FORMATS)

    def _ref(self, weights, amax, fmt, variant=None, **options):
        return reference.fake_quant_experts(weights, amax, fmt, variant, **options)

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        return reference.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)


class StepVariant(_Base):
    """Computes INT with the ``step`` variant (docs/measured.md §5's one-integer flips) whatever is asked."""

    name = "step-variant"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return self._ref(weights, amax, fmt, "step" if fmt.startswith("int") else variant, **options)


class OneUlpHigh(_Base):
    """Adds one output ULP to every non-zero finite element of the last expert."""

    name = "one-ulp-high"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = self._ref(weights, amax, fmt, variant, **options)
        last = out[-1]
        bumped = torch.nextafter(last, torch.full_like(last, float("inf")))
        out[-1] = torch.where((last != 0) & torch.isfinite(last), bumped, last)
        return out


class Raises(_Base):
    name = "raises"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        raise RuntimeError("kernel exploded")


class WrongDtype(_Base):
    name = "wrong-dtype"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return [o.float() for o in self._ref(weights, amax, fmt, variant, **options)]


class WrongShape(_Base):
    name = "wrong-shape"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return [o.reshape(-1) for o in self._ref(weights, amax, fmt, variant, **options)]


class Nans(_Base):
    """NaN at the first element of every non-empty expert."""

    name = "nans"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = [o.clone() for o in self._ref(weights, amax, fmt, variant, **options)]
        for o in out:
            if o.numel():
                o.view(-1)[0] = float("nan")
        return out


class Sleeps(_Base):
    """Busy-waits in Python far past any sensible per-case timeout."""

    name = "sleeps"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        end = time.monotonic() + 30
        while time.monotonic() < end:
            pass
        return self._ref(weights, amax, fmt, variant, **options)


class ClipExclusive(_Base):
    """Clipped STE with ``|x| < amax`` (exclusive): wrong exactly at ``|x| == amax``."""

    name = "clip-exclusive"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return self._ref(weights, amax, fmt, variant, **options)

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        if mode == "pass_through":
            return list(grads)
        out = []
        for w, a, g in zip(weights, split_expert_amax(weights, amax), grads):
            a = a.reshape(a.shape + (1,) * (w.dim() - a.dim()))
            out.append(torch.where(w.float().abs() < a, g, torch.zeros((), dtype=g.dtype)))
        return out


class GroupedDiffers(_Base):
    """Uses the largest amax of the group for every expert when called with more than one expert."""

    name = "grouped-differs"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        if len(weights) > 1 and amax.dim() == 1:
            amax = torch.full_like(amax, float(amax.max()))
        return self._ref(weights, amax, fmt, variant, **options)


class AcceptsNan(_Base):
    """Returns zeros instead of rejecting NaN input (NVFP4 ``modelopt_static``)."""

    name = "accepts-nan"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return [torch.zeros_like(w) for w in weights]


class NoName:
    """Misses ``name`` and ``formats``: not a backend."""

    def fake_quant(self, weights, amax, fmt, **options):
        return list(weights)


OOM_NUMEL = 1000
"""``OutOfMemoryOnLarge`` runs out of memory on calls over this many elements."""

HELD: list = []
"""Weak references to what ``OutOfMemoryOnLarge`` held when it raised (the tests check they died)."""


class OutOfMemoryOnLarge(_Base):
    """Raises ``torch.OutOfMemoryError`` (as CUDA does) on calls over ``OOM_NUMEL`` elements, after
    allocating a working buffer that only its traceback's frame references; smaller calls are right."""

    name = "oom-on-large"

    def _maybe_oom(self, weights):
        numel = sum(w.numel() for w in weights)
        if numel > OOM_NUMEL:
            import weakref

            workspace = torch.empty(4 * numel, dtype=torch.float32)
            HELD.append(weakref.ref(workspace))
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {8 * numel} bytes (simulated)")

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        self._maybe_oom(weights)
        return self._ref(weights, amax, fmt, variant, **options)

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        self._maybe_oom(weights)
        return super().ste_backward(weights, amax, grads, fmt, mode, **options)
