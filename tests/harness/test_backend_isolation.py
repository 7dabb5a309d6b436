"""A backend cannot change what the reference computes, nor end, hang or interrupt the run.

Process-global numeric settings (``harness.core.guard.SETTINGS``): what building a backend sets, its
calls run with and the reference never sees; what a call leaves changed fails that call and is set
back.  Isolation (``harness.run.isolation``): the cases run in a supervised worker process, so a
backend that exits, segfaults, hangs past the timeout or raises ``KeyboardInterrupt`` gives
``crash``/``timeout``/failed records and the run goes on with the next case.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.core.guard import ProcessState, ProcessStateChanged, building, guarded
from moe_fq_parity.harness.run.cli import main

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "tests.harness.hostile_backends"
SPECIAL = "int8.reciprocal/per_expert/stacked/N4/16x48/special@design/s0"
"""Its inputs hold denormals: flushing them changes the outputs."""
INT8 = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _run(out: Path, *args: str) -> tuple[int, dict]:
    rc = main(["run", "--no-progress", "--no-sections", "--no-perf", "--out", str(out), *args])  # the same records on a GPU host
    return rc, json.loads((out / "report.json").read_text())


# --- process-global numeric state ------------------------------------------------------------------

def test_a_call_that_leaves_a_setting_changed_fails_and_is_set_back():
    before = ProcessState.capture()
    call = guarded(lambda: torch.set_default_dtype(torch.float64), None)
    assert isinstance(call.error, ProcessStateChanged) and "default_dtype torch.float32 -> torch.float64" in call.message
    assert torch.get_default_dtype() == torch.float32 and not before.changes(ProcessState.capture())


def test_what_building_sets_the_calls_run_with_and_the_harness_does_not():
    with building() as built:
        torch.set_flush_denormal(True)
    assert not ProcessState.capture().changes(ProcessState.capture().with_values([("flush_denormal", False)]))
    assert dict(built[0].chosen) == {"flush_denormal": True} and "flush_denormal False -> True" in built[0].note()
    tiny = float.fromhex("0x1p-1074")
    call = guarded(lambda: tiny * 1.0, None, built[0].chosen)
    assert call.ok and call.value == 0.0, "the call did not run in the backend's state"
    assert tiny * 1.0 == tiny, "the backend's state leaked out of its call"


def test_a_backend_flushing_denormals_is_judged_against_a_clean_reference(tmp_path):
    """Building it turns flushing on; the in-process reference used to flush too and the case passed."""
    rc, report = _run(tmp_path / "ftz", "--case", SPECIAL, "--backend", f"{HOSTILE}:FlushesDenormals", "--checks", "forward")
    assert rc == 1 and report["records"][0]["verdict"] == "fail", report["records"][0]["message"]
    assert "flush_denormal False -> True" in report["meta"]["backends"][0]["note"]
    assert float.fromhex("0x1p-1074") * 1.0 != 0.0  # this process does not flush afterwards


def test_a_backend_setting_the_default_dtype_fails_itself_not_the_next_case(tmp_path):
    """In this process (``--in-process``), so the last line checks the run's own process; the guard in a
    worker is the flushing test's above."""
    rc, report = _run(tmp_path / "dt", "--case", INT8, "--case", SPECIAL, "--backend", f"{HOSTILE}:SetsDefaultDtype",
                      "--backend", "reference", "--checks", "forward", "--in-process")
    assert rc == 1 and len(report["records"]) == 4
    by = {(r["case_id"], r["backend"].split(":")[-1]): r for r in report["records"]}
    assert all(by[(c, "reference")]["verdict"] == "pass" for c in (INT8, SPECIAL))
    assert all(by[(c, "SetsDefaultDtype")]["verdict"] == "fail" and "default_dtype" in by[(c, "SetsDefaultDtype")]["message"]
               for c in (INT8, SPECIAL))
    assert torch.get_default_dtype() == torch.float32


# --- isolation: a supervised worker process ---------------------------------------------------------

INT4 = "int4.cuda/per_expert/stacked/N4/16x48/special@design/s0"
"""The hostile backends misbehave on INT4 calls only: the INT8 case after it shows the run going on."""


ENDERS = ("ExitsZero", "Segfaults")


@pytest.fixture(scope="module")
def ended(tmp_path_factory) -> tuple[int, dict]:
    """One run of both process-ending backends and the reference, one worker: on INT4 the first kills
    its worker, the second kills the fresh one, the reference runs in a third, and INT8 goes on in
    that one (two runs of one ender each cost two more worker starts and a run)."""
    return _run(tmp_path_factory.mktemp("ended") / "r", "--case", INT4, "--case", INT8, *(a for n in ENDERS for a in ("--backend", f"{HOSTILE}:{n}")),
                "--backend", "reference", "--checks", "forward,backward.clipped", "--workers", "1")


@pytest.mark.parametrize("name, how", [("ExitsZero", "exited with code 0"), ("Segfaults", "killed by signal SIGSEGV")])
def test_a_backend_that_ends_its_process_gives_crash_records_and_the_run_goes_on(ended, name, how):
    rc, report = ended
    assert rc == 1 and report["complete"] and report["meta"]["isolation"] == "worker"
    by = {(r["case_id"], r["backend"].split(":")[-1], r["check"]): r for r in report["records"]}
    assert len(by) == 12, sorted(by)
    crashed = by[(INT4, name, "forward")]
    assert crashed["outcome"] == "crash" and crashed["verdict"] == "fail" and how in crashed["message"], crashed["message"]
    assert crashed["repro"].startswith("moe-fq-parity run --case " + INT4) and "--checks forward" in crashed["repro"]
    not_run = by[(INT4, name, "backward.clipped")]
    assert not_run["outcome"] == "crash" and not_run["message"].startswith("not run: in check forward"), not_run["message"]
    # the case's other backends, and the next case, ran in a fresh worker
    assert [by[k]["verdict"] for k in sorted(by) if k[:2] not in {(INT4, n) for n in ENDERS}] == ["pass"] * 8


def test_a_backend_that_hangs_past_every_alarm_gives_a_timeout_record(tmp_path):
    start = time.monotonic()
    rc, report = _run(tmp_path / "hang", "--case", INT4, "--case", INT8, "--backend", f"{HOSTILE}:HangsUninterruptibly",
                      "--checks", "forward", "--timeout", "0.5")
    assert time.monotonic() - start < 120
    first, second = report["records"]
    assert rc == 1 and first["outcome"] == "timeout" and "(timeout 0.5 s) ran past its limit" in first["message"], first["message"]
    assert "--timeout 0.5" in first["repro"] and second["case_id"] == INT8 and second["verdict"] == "pass"


@pytest.mark.parametrize("mode", [[], ["--in-process"]], ids=["worker", "in_process"])
def test_a_keyboard_interrupt_raised_by_a_backend_is_its_failure_not_the_end_of_the_run(tmp_path, mode):
    rc, report = _run(tmp_path / "ki", "--case", INT4, "--case", INT8, "--backend", f"{HOSTILE}:RaisesKeyboardInterrupt",
                      "--checks", "forward", *mode)
    assert rc == 1 and report["complete"], report.get("error")
    first, second = report["records"]
    assert first["verdict"] == "fail" and "KeyboardInterrupt: from the backend" in first["message"] and "not a Ctrl-C" in first["message"]
    assert second["verdict"] == "pass"


def test_isolated_and_in_process_runs_give_the_same_records(tmp_path):
    args = ("--case", INT4, "--case", SPECIAL, "--backend", "reference", "--backend", "eager-loop")
    _, isolated = _run(tmp_path / "iso", *args)
    _, inproc = _run(tmp_path / "inp", *args, "--in-process")
    assert isolated["meta"]["isolation"] == "worker" and inproc["meta"]["isolation"] == "in-process"
    strip = lambda r: {k: v for k, v in r.items() if k not in ("duration_s", "peak_bytes")}  # noqa: E731
    assert [strip(r) for r in isolated["records"]] == [strip(r) for r in inproc["records"]]
    assert len(isolated["records"]) == 24


def test_isolation_works_from_a_script_read_from_stdin(tmp_path):
    """Workers start like every harness process (``startable_main``): a parent read from stdin works."""
    script = (f"import sys; from moe_fq_parity.harness.run.cli import main\n"
              f"sys.exit(main(['run', '--no-progress', '--no-sections', '--case', {INT4!r}, '--backend', '{HOSTILE}:Segfaults', "
              f"'--checks', 'forward', '--no-perf', '--out', {str(tmp_path / 'stdin')!r}]))\n")
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, cwd=REPO, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(REPO)})
    report = json.loads((tmp_path / "stdin" / "report.json").read_text())
    assert out.returncode == 1 and report["complete"], out.stderr[-2000:]
    assert report["records"][0]["outcome"] == "crash" and "SIGSEGV" in report["records"][0]["message"]


@pytest.mark.parametrize("workers", [1, 2])
def test_sigterm_ends_a_run_whose_backend_swallows_every_exception(tmp_path, workers):
    """In process such a backend swallows the run's own ``Terminated`` too (the run outlived SIGTERM);
    isolated, the signal reaches the parent, which writes the partial report and kills the worker
    (with two workers: both hang, each in a case of its own).  The signal comes once each worker has
    said its hang began (a file named after its pid), not a fixed 2 s after the report appeared."""
    import signal

    from tests.harness.hang_marker_backends import MARKER_DIR_ENV

    out, hung = tmp_path / "term", tmp_path / "hung"
    hung.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "moe_fq_parity.harness", "run", "--case", INT4, "--case", INT4.replace("N4", "N5"),
                             "--backend", "tests.harness.hang_marker_backends:HangsUninterruptiblyAndSays", "--workers", str(workers),
                             "--timeout", "0", "--checks", "forward", "--no-perf", "--no-sections", "--no-progress", "--out", str(out)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), MARKER_DIR_ENV: str(hung)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + 120
    # signalled once every worker hangs (each writes its pid first), and the report is there to be completed
    while len(list(hung.iterdir())) < workers or not (out / "report.json").exists():
        assert time.monotonic() < end and proc.poll() is None, "the run never wrote its report, or its workers never hung"
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    sent = time.monotonic()
    try:
        output, _ = proc.communicate(timeout=60)
    finally:
        proc.kill()
    report = json.loads((out / "report.json").read_text())
    assert proc.returncode == 143 and report["complete"] is False and report["error"] == "terminated (SIGTERM)", output[-2000:]
    assert time.monotonic() - sent < 30 and report["meta"]["workers"] == workers


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_an_illegal_cuda_access_gives_a_crash_record_and_the_next_case_a_fresh_context(tmp_path):
    pytest.importorskip("triton")
    rc, report = _run(tmp_path / "ima", "--case", INT4, "--case", INT8, "--backend", f"{HOSTILE}:IllegalCudaAccess", "--checks", "forward")
    first, second = report["records"]
    # The worker either finds its context lost after the call, or dies of it (an H200: SIGKILL): a crash either way.
    assert rc == 1 and first["outcome"] == "crash", first["message"]
    assert "the CUDA context is lost" in first["message"] or "killed by signal" in first["message"], first["message"]
    assert second["case_id"] == INT8 and second["verdict"] == "pass", second["message"]
