"""Run every mutant through a suite's generated cases; report which check killed it, on which case.

Backend mutants (``mutants.build_mutants``) hunt on the generated cases; the state-dict hook
mutants (``hook_mutants.HOOK_MUTANTS``) on the MoE state-dict rows.

A mutant is *killed* when any check fails on any case of the suite (cases in suite order, checks in
``SELFTEST_CHECKS`` order; the first failure is reported).  The unmutated *controls* (built-in
backends) must pass every check on the same cases; otherwise the kills prove nothing.
"""

from __future__ import annotations

import time
from typing import Iterable, Optional, Sequence

from moe_fq_parity.cases import DEFAULT_SEED, Case, make_inputs, parse_case, suite as suite_cases, suite_table
from moe_fq_parity.harness.backends import BackendLoadError, LoadedBackend, load
from moe_fq_parity.harness.checks import CheckContext, expected_forward, run_case_checks
from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S, MUTANT_TIMEOUT_S

from .hook_mutants import HOOK_MUTANTS, run_hook_mutants
from .mutants import Mutant, build_mutants
from .outcomes import ControlOutcome, MutantOutcome, SelftestResult

SELFTEST_CHECKS = ("forward", "backward.pass_through", "backward.clipped", "invariant.layout", "invariant.grouped", "invariant.recalibrate")
CONTROLS_BY_SUITE = suite_table({"smoke": ("reference", "eager-loop"), "ci": ("reference", "eager-loop"), "nightly": ("triton",)},
                                what="selftest controls", partial=True)  # fmt: skip
SUITE_FOR = suite_table({"smoke": "smoke", "ci": "ci", "nightly": "nightly"}, what="selftest suites", partial=True)
"""Selftest suite used for a report suite: each its own (none for ``ultra``); smoke's cases kill
every built-in mutant too."""
SELFTEST_SUITES: tuple[str, ...] = tuple(s.value for s in SUITE_FOR)
"""Suites ``moe-fq-parity selftest --suite`` takes."""


def _loaded(m: Mutant) -> LoadedBackend:
    return LoadedBackend(spec=f"mutant:{m.name}", obj=m, available=True, reason="", device=m.device)


def _applies(m: Mutant, case: Case) -> bool:
    return m.implements(case.fmt, case.variant)


class _InputCache:
    """Inputs and reference results per case id, built once and shared by all mutants."""

    def __init__(self, seed: int):
        self.seed = seed
        self._store: dict[str, tuple] = {}

    def get(self, case: Case):
        if case.id not in self._store:
            inputs = make_inputs(case, self.seed, "cpu")
            self._store[case.id] = (inputs, expected_forward(inputs))
        return self._store[case.id]


def run_mutant(m: Mutant, cases: Sequence[Case], cache: _InputCache, timeout_s: Optional[float] = MUTANT_TIMEOUT_S) -> MutantOutcome:
    """Hunt one mutant down: the first failing (case, check), or a survivor."""
    start, tried = time.perf_counter(), 0
    backend = _loaded(m)
    for case in cases:
        if not _applies(m, case):
            continue
        tried += 1
        inputs, expected = cache.get(case)
        ctx = CheckContext(backend, inputs, cache.seed, "strict", timeout_s)
        for rec in run_case_checks(ctx, SELFTEST_CHECKS, expected):
            if rec.verdict == "fail":
                return MutantOutcome(m.name, m.bug, True, rec.check, case.id, rec.message[:300], tried, time.perf_counter() - start)
    return MutantOutcome(m.name, m.bug, False, "", "", f"survived {tried} cases", tried, time.perf_counter() - start)


def run_control(spec: str | LoadedBackend, cases: Sequence[Case], cache: _InputCache, timeout_s: Optional[float] = CALL_TIMEOUT_S) -> ControlOutcome:
    """An unmutated backend (a name or ``package.module:object``, or one already loaded) over the same
    cases: every check must pass or skip."""
    backend = load(spec) if isinstance(spec, str) else spec
    spec = backend.spec
    if not backend.available:
        return ControlOutcome(spec, False, backend.why_not)
    failures, n = [], 0
    for case in cases:
        inputs, expected = cache.get(case)
        if backend.device != "cpu":
            inputs = make_inputs(case, cache.seed, backend.device)
            expected = expected_forward(inputs)
        recs = run_case_checks(CheckContext(backend, inputs, cache.seed, "strict", timeout_s), SELFTEST_CHECKS, expected)
        n += len(recs)
        failures += [r for r in recs if r.verdict == "fail"]
    return ControlOutcome(spec, True, "", tuple(failures), n)


def run_selftest(suite: str = "ci", seed: int = DEFAULT_SEED, *, mutants: Optional[Iterable[str]] = None,
                 case_ids: Optional[Iterable[str]] = None, controls: Optional[Sequence[str]] = None,
                 progress: bool = False) -> SelftestResult:
    """Run the mutants (all, or those named) and the controls over ``suite``'s cases.

    Every argument is checked before any mutant runs: ``ValueError`` for an unknown mutant, a
    malformed case id or a control backend that cannot be loaded (unknown name, module that does
    not import, object that is not a backend)."""
    if suite not in SELFTEST_SUITES:
        raise ValueError(f"no selftest for suite {suite!r}; choose one of {list(SELFTEST_SUITES)}")
    cases = suite_cases(suite)
    if case_ids:
        cases = tuple(parse_case(c) for c in case_ids)
    chosen = build_mutants()
    hook_names: set[str] | None = None
    if mutants is not None:
        names = set(mutants)
        known = [m.name for m in chosen] + [m.name for m in HOOK_MUTANTS]
        unknown = names - set(known)
        if unknown:
            raise ValueError(f"unknown mutant(s) {sorted(unknown)}; known: {known}")
        chosen = [m for m in chosen if m.name in names]
        hook_names = names
    try:
        loaded = [load(s) for s in (CONTROLS_BY_SUITE.get(suite, ("reference",)) if controls is None else controls)]
    except BackendLoadError as exc:
        raise ValueError(f"--backend: {exc}") from None
    cache = _InputCache(seed)
    outcomes = []
    for m in chosen:
        out = run_mutant(m, cases, cache)
        outcomes.append(out)
        if progress:
            verdict = f"killed by {out.check} on {out.case_id}" if out.killed else "SURVIVED"
            print(f"  {m.name:30} {verdict}  ({out.cases_tried} cases, {out.seconds:.1f} s)", flush=True)
    for out in run_hook_mutants(seed, hook_names):
        outcomes.append(out)
        if progress:
            verdict = f"killed by {out.check}" if out.killed else "SURVIVED"
            print(f"  {out.name:30} {verdict}  ({out.cases_tried} state-dict rows, {out.seconds:.1f} s)", flush=True)
    ctl = tuple(run_control(b, cases, cache) for b in loaded)
    return SelftestResult(suite, seed, tuple(outcomes), ctl)
