"""Backends for the pytest plugin's usage tests (loaded as ``tests.harness.plugin_backends:NAME``).

Each is the reference itself (so a run that reaches the checks passes) apart from one way it cannot
run here or breaks the test around its check.
"""

from __future__ import annotations

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


class _Reference:
    name = "plugin-test"
    formats = set(FORMATS)

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return reference.fake_quant_experts(weights, amax, fmt, variant, **options)


class Unavailable(_Reference):
    """``available()`` says no."""

    def available(self):
        return False, "the vendor library is not installed"


class AvailableRaises(_Reference):
    """``available()`` raises."""

    def available(self):
        raise RuntimeError("probe exploded")


class OnCuda(_Reference):
    """Runs on ``cuda``: unavailable on a host without a GPU."""

    device = "cuda"


class OnMeta(_Reference):
    """Runs on the ``meta`` device: available, but building a case's inputs there raises, so the
    parity test fails in pytest before its check records a verdict."""

    device = "meta"


Reference = _Reference
"""Correct: every check passes."""
INSTANCE = _Reference()
"""An instance: used as it is."""


def make_reference() -> _Reference:
    """A function taking no argument: called once to build the backend."""
    return _Reference()
