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
``--parity-seed``, ``--parity-mode``, ``--parity-timeout``, ``--parity-nan-bits``,
``--parity-in-process``.  Markers: ``parity`` (set on every parity test), ``slow``, ``gpu``, ``fuzz``,
``dist``.  Fixtures: ``parity_case``, ``parity_backend``,
``parity_loaded_backend``, ``parity_check``, ``parity_record``, ``parity_settings``.

* Tests that take the ``parity_case`` fixture are parametrized over the catalogue with case ids as
  test ids; ``parity_backend`` over the backends.  Cases outside the ``ci`` suite carry ``slow`` (and
  large ones ``gpu``); with no ``-m`` expression and no ``--parity-suite``, slow parity cases are
  deselected, so ``pytest`` stays the CPU tier and ``pytest -m slow`` runs the large cases.  The
  header counts the cases the markers keep (``plugin_collect.marker_selection``).
* A test whose check does not apply to its backend (a case outside the formats, variants or option
  values it declares, ``harness.checks.plan``) is deselected, not skipped, and the terminal summary
  counts them in one line (``run``'s line), so pytest's skips are only those a user can act on.
* ``parity_check(name)`` runs one check (``harness.core.records.CHECKS``) and records its ``CheckRecord``;
  ``--parity-report DIR`` writes every record to ``DIR/report.json`` and ``DIR/report.html``, also
  under ``pytest -n auto`` (xdist workers send their records to the controller).
* GPU tests (marked ``gpu`` or ``slow``) lease a GPU for their whole run (``harness.run.gpu_lease``):
  one GPU test per GPU at a time, however many xdist workers, except the parity tests of small cases
  (``--parity-gpu-share-mib``), which share a GPU; the others run CPU tests meanwhile.
* One worker per GPU under xdist: on a host with G >= 1 GPUs, ``-n N`` (``-n auto``) with xdist's
  default ``--dist load`` is scheduled by scopes (``pytest_xdist_make_scheduler``): each small case
  is a scope of its own (spread over the workers, sharing the GPUs); the larger parity
  cases are split into G groups balanced by bytes (largest case first, as the shards of a sharded
  run), all tests of one case in one group; each group runs on one worker, in order, on its own GPU (the lease prefers it), so a case's
  tensors are built once and at most G workers hold the larger GPU cases, while the other workers
  run the small cases and every other test.  An explicit other ``--dist`` mode is kept (the leases
  alone then decide who runs on a GPU).  Each worker caps PyTorch's threads at its share of the CPUs
  (``harness.core.processes.share_cpus``): workers with a thread per CPU each spin against each other.
* Memory: a case's tensors (inputs and reference outputs) are shared by the consecutive tests of
  that case and dropped after the last one (``nextitem`` is another case), so nothing that outlives
  the case's tests holds it: in process at that test's teardown, in the worker at the end of its
  check.  In the worker a ready test's request also computes the checks of the tests right after it
  on the same case and backend (``plugin_checks.ready_runs``: one round trip per case and backend);
  their records wait for their tests, except a crash, timeout or out-of-memory, which the check's
  own test runs again alone.  Each record carries the check's peak CUDA memory.
* Settings are resolved once (command line > environment ``PARITY_*`` > default) into a frozen
  ``ParitySettings`` in ``config.stash``; the seed is printed in the report header.  Every value is
  checked at session start by the CLI's checks (a bad one is a one-line usage error, exit 4), and so
  is every backend named with ``--parity-backend``/``PARITY_BACKENDS``: one that cannot run here is a
  usage error (the CLI's exit 2), only the default built-ins are skipped when unavailable.
* ``--parity-report DIR`` holds ``DIR``'s run lock (``harness.run.runner.out_lock``, as ``run --out``)
  for the session; the report is started when tests start to run (a usage error, an empty selection
  or ``--collect-only`` writes nothing) and is complete only when every selected test ran and every
  failed parity test has a failing record.
* Crashes: the parity tests call their backends in a supervised worker process (``harness.run.isolation``,
  as ``moe-fq-parity run`` does; one per pytest process, replaced after a crash): a backend that ends
  its process or hangs fails its test with a ``crash``/``timeout`` record and the session goes on.
  ``--parity-in-process`` (``PARITY_IN_PROCESS=1``) calls them in the pytest process.
* Other projects: loading the plugin imports neither torch nor numpy (the concern modules below are
  imported by the hooks that need them), and it changes only parity tests (those using its fixtures):
  another project's ``gpu`` marker is its own.
* Layout: this module holds the hooks and fixtures; ``plugin_options`` (options, markers, settings
  type), ``plugin_state`` (the session state in ``config.stash``), ``plugin_settings`` (resolution and
  checks), ``plugin_collect`` (parametrisation, selection, xdist scheduling), ``plugin_checks`` (one
  check, the case cache, the worker), ``plugin_records`` (records, report, xdist merge) and
  ``plugin_gpu`` (leases).
* Hypothesis (the ``test`` extra) is imported only where installed: the plugin, and the ready parity
  test, need the base install alone.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

import pytest

from moe_fq_parity.harness.core.triton_env import prepare

from .plugin_options import ENV_NAMES, ENV_PREFIX, MARKERS, ParitySettings, add_options, is_parity_test
from .plugin_state import SESSION, ParitySession, parity_case_of, session_of

# The hooks import the concern modules where they need them: each imports torch, which the plugin's
# load (every pytest session of any project where this distribution is installed) must not.


def pytest_addoption(parser: pytest.Parser) -> None:
    add_options(parser)


def ours(config: pytest.Config) -> bool:
    """Whether this pytest session asks for the harness up front: a ``--parity-*`` option (command
    line or ini ``addopts``) or a ``PARITY_*`` variable is set, or the session runs in this
    repository.  Any other session (another project's, in an environment where this distribution is
    installed) gets the markers only: no torch import, no ``TRITON_INTERPRET``, no GPU leases; its
    parity tests, if a test file brings them in, start the session when they are collected
    (``session``)."""
    if any(config.getoption("parity_" + opt, None) not in (None, False) for opt in ENV_NAMES):
        return True
    if any(k.startswith(ENV_PREFIX) for k in os.environ):
        return True
    return (config.rootpath / "harness" / "run" / "pytest_plugin.py").is_file()


def pytest_configure(config: pytest.Config) -> None:
    for name, doc in MARKERS.items():
        config.addinivalue_line("markers", f"{name}: {doc}")
    if config.getoption("help", False) or not ours(config):
        return
    _start(config)


def _start(config: pytest.Config) -> ParitySession:
    """Resolve and check the settings (usage errors), and hold the report folder's lock."""
    prepare()  # Triton's interpreter mode on a CUDA-less host, before any harness module can import triton
    from . import plugin_settings  # deferred: torch stays out of the plugin's load

    state = ParitySession(plugin_settings.resolve(config))
    config.stash[SESSION] = state
    plugin_settings.load_hypothesis_profile(config, state.settings)
    if hasattr(config, "workerinput"):  # xdist worker: its share of the CPUs for PyTorch's threads
        from moe_fq_parity.harness.core.processes import share_cpus  # deferred: as above

        share_cpus(int(config.workerinput.get("workercount", 1)))
        return state
    if state.settings.explicit_backends and not config.option.collectonly:  # listing tests runs no backend
        plugin_settings.check_named_backends(state.settings, state.loaded)
    if state.settings.report_dir is not None:
        plugin_settings.check_report_dir(state.settings.report_dir)
        state.lock = plugin_settings.hold_run_lock(state.settings.report_dir)
    if getattr(config.option, "dist", "no") == "load":
        from .plugin_collect import gpu_count  # deferred: as above

        state.gpu_groups = gpu_count()  # xdist's default for -n: schedule the GPU groups (module docstring)
    return state


def session(config: pytest.Config) -> ParitySession:
    """The session state, started here for a session that was not ``ours`` once its parity tests are
    collected."""
    state = session_of(config)
    return state if state is not None else _start(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    state = session_of(config)
    if state is None:
        return
    if state.supervisor is not None:
        from .plugin_checks import close_worker  # deferred: as above

        close_worker(state)
    if state.lock is not None:
        lock, state.lock = state.lock, None
        lock.__exit__(None, None, None)


@pytest.hookimpl(tryfirst=True)
def pytest_runtestloop(session: pytest.Session) -> None:
    """The report is started when tests are about to run: a session that ends at collection (a usage
    error such as a bad ``-k``, collection errors, ``--collect-only``) writes nothing."""
    config = session.config
    state = session_of(config)
    if state is None or state.settings.report_dir is None or hasattr(config, "workerinput") or config.option.collectonly:
        return
    if session.testsfailed and not config.option.continue_on_collection_errors:
        return
    from .plugin_records import start_report  # deferred: as above

    start_report(config, state)


@pytest.hookimpl(tryfirst=True, optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log) -> Any:
    """xdist controller, ``-n N`` with the default ``--dist load`` on a GPU host: a ``loadscope``
    scheduler whose scopes are the GPU groups (one per GPU, all tests of a case in one) and every
    other test alone."""
    state = session_of(config)
    if state is None or not state.gpu_groups:
        return None
    from .plugin_collect import gpu_group_scheduler  # deferred: as above

    return gpu_group_scheduler(config, log, state.settings, state.gpu_groups)


def pytest_report_header(config: pytest.Config) -> Optional[str]:
    state = session_of(config)
    if state is None:
        return None
    from .plugin_collect import marker_selection  # deferred: as above

    s, groups = state.settings, state.gpu_groups
    return (f"parity: seed={s.seed} {marker_selection(config, s)} backends={','.join(s.backends)} "
            f"mode={s.mode} hypothesis-profile={s.hypothesis_profile}" + (f" report={s.report_dir}" if s.report_dir else "")
            + (f"\nparity: xdist scheduling: GPU parity cases in {groups} group(s), one worker per GPU" if groups else ""))


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if not {"parity_case", "parity_backend"} & set(metafunc.fixturenames):
        return
    from .plugin_collect import parametrize  # deferred: as above

    parametrize(metafunc, session(metafunc.config).settings)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """After pytest's ``-m``/``-k``: the plugin's deselections (``plugin_collect.modify_items``)."""
    if not any(is_parity_test(item) for item in items):
        return  # another project's tests (or none of ours): left as they are
    from .plugin_collect import modify_items  # deferred: as above

    modify_items(config, items, session(config))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """One line counting the parity tests not applicable to their backend (deselected, not skips),
    as ``moe-fq-parity run`` prints it."""
    state = session_of(terminalreporter.config)
    if state is None or not state.not_applicable:
        return
    from moe_fq_parity.harness.checks.plan import summary_line  # deferred: as above

    terminalreporter.write_line("parity: " + summary_line({"not_applicable": state.not_applicable}))


@pytest.fixture(scope="session")
def parity_settings(request: pytest.FixtureRequest) -> ParitySettings:
    """The resolved ``ParitySettings``."""
    return session(request.config).settings


@pytest.fixture
def parity_loaded_backend(parity_backend: str, request: pytest.FixtureRequest):
    """The ``LoadedBackend`` of ``parity_backend``; skips (with the reason) when unavailable here."""
    from .plugin_checks import loaded_backend  # deferred: as above

    lb = loaded_backend(session(request.config), parity_backend)
    if not lb.available:
        pytest.skip(f"backend {parity_backend} unavailable: {lb.why_not}")
    return lb


@pytest.fixture
def parity_record(request: pytest.FixtureRequest) -> Callable[[Any], None]:
    """``parity_record(record)`` adds a ``CheckRecord`` to the session's report."""
    from .plugin_records import add_record  # deferred: as above

    def add(rec) -> None:
        add_record(session(request.config), request.node, rec)

    return add


@pytest.fixture
def parity_check(parity_case, parity_loaded_backend, parity_record, request: pytest.FixtureRequest) -> Callable[[str], Any]:
    """``parity_check(name)`` runs one check on this case and backend, records and returns its record."""
    from .plugin_checks import run_check  # deferred: as above

    def run(name: str):
        recs = run_check(session(request.config), parity_case, parity_loaded_backend, name, request.node)
        for r in recs:
            parity_record(r)
        return recs[0]

    return run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A parity test that fails in pytest with no failing record of its own is put in the report
    (``plugin_records.failed_test``): the report never passes beside failed parity tests."""
    outcome = yield
    rep = outcome.get_result()
    state = session_of(item.config)
    if not rep.failed or call.excinfo is None or state is None or not is_parity_test(item):
        return
    from .plugin_records import failed_test  # deferred: as above

    failed_test(state, item, call, rep.when)


def pytest_runtest_teardown(item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """Drop the case's tensors unless the next test checks the same case."""
    state = session_of(item.config)
    if state is not None and state.current is not None:
        from .plugin_checks import teardown  # deferred: as above

        teardown(state, item, nextitem)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]):
    """Hold a GPU lease around a GPU test's setup, call and teardown (``harness.run.gpu_lease``); note
    the next test's case (the worker keeps the case's tensors only for a next test of that case)."""
    held = None
    state = session_of(item.config)
    if state is not None:
        state.next_case = parity_case_of(nextitem)
    if state is not None and (item.get_closest_marker("gpu") or item.get_closest_marker("slow")):
        from .plugin_gpu import lease  # deferred: as above

        held = lease(state, item)
    try:
        yield
    finally:
        if held is not None:
            gpu, before = held
            gpu.release(keep_bytes=max(0, before) + state.current_bytes())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Finish the report (``plugin_records.finish_report``); an xdist worker hands its records over."""
    config = session.config
    state = session_of(config)
    if state is None:
        return
    if hasattr(config, "workerinput"):
        config.workeroutput["parity_records"] = state.records  # merged by the controller (pytest_testnodedown)
        config.workeroutput["parity_unrecorded"] = state.unrecorded
        config.workeroutput["parity_not_applicable"] = state.not_applicable
        return
    if state.writer is None:
        return
    from .plugin_records import finish_report  # deferred: as above

    finish_report(session, state, exitstatus)


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist controller: merge a finished worker's records."""
    state = session_of(node.config)
    if state is None:
        return
    from .plugin_records import merge_worker  # deferred: as above

    merge_worker(state, getattr(node, "workeroutput", {}))
