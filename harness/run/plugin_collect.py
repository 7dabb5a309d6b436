"""The pytest plugin's collection: the parity cases as parameters, the default CPU tier, the GPU
skip of parity tests, and the xdist scheduling of GPU cases by group.

Imported by the plugin once collection starts (it imports torch through the cases).
"""

from __future__ import annotations

from typing import Any, Container, Optional

import pytest
import torch

from moe_fq_parity.cases import marks, suite

from .gpu_lease import shares_gpu
from .plugin_options import ParitySettings, is_parity_test
from .plugin_state import ParitySession
from .shard import assign


def collected_cases(settings: ParitySettings) -> list[tuple[Any, tuple[str, ...]]]:
    """``(case, marks)`` of every parity case the session collects: the suite named, else the nightly
    suite with ``slow`` on every case outside ``ci``."""
    if settings.suite is not None:
        return [(c, marks(c)) for c in suite(settings.suite)]
    ci_ids = {c.id for c in suite("ci")}
    out = []
    for c in suite("nightly"):
        m = set(marks(c))
        if c.id not in ci_ids:
            m.add("slow")
        out.append((c, tuple(sorted(m))))
    return out


def parametrize(metafunc: pytest.Metafunc, settings: ParitySettings) -> None:
    """``parity_case`` over the collected cases (ids: case ids), ``parity_backend`` over the backends."""
    if "parity_case" in metafunc.fixturenames:
        params = [pytest.param(c, id=c.id, marks=[pytest.mark.parity, *(getattr(pytest.mark, m) for m in ms)])
                  for c, ms in collected_cases(settings)]
        metafunc.parametrize("parity_case", params)
    if "parity_backend" in metafunc.fixturenames:
        # function scope keeps the tests case-major (case, then backend, then check): the case's inputs and
        # reference outputs are built once for all backends (a session-scoped backend made pytest run every
        # case once per backend, rebuilding them each time)
        metafunc.parametrize("parity_backend", list(settings.backends), ids=list(settings.backends))


def marker_selection(config: pytest.Config, settings: ParitySettings) -> str:
    """What the markers select of the parity cases, for the session header: ``-m`` evaluated by
    pytest's own expression rules on each case's marks (``parity`` and ``marks``, ``slow`` outside
    ``ci``), or, without ``-m``, the plugin's default (the slow-marked cases deselected unless a suite
    is named).  E.g. ``cases=379 of 1,953 (ci 379 of 379, larger slow-marked nightly 0 of 1,574;
    -m 'not slow')``.  Cost: the marks of the nightly catalogue, about 0.1 s."""
    from _pytest.mark.expression import Expression  # pytest's own -m parser (it has no public one): the header cannot disagree with -m

    expr = config.getoption("markexpr", "") or ""
    compiled = Expression.compile(expr) if expr else None
    cases = collected_cases(settings)

    def kept(ms: tuple[str, ...]) -> bool:
        if compiled is None:
            return settings.suite is not None or "slow" not in ms
        names = {"parity", *ms}
        return compiled.evaluate(lambda name, **kwargs: name in names and not kwargs)

    chosen = [(c, ms) for c, ms in cases if kept(ms)]
    rule = f"-m {expr!r}" if expr else ("no -m" if settings.suite is not None else "no -m: the plugin deselects the slow-marked, -m slow runs them")
    if settings.suite is not None:
        text = f"suite={settings.suite}: {len(chosen):,} of its {len(cases):,} cases ({rule})"
    else:
        ci = {c.id for c in suite("ci")}
        groups = [(f"ci {sum(c.id in ci for c, _ in chosen):,} of {len(ci):,}"),
                  (f"larger slow-marked nightly {sum(c.id not in ci for c, _ in chosen):,} of {len(cases) - len(ci):,}")]
        text = f"cases={len(chosen):,} of {len(cases):,} ({', '.join(groups)}; {rule})"
    gpu = sum("gpu" in ms for _, ms in chosen)
    if gpu and not torch.cuda.is_available():
        text += f"; {gpu:,} of them need a CUDA device (skipped here)"
    return text


def modify_items(config: pytest.Config, items: list[pytest.Item], state: ParitySession) -> None:
    """Deselect the slow parity cases unless ``-m`` or ``--parity-suite`` chose, and the parity tests
    not applicable to their backend (``deselect_not_applicable``); skip the parity tests marked
    ``gpu`` where there is no CUDA device.  Tests that use none of the plugin's fixtures are left as
    they are (another project's ``gpu`` marker means what that project says).  Runs after pytest's
    own ``-m``/``-k`` selection, so the not-applicable count is that of the selected tests."""
    settings = state.settings
    keep, drop = [], []
    explicit = bool(config.getoption("markexpr", "")) or settings.suite is not None
    cuda: Optional[bool] = None
    for item in items:
        if not is_parity_test(item):
            keep.append(item)
            continue
        if "parity_case" in item.fixturenames and not explicit and item.get_closest_marker("slow"):
            drop.append(item)
            continue
        keep.append(item)
    keep, not_applicable = deselect_not_applicable(state, keep)
    for item in keep:
        if is_parity_test(item) and item.get_closest_marker("gpu"):
            cuda = torch.cuda.is_available() if cuda is None else cuda
            if not cuda:
                item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
    if drop or not_applicable:
        config.hook.pytest_deselected(items=drop + not_applicable)
        items[:] = keep


def deselect_not_applicable(state: ParitySession, items: list[pytest.Item]) -> tuple[list[pytest.Item], list[pytest.Item]]:
    """``(kept, not applicable)``: a parity test whose check is not planned for its backend on its case
    (``checks.plan.planned_checks``: outside the formats, variants or option values the backend
    declares) is never a skip; it is deselected and counted in ``state.not_applicable`` (per backend
    and reason: tests, and the cases they belong to), which the terminal summary prints
    in one line and ``--parity-report`` keeps as the report's ``not_applicable``.  A test of the
    user's own (no ``check`` parameter) is deselected only when no check at all is planned (a format
    the backend does not declare); otherwise its check decides when it runs."""
    from moe_fq_parity.harness.backends import BackendLoadError
    from moe_fq_parity.harness.checks.plan import NotApplicable, planned_checks
    from moe_fq_parity.harness.core.records import CHECKS

    from .plugin_checks import loaded_backend

    kept, dropped = [], []
    tally: dict[tuple[str, str, str], int] = {}
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        case, spec, check = params.get("parity_case"), params.get("parity_backend"), params.get("check")
        if case is None or not isinstance(spec, str) or not is_parity_test(item):
            kept.append(item)
            continue
        try:
            backend = loaded_backend(state, spec)
        except BackendLoadError:  # the test itself says so when it runs
            kept.append(item)
            continue
        planned, why = planned_checks(backend, case, [check] if isinstance(check, str) else CHECKS)
        if why is None or planned:
            kept.append(item)
            continue
        dropped.append(item)
        key = (spec, why, case.id)
        tally[key] = tally.get(key, 0) + 1
    counted = NotApplicable()
    for (spec, why, _), n in tally.items():
        counted.add(spec, why, n)
    state.not_applicable = counted.to_json()
    return kept, dropped


def gpu_count() -> int:
    """CUDA devices here (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_case_groups(settings: ParitySettings, gpus: int) -> dict[str, int]:
    """``{case id: GPU group}`` for every parity case of ``settings`` (on a GPU host every parity test
    runs its backends on the GPU).

    The groups are the shards of ``harness.run.shard.assign`` (largest case first onto the group
    with the fewest bytes), so the G groups carry about equal work and every process computes the
    same groups from the same settings.  Taking the cases in catalogue order instead balanced the
    bytes but not the time: one group got the many small cases, and ``-n 2`` ran at the speed of
    that group (docs/measured.md §13).
    """
    cases = [case for case, _ in collected_cases(settings)]
    return {case.id: group - 1 for case, group in zip(cases, assign(cases, max(gpus, 1)))}


def case_id_of_nodeid(nodeid: str, ids: Container[str]) -> Optional[str]:
    """The parity case id inside a test id's ``[...]`` parameters (joined by ``-``), or ``None``."""
    lo, hi = nodeid.find("["), nodeid.rfind("]")
    if lo < 0 or hi < lo:
        return None
    parts = nodeid[lo + 1:hi].split("-")
    for i in range(len(parts)):
        for j in range(len(parts), i, -1):
            if "-".join(parts[i:j]) in ids:
                return "-".join(parts[i:j])
    return None


def gpu_group_scheduler(config: pytest.Config, log: Any, settings: ParitySettings, gpus: int) -> Any:
    """A ``loadscope`` xdist scheduler whose scopes are the GPU groups of the cases that hold a GPU alone
    (``gpu_case_groups``: one per GPU, all tests of a case in one), one scope per case that shares a
    GPU (``shares_gpu``: its tests on one worker, the cases spread over the workers), and every other
    test alone.  xdist hands out the largest scopes (the GPU groups) first."""
    from xdist.scheduler import LoadScopeScheduling  # deferred: pytest-xdist is optional (the test extra)

    groups = gpu_case_groups(settings, gpus)
    shared = {case.id for case, _ in collected_cases(settings) if shares_gpu(case, settings.gpu_share_mib)}

    class GpuGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            case = case_id_of_nodeid(nodeid, groups)
            if case is None:
                return nodeid
            return f"parity-case-{case}" if case in shared else f"parity-gpu{groups[case]}"

    return GpuGroupScheduling(config, log)
