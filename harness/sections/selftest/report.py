"""Selftest outcome as text, JSON and a report section."""

from __future__ import annotations

from typing import Any

from moe_fq_parity.harness.sections import Section, SectionRow

from .outcomes import SelftestResult
from .runner import SUITE_FOR, run_selftest


def print_outcome(r: SelftestResult) -> None:
    killed = sum(m.killed for m in r.mutants)
    print(f"selftest suite={r.suite} seed={r.seed}: {killed}/{len(r.mutants)} mutants killed")
    for m in r.mutants:
        if not m.killed:
            print(f"  SURVIVED {m.name}: {m.bug} ({m.message}); rerun: {m.repro(r.suite, r.seed)}")
    for c in r.controls:
        if not c.available:
            print(f"  control {c.backend}: unavailable ({c.reason})")
        elif c.failures:
            f = c.failures[0]
            print(f"  control {c.backend} FAILED {len(c.failures)} checks, first {f.check} on {f.case_id}: {f.message[:200]}; rerun: {f.repro}")
        else:
            print(f"  control {c.backend}: {c.records} checks, none failed")
    print("selftest " + ("passed" if r.ok else "FAILED"))


def to_json(r: SelftestResult) -> dict[str, Any]:
    return {
        "suite": r.suite, "seed": r.seed, "ok": r.ok,
        "mutants": [m.__dict__ | {"repro": m.repro(r.suite, r.seed)} for m in r.mutants],
        "controls": [{"backend": c.backend, "available": c.available, "reason": c.reason, "checks": c.records,
                      "failures": [f.to_json() for f in c.failures[:20]]} for c in r.controls],
    }


def section_of(r: SelftestResult, extra_rows: list[SectionRow] | None = None) -> Section:
    rows = [SectionRow(id=f"mutant/{m.name}", verdict="pass" if m.killed else "fail",
                       fields={"bug": m.bug, "killed_by": m.check or "-", "case": m.case_id or "-", "cases_tried": m.cases_tried,
                               "seconds": round(m.seconds, 2)},
                       repro=m.repro(r.suite, r.seed), message=m.message)
            for m in r.mutants]
    for c in r.controls:
        verdict = "skip" if not c.available else ("fail" if c.failures else "pass")
        first = c.failures[0] if c.failures else None
        rows.append(SectionRow(id=f"control/{c.backend}", verdict=verdict,
                               fields={"bug": "(unmutated)", "killed_by": first.check if first else "-", "case": first.case_id if first else "-",
                                       "cases_tried": c.records, "seconds": ""},
                               repro=first.repro if first else "", message=c.reason or (first.message[:300] if first else "")))
    rows += extra_rows or []
    return Section("selftest", "Self-test: mutants every check must catch", ["bug", "killed_by", "case", "cases_tried", "seconds"], rows,
                   notes=f"suite {r.suite}, seed {r.seed}; a mutant passes this table when some check kills it on a generated case")


def run(suite: str, seed: int, device: str) -> Section:
    """Report section runner (``harness.sections.SECTION_RUNNERS``)."""
    st_suite = SUITE_FOR.get(suite)
    if st_suite is None:
        return Section("selftest", "Self-test: mutants every check must catch", ["bug"],
                       [SectionRow(id="selftest", verdict="skip", message=f"no selftest for suite {suite!r}")])
    if st_suite == "nightly":
        # In the nightly report the unmutated backends' own records (this same report) are the control.
        sec = section_of(run_selftest(st_suite, seed, controls=()))
        return Section(sec.name, sec.title, sec.columns, sec.rows, sec.notes + "; control: the report's own records of the unmutated backends")
    return section_of(run_selftest(st_suite, seed))
