"""The default tier's interpreted Triton parity cases (``tests.tiers.interpreted_cases``): every smoke
case, and every ``(format, variant, options, granularity, layout)`` of the ``ci`` suite keeps at
least one case, so moving the others to ``slow`` leaves no variant of the kernel uninterpreted."""

from __future__ import annotations

from tests.tiers import interpreted_cases
from moe_fq_parity.cases import suite


def _key(case) -> tuple:
    return case.fmt, case.variant, case.options, case.granularity, case.layout


def test_smoke_cases_and_one_case_of_every_ci_combination_are_kept():
    kept = interpreted_cases()
    ci = suite("ci")
    assert {c.id for c in suite("smoke")} <= kept <= {c.id for c in ci}
    assert {_key(c) for c in ci} == {_key(c) for c in ci if c.id in kept}
    assert len(kept) < len(ci)  # the rule moves something, else it is not a tier
