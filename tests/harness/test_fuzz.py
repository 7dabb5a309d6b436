"""Hypothesis fuzzing: generated small cases, every available backend against the reference.

Profiles (``harness.run.hypothesis_profiles``): ``ci`` derandomized and bounded (default), ``nightly`` many
random examples, ``dev``.  A failure prints the reproduce blob, the case id, the seed and the repro.
"""

from __future__ import annotations

import pytest
from hypothesis import given, note

from moe_fq_parity.cases import make_inputs
from moe_fq_parity.cases.strategies import cases
from moe_fq_parity.harness.backends import load
from moe_fq_parity.harness.checks import CheckContext, run_case_checks

pytestmark = pytest.mark.fuzz
SEED = 99


@pytest.mark.parametrize("spec", ["triton", "eager-loop"])
@given(case=cases(max_n=4, max_rows=12, max_cols=40))
def test_backend_matches_reference_on_generated_cases(spec, case):
    lb = load(spec)
    if not lb.available:
        pytest.skip(f"{spec} unavailable: {lb.why_not}")
    ctx = CheckContext(lb, make_inputs(case, SEED, lb.device or "cpu"), SEED)
    recs = run_case_checks(ctx, ["forward", "backward.clipped"])
    for rec in recs:
        note(f"case {case.id} seed {SEED} ({rec.check}): {rec.verdict} {rec.message}\nrepro: {rec.repro}")
        assert rec.verdict != "fail", f"{rec.message}\nrepro: {rec.repro}"
