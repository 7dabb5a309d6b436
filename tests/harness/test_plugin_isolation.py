"""The pytest plugin among other projects and against crashing backends.

* Loading the plugin (every pytest session where this distribution is installed) imports neither
  torch nor numpy, and a project's own ``gpu``-marked test is that project's business: the plugin
  does not skip it.
* The ready parity test calls its backends in a supervised worker (``harness.run.isolation``): a
  backend that ends its process fails its test as a ``crash`` with the repro, the report records
  it, and the session goes on with the next test.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "tests.harness.hostile_backends"
INT4 = "int4.cuda/per_expert/stacked/N4/8x40/outliers/s0"
"""The hostile backends misbehave on INT4 calls only."""
INT8 = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PARITY_", "PYTEST_"))}
    return env | extra


def _pytest(proj: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", *args], cwd=proj, env=_env(**env),
                          capture_output=True, text=True, timeout=600)


NO_HYPOTHESIS = ("-p", "no:hypothesispytest")
"""For the sessions that run parity tests, which use no Hypothesis (its plugin costs about 0.5 s a process)."""


def _project(root: Path) -> Path:
    """A project whose one test file brings in the ready parity test."""
    proj = root / "proj"
    proj.mkdir()
    (proj / "pytest.ini").write_text("[pytest]\n")
    (proj / "test_kernel.py").write_text("from moe_fq_parity.harness.run.parity_test import test_parity  # noqa: F401\n")
    return proj


def test_loading_the_plugin_imports_neither_torch_nor_numpy():
    code = ("import sys; import moe_fq_parity.harness.run.pytest_plugin; "
            "print(sorted(m for m in ('torch', 'numpy') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == "[]"


def test_another_projects_gpu_marker_is_left_alone(tmp_path):
    """Without CUDA, a ``gpu``-marked test of a project that uses none of the plugin's fixtures runs:
    what its marker means is the project's choice."""
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    gpu: this project's own meaning\n")
    (tmp_path / "test_theirs.py").write_text("import pytest\n\n\n@pytest.mark.gpu\ndef test_mine():\n    assert True\n")
    proc = _pytest(tmp_path, "--trace-config", CUDA_VISIBLE_DEVICES="")  # --trace-config: the plugins it loaded, in the same session
    assert proc.returncode == 0 and "1 passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert re.search(r"^PLUGIN registered: <module 'moe_fq_parity\.harness\.run\.pytest_plugin'", proc.stdout, re.M), proc.stdout[-3000:]


def test_another_projects_session_gets_no_torch_and_no_triton_interpreter(tmp_path):
    """In a session with no ``--parity-*`` option and no ``PARITY_*`` variable outside this repository,
    the plugin imports no torch and leaves ``TRITON_INTERPRET`` alone (on a CUDA-less host it would
    otherwise switch every Triton kernel of that project to the interpreter)."""
    (tmp_path / "test_theirs.py").write_text(
        "import os\nimport sys\n\n\ndef test_untouched():\n"
        "    assert 'torch' not in sys.modules\n    assert 'TRITON_INTERPRET' not in os.environ\n")
    env = {k: v for k, v in _env(CUDA_VISIBLE_DEVICES="").items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0 and "1 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]


def test_parity_tests_a_test_file_brings_in_start_the_session_when_collected(tmp_path):
    """The same kind of session, with the ready parity test imported by a test file and no option:
    the settings are resolved when its tests are collected (the defaults), and they run (a few: the
    forward tests of the ``8x40`` INT8 cases on the reference)."""
    (tmp_path / "test_parity_here.py").write_text("from moe_fq_parity.harness.run.parity_test import *  # noqa: F401,F403\n")
    selected = "reference and int8 and forward and 8x40"
    proc = _pytest(tmp_path, *NO_HYPOTHESIS, "-k", selected, "--co", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tests collected" in proc.stdout, proc.stdout[-2000:]
    run = _pytest(tmp_path, *NO_HYPOTHESIS, "-k", selected, "-x", CUDA_VISIBLE_DEVICES="")
    assert run.returncode == 0 and " passed" in run.stdout and "failed" not in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


CRASHING = {"ExitsZero": "exited with code 0", "Segfaults": "killed by signal SIGSEGV"}
"""Hostile backends that end their worker process on INT4 calls -> how the failure says it ended."""


@pytest.fixture(scope="module")
def crashed(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, dict, list[tuple[str, str]]]:
    """One session over both crashing backends: each backend's INT4 test, then its INT8 test (the order
    the ids are given in): ``(output, report, [(test id, outcome), ...] in the order they ran)``."""
    proj = _project(tmp_path_factory.mktemp("crash"))
    specs = [f"{HOSTILE}:{name}" for name in CRASHING]
    ids = [f"test_kernel.py::test_parity[{case}-{spec}-forward]" for spec in specs for case in (INT4, INT8)]
    proc = _pytest(proj, *NO_HYPOTHESIS, "-vv", *ids, "--parity-suite", "smoke", *(a for spec in specs for a in ("--parity-backend", spec)),
                   "--parity-report", "out", PYTHONPATH=str(REPO))
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "2 failed, 2 passed" in out, out[-4000:]
    ran = re.findall(r"^(test_kernel\.py::test_parity\[.*?\]) (PASSED|FAILED)", out, re.M)
    return out, json.loads((proj / "out" / "report.json").read_text()), ran


@pytest.mark.parametrize("name, how", CRASHING.items())
def test_a_crashing_backend_fails_its_parity_test_and_the_session_goes_on(crashed, name, how):
    """The backend's INT4 test fails as a crash (how the process ended, the repro); its INT8 test, the next
    one the session runs, passes; the report records both."""
    out, report, ran = crashed
    spec = f"{HOSTILE}:{name}"
    mine = [(test, outcome) for test, outcome in ran if f"-{spec}-" in test]
    assert mine == [(f"test_kernel.py::test_parity[{INT4}-{spec}-forward]", "FAILED"), (f"test_kernel.py::test_parity[{INT8}-{spec}-forward]", "PASSED")], ran
    section = out[out.index(f"test_parity[{INT4}-{spec}-forward] _"):]
    section = re.split(r"\n[_=]", section, maxsplit=1)[0]  # up to the next failure's header or the summary
    assert "forward failed (crash) for " + INT4 in section and how in section and f"repro: moe-fq-parity run --case {INT4}" in section, section
    by = {r["case_id"]: r for r in report["records"] if r["backend"] == spec}
    assert report["complete"] and by[INT4]["outcome"] == "crash" and by[INT8]["verdict"] == "pass", report["records"]


def test_a_crash_in_one_check_fails_that_check_only(tmp_path):
    """A worker computes a test's check and the checks of the tests after it on the same case and
    backend in one request; a crash there fails only the checks that crash when run on their own:
    the backend ending its process in its STE backward fails both backward tests, its forward and
    invariant tests pass."""
    proj = _project(tmp_path)
    proc = _pytest(proj, *NO_HYPOTHESIS, "--parity-suite", "smoke", "--parity-backend", f"{HOSTILE}:ExitsInBackward", "-k", "int4 and N4 and 8x40 and outliers",
                   "-vv", PYTHONPATH=str(REPO))
    out = proc.stdout + proc.stderr
    results = dict(re.findall(r"test_parity\[.*?-(\w+(?:\.\w+)?)\] (PASSED|FAILED|SKIPPED)", out))
    assert results == {"forward": "PASSED", "backward.pass_through": "FAILED", "backward.clipped": "FAILED", "invariant.layout": "PASSED",
                       "invariant.grouped": "PASSED", "invariant.recalibrate": "PASSED"}, out[-4000:]
    assert out.count("failed (crash)") == 2, out[-4000:]


def test_worker_and_in_process_parity_tests_give_the_same_records(tmp_path):
    """The worker (default) and ``--parity-in-process`` judge alike: same records, same verdicts and
    counts, every check of a case sharing that case's tensors either way."""
    proj = _project(tmp_path)
    reports = {}
    for mode, extra in (("worker", ()), ("in-process", ("--parity-in-process",))):
        proc = _pytest(proj, *NO_HYPOTHESIS, "--parity-suite", "smoke", "--parity-backend", "reference", "-k", "int8 and outliers",
                       "--parity-report", mode, *extra)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        report = json.loads((proj / mode / "report.json").read_text())
        reports[mode] = sorted((r["key"], r["verdict"], json.dumps(r.get("counts"), sort_keys=True), r["message"]) for r in report["records"])
    assert reports["worker"] and reports["worker"] == reports["in-process"]


def test_ready_runs_group_consecutive_checks_of_one_case_and_backend():
    """``ready_runs``: a test's check and those of the tests right after it on the same case and
    backend; whether the test after those is on the same case; other tests break a run."""
    from types import SimpleNamespace

    from moe_fq_parity.harness.run.plugin_checks import ready_runs

    def item(nodeid, case=None, backend=None, check=None):
        params = {} if case is None else {"parity_case": SimpleNamespace(id=case), "parity_backend": backend, "check": check}
        return SimpleNamespace(nodeid=nodeid, callspec=SimpleNamespace(params=params))

    items = [item("a1", "A", "ref", "forward"), item("a2", "A", "ref", "backward"), item("a3", "A", "tri", "forward"),
             item("a4", "A", "tri", "backward"), item("b1", "B", "tri", "forward"), item("plain"), item("b2", "B", "tri", "backward")]
    runs = ready_runs(items)
    assert runs["a1"] == (("forward", "backward"), True) and runs["a2"] == (("backward",), True)
    assert runs["a3"] == (("forward", "backward"), False) and runs["b1"] == (("forward",), False) and runs["b2"] == (("backward",), False)
    assert "plain" not in runs
