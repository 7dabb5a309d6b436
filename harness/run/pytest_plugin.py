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
  ``ParitySettings`` in ``config.stash``; the seed is printed in the report header.  Every value is
  checked at session start by the CLI's checks (a bad one is a one-line usage error, exit 4), and so
  is every backend named with ``--parity-backend``/``PARITY_BACKENDS``: one that cannot run here is a
  usage error (the CLI's exit 2), only the default built-ins are skipped when unavailable.
* ``--parity-report DIR`` holds ``DIR``'s run lock (``harness.run.runner.out_lock``, as ``run --out``)
  for the session; the report is started when tests start to run (a usage error, an empty selection
  or ``--collect-only`` writes nothing) and is complete only when every selected test ran and every
  failed parity test has a failing record.
* Hypothesis (the ``test`` extra) is imported only where installed: the plugin, and the ready parity
  test, need the base install alone.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Container, Optional

import pytest

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
    hypothesis_profile: Optional[str]
    """``None`` where Hypothesis is not installed."""
    nan_bits: str = DEFAULT_NAN_BITS
    explicit_backends: bool = False
    """The backends were named (option or environment): each must be available here."""


SETTINGS = pytest.StashKey[ParitySettings]()
RECORDS = pytest.StashKey[list]()
UNRECORDED = pytest.StashKey[list]()
"""Parity tests that failed in pytest where no record of the report can say so (see ``pytest_runtest_makereport``)."""
ITEM_RECORDS = pytest.StashKey[list]()
WRITER = pytest.StashKey[Any]()
LOCK = pytest.StashKey[Any]()
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


ENV_NAMES = {"report": "REPORT", "seed": "SEED", "suite": "SUITE", "backend": "BACKENDS", "mode": "MODE", "timeout": "TIMEOUT",
             "nan_bits": "NAN_BITS"}
"""Option ``--parity-X`` -> its environment variable ``PARITY_<name>``."""
_CLI_OPTIONS = {"--mode": "mode", "--timeout": "timeout", "--nan-bits": "nan_bits"}
"""The CLI's option names in ``validate_config``'s messages -> this plugin's options."""


def _usage(opt: str, message: str) -> pytest.UsageError:
    """A one-line usage error naming the option and its environment variable."""
    return pytest.UsageError(f"--parity-{opt.replace('_', '-')} / {ENV_PREFIX}{ENV_NAMES[opt]}: {message}")


def _number(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """``kind`` (``int``/``float``) whose ``ValueError`` says what was expected and what was given."""

    def cast(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None

    return cast


def _hypothesis_profiles() -> Any:
    """``harness.run.hypothesis_profiles``, or ``None`` where Hypothesis is not installed (it comes with
    the ``test`` extra: the plugin loads, and runs the parity tests, without it)."""
    try:
        from . import hypothesis_profiles
    except ModuleNotFoundError as exc:
        if exc.name != "hypothesis":
            raise
        return None
    return hypothesis_profiles


def _resolve(config: pytest.Config) -> ParitySettings:
    """Every setting from the command line, else ``PARITY_*``, else its default, checked the way the
    CLI checks its options (``harness.run.runner.validate_config``): a bad value is a one-line
    ``pytest.UsageError`` before any test runs.  An environment variable set to the empty string is
    refused (an empty ``PARITY_BACKENDS`` would otherwise mean "every built-in")."""
    from moe_fq_parity.cases import DEFAULT_SEED, SUITE_NAMES

    from .runner import validate_config

    def pick(opt: str, default: Any, cast: Callable[[str], Any] = str) -> Any:
        value = config.getoption("parity_" + opt)
        if value is not None:
            return value
        env = ENV_PREFIX + ENV_NAMES[opt]
        if env not in os.environ:
            return default
        if not os.environ[env].strip():
            raise pytest.UsageError(f"{env} is set but empty: give a value or unset it")
        try:
            return cast(os.environ[env])
        except ValueError as exc:
            raise _usage(opt, f"{exc}") from None

    suite = pick("suite", None)
    if suite is not None and suite not in SUITE_NAMES:
        raise _usage("suite", f"unknown suite {suite!r}; known: {', '.join(SUITE_NAMES)}")
    timeout = pick("timeout", CALL_TIMEOUT_S, _number(float, "seconds as a number"))
    nan_bits, mode = pick("nan_bits", DEFAULT_NAN_BITS), pick("mode", "strict")
    try:
        validate_config((), None, timeout, nan_bits, mode)
    except ValueError as exc:  # "--timeout: ..." -> "--parity-timeout / PARITY_TIMEOUT: ..."
        opt, _, message = str(exc).partition(": ")
        if opt not in _CLI_OPTIONS:
            raise pytest.UsageError(f"parity settings: {exc}") from None
        raise _usage(_CLI_OPTIONS[opt], message) from None
    seed = pick("seed", DEFAULT_SEED, _number(int, "an integer"))
    backends = pick("backend", None, lambda s: [s])
    if backends is not None:  # repeatable and comma-separated, as the CLI's --backend
        backends = [b.strip() for arg in backends for b in arg.split(",")]
        if not all(backends):
            raise _usage("backend", f"an empty backend name in {backends}: name each backend (`moe-fq-parity list` shows them)")
    from moe_fq_parity.harness.backends import BUILTINS

    report = pick("report", None)
    profiles = _hypothesis_profiles()
    profile = (config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE")
               or (profiles.DEFAULT_PROFILE if profiles is not None else None))
    return ParitySettings(
        report_dir=Path(report) if report else None,
        seed=seed,
        suite=suite,
        backends=tuple(backends) if backends else tuple(BUILTINS),
        mode=mode,
        timeout_s=timeout or None,
        hypothesis_profile=profile,
        nan_bits=nan_bits,
        explicit_backends=backends is not None,
    )


def _check_named_backends(settings: ParitySettings) -> None:
    """A backend named by the user that cannot run here is a usage error (the CLI's exit 2), never a
    session of skips that exits 0; the loaded backends are kept for the tests."""
    from moe_fq_parity.harness.backends import BackendLoadError, load

    for spec in settings.backends:
        try:
            lb = load(spec)
        except BackendLoadError as exc:
            raise pytest.UsageError(f"--parity-backend {spec}: {exc}") from None
        if not lb.available:
            raise pytest.UsageError(f"--parity-backend {spec}: unavailable here: {lb.why_not}")
        _LOADED[spec] = lb


def _check_report_dir(report_dir: Path) -> None:
    """``--parity-report DIR`` must be a folder this session can write (the CLI's ``--out`` check)."""
    from .cli import _unwritable

    if (problem := _unwritable(report_dir)) is not None:
        raise _usage("report", f"cannot write the report to {report_dir}: {problem}")


def _worker_index() -> Optional[int]:
    """xdist worker number (``gw3`` -> 3), ``None`` outside a worker."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else None


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if config.getoption("help", False):
        return
    settings = _resolve(config)
    config.stash[SETTINGS] = settings
    config.stash[RECORDS] = []
    config.stash[UNRECORDED] = []
    profiles = _hypothesis_profiles()
    if profiles is not None and settings.hypothesis_profile and not config.getoption("hypothesis_profile", None):
        from hypothesis import settings as hsettings

        hsettings.load_profile(settings.hypothesis_profile)
    if hasattr(config, "workerinput"):  # xdist worker: its share of the CPUs for PyTorch's threads
        from moe_fq_parity.harness.core.processes import share_cpus

        share_cpus(int(config.workerinput.get("workercount", 1)))
        return
    if settings.explicit_backends and not config.option.collectonly:  # listing tests runs no backend
        _check_named_backends(settings)
    if settings.report_dir is not None:
        _check_report_dir(settings.report_dir)
        _hold_run_lock(config, settings.report_dir)
    if getattr(config.option, "dist", "no") == "load" and _gpu_count() > 0:
        config.stash[GPU_GROUPS] = _gpu_count()  # xdist's default for -n: schedule the GPU groups (module docstring)


def _hold_run_lock(config: pytest.Config, report_dir: Path) -> None:
    """Hold the run lock of ``report_dir`` (``harness.run.runner.out_lock``, the CLI's ``--out`` lock)
    until the session ends: two runs never write one report; a held lock is a usage error."""
    from .runner import OutDirBusy, out_lock

    lock = out_lock(report_dir)
    try:
        lock.__enter__()
    except OutDirBusy as exc:
        raise _usage("report", str(exc)) from None
    config.stash[LOCK] = lock


def pytest_unconfigure(config: pytest.Config) -> None:
    lock = config.stash.get(LOCK, None)
    if lock is not None:
        del config.stash[LOCK]
        lock.__exit__(None, None, None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """The report is started when tests are about to run: a session that ends at collection (a usage
    error such as a bad ``-k``, collection errors, ``--collect-only``) writes nothing."""
    config = session.config
    settings = config.stash.get(SETTINGS, None)
    if settings is None or settings.report_dir is None or hasattr(config, "workerinput") or config.option.collectonly:
        return
    if session.testsfailed and not config.option.continue_on_collection_errors:
        return
    config.stash[WRITER] = _new_writer(config, settings)


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
        _add_record(request.config, rec.to_json())
        request.node.stash.setdefault(ITEM_RECORDS, []).append(rec)

    return add


def _add_record(config: pytest.Config, data: dict) -> None:
    config.stash[RECORDS].append(data)
    writer = config.stash.get(WRITER, None)
    if writer is not None:
        writer.add([data])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A parity test that fails in pytest (setup, call or teardown) with no failing record of its own
    is put in the report: a failing record of its check (the ready test's ``check`` parameter) with
    the error and the repro command when that check has no record yet; otherwise (a test of the
    user's own, a failure after a passing check) it is listed in ``UNRECORDED`` and the report is
    not complete.  So the report never passes beside failed parity tests."""
    outcome = yield
    rep = outcome.get_result()
    if not rep.failed or call.excinfo is None or SETTINGS not in item.config.stash:
        return
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    case, spec = params.get("parity_case"), params.get("parity_backend")
    if case is None:
        return
    mine = item.stash.get(ITEM_RECORDS, [])
    if any(r.verdict == "fail" for r in mine):
        return
    error = (call.excinfo.exconly().strip().splitlines() or [""])[0][:300]
    from moe_fq_parity.harness.core.records import CHECKS, CheckRecord
    from moe_fq_parity.harness.core.repro import repro_command

    check = params.get("check")
    if spec is not None and check in CHECKS and not any(r.check == check for r in mine):
        s = item.config.stash[SETTINGS]
        rec = CheckRecord(case_id=case.id, backend=spec, check=check, verdict="fail", fmt=case.fmt, n=case.n, numel=case.numel,
                          mode=s.mode, message=f"the test failed in pytest ({rep.when}) before its check recorded a verdict: {error}",
                          repro=repro_command(case.id, spec, check, s.seed, s.mode, timeout_s=s.timeout_s, nan_bits=s.nan_bits))
        item.stash.setdefault(ITEM_RECORDS, []).append(rec)
        _add_record(item.config, rec.to_json())
        return
    item.config.stash[UNRECORDED].append(f"{item.nodeid} ({rep.when}): {error}")


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


def assert_record(rec) -> None:
    """Skip on a ``skip`` record; fail on a ``fail`` record with its message, the offender table
    and the repro command (``harness.core.failure_text``, as a failing ``run`` prints them)."""
    from moe_fq_parity.harness.core.failure_text import failure_lines

    if rec.verdict == "skip":
        pytest.skip(rec.message)
    if rec.verdict == "fail":
        pytest.fail("\n".join(failure_lines(rec)), pytrace=False)


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


NOT_WRITTEN = (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.NO_TESTS_COLLECTED)
"""pytest exit statuses after which no report is written (an earlier report stays as it was)."""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Finish the report: complete only when pytest ran every selected test to its end and every
    failed parity test has a failing record (``pytest_runtest_makereport``)."""
    config = session.config
    if SETTINGS not in config.stash:
        return
    if hasattr(config, "workerinput"):
        config.workeroutput["parity_records"] = config.stash[RECORDS]
        config.workeroutput["parity_unrecorded"] = config.stash[UNRECORDED]
        return
    writer = config.stash.get(WRITER, None)
    if writer is None or exitstatus in NOT_WRITTEN:
        return
    from moe_fq_parity.harness.backends import load

    specs = sorted({r["backend"] for r in writer.report["records"]} | set(config.stash[SETTINGS].backends))
    writer.report["meta"]["backends"] = [(_LOADED[s] if s in _LOADED else load(s)).to_json() for s in specs]
    writer.report["meta"]["formats"] = sorted({r["fmt"] for r in writer.report["records"]})
    writer.report["meta"]["checks"] = sorted({r["check"] for r in writer.report["records"]})
    error = None
    if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
        error = f"pytest exit status {int(exitstatus)}"
    elif session.shouldstop or session.shouldfail:
        error = f"pytest stopped early ({session.shouldstop or session.shouldfail}): not every selected test ran"
    elif unrecorded := config.stash[UNRECORDED]:
        error = (f"{len(unrecorded)} parity tests failed in pytest without a failing record: "
                 + "; ".join(unrecorded[:10]) + (f"; ... and {len(unrecorded) - 10} more" if len(unrecorded) > 10 else ""))
    writer.finish(complete=error is None, error=error)
    tr = config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"parity report: {writer.json_path} and {writer.html_path} ({len(writer.report['records'])} records)"
                      + (f"; INCOMPLETE: {error}" if error else ""))


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: merge a finished worker's records."""
    output = getattr(node, "workeroutput", {})
    node.config.stash[UNRECORDED].extend(output.get("parity_unrecorded", []))
    writer = node.config.stash.get(WRITER, None)
    records = output.get("parity_records", [])
    if writer is not None and records:
        writer.add(records)
