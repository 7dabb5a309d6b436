"""State-dict hook mutants: each dies on exactly the row written for it, and only there.

Before those rows existed every one of these mutants passed all state-dict rows (the rows each
kill is the only failing one), so the rows are what closes the gap.  ~2 s on one core.
"""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.sections.selftest import runner
from moe_fq_parity.harness.sections.selftest.hook_mutants import HOOK_MUTANTS, _rows, run_hook_mutants

KILLER = {
    "hook-split-beside-partial-indexed": "state_dict/early_return/grouped_beside_partial_indexed",
    "hook-bias-without-use-bias": "state_dict/early_return/bias_unused",
    "optimizer-split-beside-partial-indexed": "state_dict/optimizer/early_return/grouped_beside_partial_indexed",
    "optimizer-bias-without-use-bias": "state_dict/optimizer/early_return/bias_unused",
}


def test_control_rows_pass():
    rows = _rows(0)
    assert rows and all(r.verdict == "pass" for r in rows), [(r.id, r.message) for r in rows if r.verdict != "pass"]


@pytest.mark.parametrize("mutant", HOOK_MUTANTS, ids=lambda m: m.name)
def test_each_mutant_fails_exactly_its_row(mutant):
    with mutant.applied():
        failed = {r.fields["check"] for r in _rows(0) if r.verdict == "fail"}
    assert failed == {KILLER[mutant.name]}


def test_patches_are_undone():
    before = [(getattr(mod, attr)) for m in HOOK_MUTANTS for mod, attr, _ in m.patches]
    run_hook_mutants(0)
    assert before == [(getattr(mod, attr)) for m in HOOK_MUTANTS for mod, attr, _ in m.patches]


def test_selftest_runs_the_hook_mutants_by_name():
    r = runner.run_selftest("ci", mutants=list(KILLER), controls=())
    assert [(m.name, m.killed, m.check) for m in r.mutants] == [(n, True, c) for n, c in KILLER.items()]
    assert r.ok
