"""All acceptance thresholds, in one place.  Default: 0 ULP."""

from __future__ import annotations

VERDICT_MODES = ("strict", "1-ulp")
"""``strict``: every element bit-equal (up to ±0 equality and canonical NaN); our own kernel.
``1-ulp``: the upstream acceptance, every element within 1 output-dtype ULP; tie flips are
still counted and reported separately, never absorbed by this tolerance."""

MAX_ULP: dict[str, int] = {"strict": 0, "1-ulp": 1}

TIE_WINDOW_FP32_ULPS = 4
"""A mismatch is a *tie flip* when the reference's pre-rounding value lies within this many
fp32 ulps of a rounding boundary of the format's grid (docs/measured.md §2: a one-ulp scale difference
moves ``x*s`` across a tie)."""

SLOWDOWN_THRESHOLD = 0.10
"""``compare``: a case whose time grew by more than 10% against the baseline is a regression."""
