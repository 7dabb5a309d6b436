"""Hypothesis profiles for fuzzing: ``ci`` (derandomized, bounded), ``nightly`` (many, random), ``dev``.

Select with ``--hypothesis-profile NAME`` or ``HYPOTHESIS_PROFILE=NAME``; the pytest plugin loads
``ci`` when neither is given.  Every profile prints the reproduce blob on failure.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings

PROFILES = {
    "ci": dict(derandomize=True, max_examples=20, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]),
    "nightly": dict(max_examples=5000, deadline=None, print_blob=True, suppress_health_check=[HealthCheck.too_slow]),
    "dev": dict(max_examples=50, deadline=None, print_blob=True),
}
DEFAULT_PROFILE = "ci"


def register() -> None:
    """Register the profiles (idempotent)."""
    for name, kw in PROFILES.items():
        settings.register_profile(name, **kw)


register()
