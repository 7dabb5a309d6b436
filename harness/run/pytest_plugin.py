"""pytest plugin: the parity checks as parametrized tests, and ``--parity-report DIR``.

Installing the ``moe-fq-parity`` distribution registers this module through its ``pytest11`` entry
point: in any project, the options, markers and fixtures below are there with no configuration.
To check your own kernel (a backend object meeting ``harness.core.contract``):

* no line of code: ``python -m pytest --pyargs moe_fq_parity.harness.run.parity_test --parity-backend pkg.mod:obj``;
* one line, in one of your test files: ``from moe_fq_parity.harness.run.parity_test import test_parity  # noqa: F401``,
  then ``python -m pytest --parity-backend pkg.mod:obj [--parity-suite smoke] [--parity-report DIR]``.

A failing check fails its test with the offender table (first mismatching elements: where, input,
expected, got, ULP, class) and the one-line ``moe-fq-parity run ...`` command that reruns it.

Options (group ``parity``; each also from the environment ``PARITY_*``): ``--parity-backend``
(name or ``pkg.mod:obj``, repeatable), ``--parity-suite``, ``--parity-report DIR``,
``--parity-seed``, ``--parity-mode``, ``--parity-timeout``.  Markers: ``parity`` (set on every
parity test), ``slow``, ``gpu``, ``fuzz``, ``dist``.  Fixtures: ``parity_case``, ``parity_backend``,
``parity_loaded_backend``, ``parity_check``, ``parity_record``, ``parity_settings``.

* Tests that take the ``parity_case`` fixture are parametrized over the catalogue with case ids as
  test ids; ``parity_backend`` over the backends.  Cases outside the ``ci`` suite carry ``slow`` (and
  large ones ``gpu``); with no ``-m`` expression and no ``--parity-suite``, slow parity cases are
  deselected, so ``pytest`` stays the CPU tier and ``pytest -m slow`` runs the large cases.
* ``parity_check(name)`` runs one check (``harness.records.CHECKS``) and records its ``CheckRecord``;
  ``--parity-report DIR`` writes every record to ``DIR/report.json`` and ``DIR/report.html``, also
  under ``pytest -n auto`` (xdist workers send their records to the controller).
* GPU tests (marked ``gpu`` or ``slow``) lease a GPU for their whole run (``harness.run.gpu_lease``):
  one GPU test per GPU at a time, however many xdist workers; the others run CPU tests meanwhile.
* One worker per GPU under xdist: on a host with G >= 1 GPUs, ``-n N`` (``-n auto``) with xdist's
  default ``--dist load`` is scheduled by scopes (``pytest_xdist_make_scheduler``): the parity
  cases are split into G groups balanced by bytes (largest case first, as the shards of a sharded
  run), all tests of one case in one group; each group runs on one worker, in order, on its own GPU (the lease prefers it), so a case's
  tensors are built once and at most G workers hold GPU cases, while the other workers run every
  other test.  An explicit other ``--dist`` mode is kept (the leases alone then keep one GPU test
  per GPU).  Each worker caps PyTorch's threads at its share of the CPUs
  (``harness.core.processes.share_cpus``): workers with a thread per CPU each spin against each other.
* Memory: a case's tensors (inputs and reference outputs) are shared by the consecutive tests of
  that case and dropped at the teardown of the last one (``nextitem`` is another case), so nothing
  that outlives the case's tests holds it; each record carries the check's peak CUDA memory.
* Settings are resolved once (command line > environment ``PARITY_*`` > default) into a frozen
  ``ParitySettings`` in ``config.stash``; the seed is printed in the report header.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Container, Optional

import pytest

from . import hypothesis_profiles
from moe_fq_parity.harness.core.triton_env import prepare

prepare()
from moe_fq_parity.harness.core.equality import DEFAULT_NAN_BITS, NAN_BITS_MODES
from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S, VERDICT_MODES

ENV_PREFIX = "PARITY_"
MARKERS = {
    "parity": "a parity check of a backend against the reference (set by the plugin on tests using parity_case)",
    "slow": "large shapes (Ultra, N=128) and long runs",
    "gpu": "needs a CUDA device; skipped with a reason without one",
    "fuzz": "Hypothesis fuzzing (profile via --hypothesis-profile / HYPOTHESIS_PROFILE)",
    "dist": "spawns several processes",
}


@dataclass(frozen=True)
class ParitySettings:
    """Resolved plugin settings (see the module docstring)."""

    report_dir: Optional[Path]
    seed: int
    suite: Optional[str]
    backends: tuple[str, ...]
    mode: str
    timeout_s: Optional[float]
    hypothesis_profile: str
    nan_bits: str = DEFAULT_NAN_BITS


SETTINGS = pytest.StashKey[ParitySettings]()
RECORDS = pytest.StashKey[list]()
WRITER = pytest.StashKey[Any]()
GPU_GROUPS = pytest.StashKey[int]()
"""xdist controller: the number of GPU groups scheduled (0 or absent: xdist's own scheduling)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("parity", "MoE fake-quant parity harness")
    g.addoption("--parity-report", metavar="DIR", default=None, help="write every parity check record to DIR/report.json and DIR/report.html")
    g.addoption("--parity-seed", type=int, default=None, help="global seed (env PARITY_SEED; default cases.DEFAULT_SEED)")
    g.addoption("--parity-suite", default=None, help="collect exactly this suite (env PARITY_SUITE); default: ci plus slow-marked larger cases")
    g.addoption("--parity-backend", action="append", default=None, help="backend spec (repeatable; env PARITY_BACKENDS comma-separated; default: all built-ins)")
    g.addoption("--parity-mode", choices=VERDICT_MODES, default=None, help="forward verdict mode (env PARITY_MODE; default strict)")
    g.addoption("--parity-timeout", type=float, default=None, help=f"per backend call timeout, s (env PARITY_TIMEOUT; default {CALL_TIMEOUT_S:g}; 0: none)")
    g.addoption("--parity-nan-bits", choices=NAN_BITS_MODES, default=None,
                help="NaN payload/sign policy (env PARITY_NAN_BITS; default any: not compared; strict: counted as class nan_bits)")


def _resolve(config: pytest.Config) -> ParitySettings:
    from moe_fq_parity.cases import DEFAULT_SEED, SUITE_NAMES

    def pick(opt: str, env: str, default: Any, cast: Callable[[str], Any] = str) -> Any:
        value = config.getoption(opt)
        if value is not None:
            return value
        if os.environ.get(ENV_PREFIX + env):
            return cast(os.environ[ENV_PREFIX + env])
        return default

    suite = pick("parity_suite", "SUITE", None)
    if suite is not None and suite not in SUITE_NAMES:
        raise pytest.UsageError(f"--parity-suite {suite!r}: known suites are {list(SUITE_NAMES)}")
    try:
        timeout = float(pick("parity_timeout", "TIMEOUT", CALL_TIMEOUT_S, float))
    except ValueError as exc:
        raise pytest.UsageError(f"--parity-timeout / PARITY_TIMEOUT: expected seconds as a number, {exc}") from None
    if not timeout >= 0:
        raise pytest.UsageError(f"--parity-timeout / PARITY_TIMEOUT: expected seconds >= 0 (0: none), got {timeout:g}")
    nan_bits = pick("parity_nan_bits", "NAN_BITS", DEFAULT_NAN_BITS)
    if nan_bits not in NAN_BITS_MODES:
        raise pytest.UsageError(f"--parity-nan-bits / PARITY_NAN_BITS: expected one of {list(NAN_BITS_MODES)}, got {nan_bits!r}")
    backends = pick("parity_backend", "BACKENDS", None, lambda s: [b for b in s.split(",") if b])
    from moe_fq_parity.harness.backends import BUILTINS

    report = pick("parity_report", "REPORT", None)
    profile = config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or hypothesis_profiles.DEFAULT_PROFILE
    return ParitySettings(
        report_dir=Path(report) if report else None,
        seed=int(pick("parity_seed", "SEED", DEFAULT_SEED, int)),
        suite=suite,
        backends=tuple(backends) if backends else tuple(BUILTINS),
        mode=pick("parity_mode", "MODE", "strict"),
        timeout_s=timeout or None,
        hypothesis_profile=profile,
        nan_bits=nan_bits,
    )


def _worker_index() -> Optional[int]:
    """xdist worker number (``gw3`` -> 3), ``None`` outside a worker."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else None


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    settings = _resolve(config)
    config.stash[SETTINGS] = settings
    config.stash[RECORDS] = []
    from hypothesis import settings as hsettings

    if not config.getoption("hypothesis_profile", None):
        hsettings.load_profile(settings.hypothesis_profile)
    if hasattr(config, "workerinput"):  # xdist worker: its share of the CPUs for PyTorch's threads
        from moe_fq_parity.harness.core.processes import share_cpus

        share_cpus(int(config.workerinput.get("workercount", 1)))
    if settings.report_dir is not None and not hasattr(config, "workerinput"):
        config.stash[WRITER] = _new_writer(config, settings)
    if not hasattr(config, "workerinput") and getattr(config.option, "dist", "no") == "load" and _gpu_count() > 0:
        config.stash[GPU_GROUPS] = _gpu_count()  # xdist's default for -n: schedule the GPU groups (module docstring)


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def gpu_case_groups(settings: ParitySettings, gpus: int) -> dict[str, int]:
    """``{case id: GPU group}`` for every parity case of ``settings`` (on a GPU host every parity test
    runs its backends on the GPU).

    The groups are the shards of ``harness.run.shard.assign`` (largest case first onto the group
    with the fewest bytes), so the G groups carry about equal work and every process computes the
    same groups from the same settings.  Taking the cases in catalogue order instead balanced the
    bytes but not the time: on the two-GPU H100 host one group got the many small cases (10,260 of
    the 14,454 slow parity tests; 128 s of serial test time against 73 s), and ``-n 2`` ran at the
    speed of that group.
    """
    from .shard import assign

    cases = [case for case, _ in _collected_cases(settings)]
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


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> Any:
    """xdist controller, ``-n N`` with the default ``--dist load`` on a GPU host: a ``loadscope``
    scheduler whose scopes are the GPU groups (``gpu_case_groups``: one per GPU, all tests of a case
    in one) and every other test alone."""
    gpus = config.stash.get(GPU_GROUPS, 0)
    if not gpus:
        return None
    from xdist.scheduler import LoadScopeScheduling

    groups = gpu_case_groups(config.stash[SETTINGS], gpus)

    class GpuGroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            case = case_id_of_nodeid(nodeid, groups)
            return nodeid if case is None else f"parity-gpu{groups[case]}"

    return GpuGroupScheduling(config, log)


def pytest_report_header(config: pytest.Config) -> str:
    s = config.stash[SETTINGS]
    groups = config.stash.get(GPU_GROUPS, 0)
    return (f"parity: seed={s.seed} suite={s.suite or 'ci (+slow-marked larger cases)'} backends={','.join(s.backends)} "
            f"mode={s.mode} hypothesis-profile={s.hypothesis_profile}" + (f" report={s.report_dir}" if s.report_dir else "")
            + (f"\nparity: xdist scheduling: GPU parity cases in {groups} group(s), one worker per GPU" if groups else ""))


def _collected_cases(settings: ParitySettings) -> list[tuple[Any, tuple[str, ...]]]:
    from moe_fq_parity.cases import marks, suite

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


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    settings = metafunc.config.stash[SETTINGS]
    if "parity_case" in metafunc.fixturenames:
        params = [pytest.param(c, id=c.id, marks=[pytest.mark.parity, *(getattr(pytest.mark, m) for m in ms)])
                  for c, ms in _collected_cases(settings)]
        metafunc.parametrize("parity_case", params)
    if "parity_backend" in metafunc.fixturenames:
        # function scope keeps the tests case-major (case, then backend, then check): the case's inputs and
        # reference outputs are built once for all backends (a session-scoped backend made pytest run every
        # case once per backend, rebuilding them each time)
        metafunc.parametrize("parity_backend", list(settings.backends), ids=list(settings.backends))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    settings = config.stash[SETTINGS]
    import torch

    keep, drop = [], []
    explicit = bool(config.getoption("markexpr", "")) or settings.suite is not None
    for item in items:
        is_parity = "parity_case" in getattr(item, "fixturenames", ())
        if is_parity and not explicit and item.get_closest_marker("slow"):
            drop.append(item)
            continue
        if item.get_closest_marker("gpu") and not torch.cuda.is_available():
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))
        keep.append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep



@pytest.fixture(scope="session")
def parity_settings(request: pytest.FixtureRequest) -> ParitySettings:
    """The resolved ``ParitySettings``."""
    return request.config.stash[SETTINGS]


_LOADED: dict[str, Any] = {}


@pytest.fixture
def parity_loaded_backend(parity_backend: str):
    """The ``LoadedBackend`` of ``parity_backend``; skips (with the reason) when unavailable here."""
    from moe_fq_parity.harness.backends import load

    if parity_backend not in _LOADED:
        _LOADED[parity_backend] = load(parity_backend)
    lb = _LOADED[parity_backend]
    if not lb.available:
        pytest.skip(f"backend {parity_backend} unavailable: {lb.why_not}")
    return lb


@pytest.fixture
def parity_record(request: pytest.FixtureRequest) -> Callable[[Any], None]:
    """``parity_record(record)`` adds a ``CheckRecord`` to the session's report."""

    def add(rec) -> None:
        data = rec.to_json()
        request.config.stash[RECORDS].append(data)
        writer = request.config.stash.get(WRITER, None)
        if writer is not None:
            writer.add([data])

    return add


@dataclass
class _CaseTensors:
    """The tensors of the case under test: inputs, reference outputs, and the CUDA bytes before them."""

    key: tuple
    inputs: Any
    expected: Any
    mem_base: Optional[int]
    device_bytes: int = 0
    """CUDA bytes the inputs and reference outputs hold (0 off CUDA)."""


_CURRENT: list[_CaseTensors] = []
"""At most one entry: the case of the running test (see ``pytest_runtest_teardown``)."""


def _device_key(device: str) -> tuple[str, Optional[int]]:
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return dev.type, torch.cuda.current_device()
    return dev.type, dev.index


def _case_tensors(case, seed: int, device: str) -> _CaseTensors:
    """Inputs and reference outputs of a case, shared by the consecutive checks of that case."""
    from moe_fq_parity.cases import make_inputs

    from moe_fq_parity.harness.checks import expected_forward
    from moe_fq_parity.harness.core.memory import allocated

    key = (case.id, seed, _device_key(device))
    if _CURRENT and _CURRENT[0].key == key:
        return _CURRENT[0]
    _drop_case_tensors()
    import torch

    base = allocated(torch.device(device))
    inputs = make_inputs(case, seed, device)
    expected = expected_forward(inputs)
    after = allocated(torch.device(device))
    _CURRENT.append(_CaseTensors(key, inputs, expected, base, (after - base) if after is not None and base is not None else 0))
    return _CURRENT[0]


def _current_bytes() -> int:
    return _CURRENT[0].device_bytes if _CURRENT else 0


def _drop_case_tensors() -> None:
    """Drop the current case's tensors (freed by reference counting; ``tidy`` on the lease's release
    collects cycles only when memory stays allocated)."""
    if _CURRENT:
        del _CURRENT[0]


def _parity_case_of(item: Optional[pytest.Item]) -> Any:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("parity_case") if callspec is not None else None


def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """Drop the case's tensors unless the next test checks the same case."""
    if _CURRENT and (nextitem is None or _parity_case_of(nextitem) != _parity_case_of(item)):
        _drop_case_tensors()


def _needs_gpu_lease(item: pytest.Item) -> bool:
    if not (item.get_closest_marker("gpu") or item.get_closest_marker("slow")):
        return False
    try:
        from _pytest.skipping import evaluate_skip_marks

        if evaluate_skip_marks(item) is not None:
            return False
    except Exception:  # noqa: BLE001 - pytest internals moved or a skipif condition failed: lease to be safe
        pass
    import torch

    return torch.cuda.is_available()


_GROUPS: dict[str, int] = {}


def _preferred_gpu(item: pytest.Item) -> int:
    """The GPU a test's lease tries first: its case's GPU group (``gpu_case_groups``), else the
    xdist worker's number."""
    case = _parity_case_of(item)
    if case is not None:
        if not _GROUPS:
            _GROUPS.update(gpu_case_groups(item.config.stash[SETTINGS], _gpu_count()))
        if case.id in _GROUPS:
            return _GROUPS[case.id]
    return _worker_index() or 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]):
    """Hold a GPU lease around a GPU test's setup, call and teardown (``harness.run.gpu_lease``)."""
    lease = None
    if _needs_gpu_lease(item):
        from .gpu_lease import acquire

        lease = acquire(all_devices=bool(item.get_closest_marker("dist")), prefer=_preferred_gpu(item))
        from moe_fq_parity.harness.core.memory import allocated_here

        before = allocated_here() - _current_bytes()  # what the process held apart from the case cache
    try:
        yield
    finally:
        if lease is not None:
            lease.release(keep_bytes=max(0, before) + _current_bytes())


@pytest.fixture
def parity_check(parity_case, parity_loaded_backend, parity_settings, parity_record) -> Callable[[str], Any]:
    """``parity_check(name)`` runs one check on this case and backend, records and returns its record."""
    from moe_fq_parity.harness.checks import CheckContext, case_oom_record, run_case_checks
    from moe_fq_parity.harness.core.memory import OOM_ERRORS, case_bytes, forget, release

    def run(name: str):
        from moe_fq_parity.harness.checks.plan import LABEL, planned_checks

        if not (plan := planned_checks(parity_loaded_backend, parity_case, [name]))[0]:
            pytest.skip(f"{LABEL}: {plan[1]}")  # no record: outside what the backend declares
        device = parity_loaded_backend.device or "cpu"
        detail = None
        try:
            tensors = _case_tensors(parity_case, parity_settings.seed, device)
        except OOM_ERRORS as exc:
            detail = f"{type(exc).__name__}: {exc}"
            forget(exc)
        if detail is not None:
            _drop_case_tensors()
            release()
            rec = case_oom_record(parity_case, parity_loaded_backend.spec, name, parity_settings.seed, parity_settings.mode,
                                  case_bytes(parity_case), device, "building the case inputs and reference outputs", detail)
            parity_record(rec)
            return rec
        ctx = CheckContext(parity_loaded_backend, tensors.inputs, parity_settings.seed, parity_settings.mode, parity_settings.timeout_s,
                           mem_base=tensors.mem_base, nan_bits=parity_settings.nan_bits)
        recs = [r for r in run_case_checks(ctx, [name], tensors.expected) if r.check == name]
        for r in recs:
            parity_record(r)
        return recs[0]

    return run


OFFENDER_COLUMNS = ("expert", "row", "col", "input", "expected", "got", "pre_round", "ulp", "cls")


def offender_table(offenders, limit: int = 10) -> list[str]:
    """The first ``limit`` offenders as aligned text rows under a header (values as Python reprs,
    so a bf16 value prints exactly)."""
    rows = [OFFENDER_COLUMNS] + [tuple("-" if getattr(o, c) is None else repr(getattr(o, c)) if isinstance(getattr(o, c), float)
                                       else str(getattr(o, c)) for c in OFFENDER_COLUMNS) for o in list(offenders)[:limit]]
    widths = [max(len(r[k]) for r in rows) for k in range(len(OFFENDER_COLUMNS))]
    return ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]


def assert_record(rec) -> None:
    """Skip on a ``skip`` record; fail on a ``fail`` record with its message, the offender table
    and the repro command."""
    if rec.verdict == "skip":
        pytest.skip(rec.message)
    if rec.outcome == "oom":
        pytest.fail(f"{rec.check} ran out of memory for {rec.case_id} on {rec.backend}: {rec.message}\n  repro: {rec.repro}", pytrace=False)
    if rec.verdict == "fail":
        lines = [f"{rec.check} failed for {rec.case_id} on {rec.backend}: {rec.message}"]
        if rec.offenders:
            lines.append(f"first {min(len(rec.offenders), 10)} offenders:")
            lines += ["  " + ln for ln in offender_table(rec.offenders)]
        lines.append(f"repro: {rec.repro}")
        pytest.fail("\n".join(lines), pytrace=False)


def _new_writer(config: pytest.Config, settings: ParitySettings):
    import torch

    from moe_fq_parity.reports.writer import ReportWriter, now_iso

    from moe_fq_parity.harness.core.meta import run_meta

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = run_meta(device) | {
        "copy_gbps": None, "suite": settings.suite or "ci", "formats": [], "checks": [], "seed": settings.seed, "mode": settings.mode, "nan_bits": settings.nan_bits,
        "backends": [], "started": now_iso(), "finished": None, "source": "pytest", "argv": list(config.invocation_params.args),
        "cases_planned": None, "timeout_s": settings.timeout_s, "hypothesis_profile": settings.hypothesis_profile,
    }
    return ReportWriter(settings.report_dir, meta)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    if hasattr(config, "workerinput"):
        config.workeroutput["parity_records"] = config.stash[RECORDS]
        return
    writer = config.stash.get(WRITER, None)
    if writer is None:
        return
    from moe_fq_parity.harness.backends import load

    specs = sorted({r["backend"] for r in writer.report["records"]} | set(config.stash[SETTINGS].backends))
    writer.report["meta"]["backends"] = [load(s).to_json() for s in specs]
    writer.report["meta"]["formats"] = sorted({r["fmt"] for r in writer.report["records"]})
    writer.report["meta"]["checks"] = sorted({r["check"] for r in writer.report["records"]})
    interrupted = exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR)
    writer.finish(complete=not interrupted, error=f"pytest exit status {int(exitstatus)}" if interrupted else None)
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"parity report: {writer.json_path} and {writer.html_path} ({len(writer.report['records'])} records)")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: merge a finished worker's records."""
    writer = node.config.stash.get(WRITER, None)
    records = getattr(node, "workeroutput", {}).get("parity_records", [])
    if writer is not None and records:
        writer.add(records)
