"""The regression gate and the run lifecycle cannot pass on an empty night; hostile backends are caught.

Coverage loss (incomplete, empty, other-suite reports; missing records; pass -> skip; a declared format
that is declined), argument validation before anything is written, one writer per ``--out``, SIGTERM,
input mutation, an unswallowable timeout, unusable backend devices, ``--baseline`` on a complete run,
repro strings that carry the timeout, and the pytest ready test running the CLI's checks.
"""

from __future__ import annotations

import copy
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.checks import DEFAULT_CHECKS
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.run.diff import diff_reports
from moe_fq_parity.harness.run.runner import LOCK_NAME, OutDirBusy, out_lock

REPO = Path(__file__).resolve().parents[2]
HOSTILE = "tests.harness.hostile_backends"
INT8 = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _run(out: Path, *args: str) -> tuple[int, dict]:
    rc = main(["run", "--no-progress", "--no-sections", "--out", str(out), *args])
    return rc, json.loads((out / "report.json").read_text())


IN_PROCESS = "--in-process"
"""For runs whose assertions are on the report, not on isolation: a worker start costs ~1.5 CPU-s a run
(the records are the same either way: ``test_backend_isolation``)."""


@pytest.fixture(scope="module")
def baseline(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("base") / "r"
    rc, _ = _run(out, "--suite", "smoke", "--backend", "reference", IN_PROCESS)
    assert rc == 0
    return out / "report.json"


def _compare(tmp_path: Path, old: Path, new: dict) -> int:
    p = tmp_path / "new.json"
    p.write_text(json.dumps(new))
    return main(["compare", str(old), str(p)])


# --- 1, 9: the gate -----------------------------------------------------------------------------

def test_compare_fails_on_incomplete_empty_and_other_suite_reports(tmp_path, baseline, capsys):
    good = json.loads(baseline.read_text())
    assert _compare(tmp_path, baseline, good) == 0
    interrupted = copy.deepcopy(good)
    interrupted["complete"], interrupted["error"] = False, "interrupted (KeyboardInterrupt)"
    interrupted["records"] = interrupted["records"][:5]
    assert _compare(tmp_path, baseline, interrupted) == 1
    assert "the new report is incomplete" in capsys.readouterr().out
    empty = copy.deepcopy(good)
    empty["records"] = []
    assert _compare(tmp_path, baseline, empty) == 1
    assert "has no records" in capsys.readouterr().out
    other = copy.deepcopy(good)
    other["meta"]["suite"] = "ci"
    assert _compare(tmp_path, baseline, other) == 1
    assert "suite 'ci'" in capsys.readouterr().out


def test_missing_records_and_pass_to_skip_are_regressions(baseline):
    old = json.loads(baseline.read_text())
    new = copy.deepcopy(old)
    dropped = new["records"].pop(max(i for i, r in enumerate(new["records"]) if r["verdict"] == "pass"))
    skipped = next(r for r in new["records"] if r["verdict"] == "pass")
    skipped["verdict"] = "skip"
    d = diff_reports(old, new)
    assert any(dropped["key"] in r and "missing" in r for r in d.regressions)
    assert any(skipped["key"] in r and "pass -> skip" in r for r in d.regressions)


def test_a_killed_run_fails_its_gate(tmp_path, baseline):
    """A nightly that died early (Ctrl-C after a second), compared with the baseline, fails its gate."""
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    inherited = signal.getsignal(signal.SIGINT)
    # A process started with SIGINT ignored keeps it ignored (POSIX; Python then installs no
    # KeyboardInterrupt handler), so the child starts with the default disposition whatever this
    # test process inherited.
    proc = subprocess.Popen([sys.executable, "-m", "moe_fq_parity.harness", "run", "--suite", "smoke", "--backend", f"{HOSTILE}:slow",
                             "--no-sections", "--no-progress", "--out", str(out)], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    _wait_for(out / "report.json")
    time.sleep(1.0)
    proc.send_signal(signal.SIGINT)
    rc = proc.wait(60)
    assert rc == 130, f"exit {rc} after SIGINT (this process's SIGINT handler: {inherited!r}); child stderr: {proc.stderr.read()[-2000:]}"
    assert main(["compare", str(baseline), str(out / "report.json")]) == 1


def test_run_baseline_on_a_complete_run_is_not_incomplete(tmp_path, baseline):
    rc, report = _run(tmp_path / "b", "--suite", "smoke", "--backend", "reference", "--baseline", str(baseline), IN_PROCESS)
    assert rc == 0 and report["complete"]
    assert not report["baseline"]["regressions"], report["baseline"]["regressions"]
    assert not any("incomplete" in c for c in report["baseline"]["changes"])


# --- 2: a declared format cannot silently lose coverage -------------------------------------------

def test_declared_then_declined_format_fails(tmp_path, baseline):
    rc, report = _run(tmp_path / "d", "--suite", "smoke", "--backend", f"{HOSTILE}:declares_then_declines", IN_PROCESS)
    assert rc == 1
    nv = [r for r in report["records"] if r["case_id"].startswith("nvfp4.te/") and r["check"] == "forward"]  # its default variant, no option
    assert nv and all(r["verdict"] == "fail" and "declined a format it declares" in r["message"] for r in nv)
    d = diff_reports(json.loads(baseline.read_text()), {**report, "meta": {**report["meta"], "backends": []}})
    assert any("nvfp4" in r for r in d.regressions)


# --- 3: a typo never touches the previous report --------------------------------------------------

@pytest.mark.parametrize("bad", [["--checks", "forwrd"], ["--sections", "nope"], ["--timeout", "-1"], ["--timeout", "nan"]])
def test_bad_arguments_exit_2_before_writing(tmp_path, baseline, bad, capsys):
    out = tmp_path / "keep"
    out.mkdir()
    (out / "report.json").write_bytes(baseline.read_bytes())
    before = (out / "report.json").read_bytes()
    try:
        rc = main(["run", "--suite", "smoke", "--backend", "reference", "--no-progress", "--out", str(out), *bad])
    except SystemExit as exc:  # argparse usage errors
        rc = exc.code
    assert rc == 2
    assert bad[0] in capsys.readouterr().err
    assert (out / "report.json").read_bytes() == before
    assert not (out / "report.html").exists()


# --- 4: one writer per --out -----------------------------------------------------------------------

def test_second_writer_is_refused(tmp_path, capsys):
    out = tmp_path / "shared"
    with out_lock(out):
        with pytest.raises(OutDirBusy):
            with out_lock(out):
                pass
        rc = main(["run", "--case", INT8, "--backend", "reference", "--no-progress", "--no-sections", "--out", str(out)])
        assert rc == 2 and "another run" in capsys.readouterr().err
        assert not (out / "report.json").exists()
    rc, report = _run(out, "--case", INT8, "--backend", "reference", IN_PROCESS)  # released: the next run writes
    assert rc == 0 and report["complete"]
    assert not (out / LOCK_NAME).exists(), "the lock file outlived the run"


def test_lock_is_removed_and_a_stale_open_file_is_not_a_lock(tmp_path, monkeypatch):
    """The lock file goes with its run; a run that opened the file just before its holder removed it
    locks the file in the folder, not the removed one (else two runs would both hold a lock)."""
    out = tmp_path / "o"
    with out_lock(out):
        stale = os.open(out / LOCK_NAME, os.O_RDWR)  # opened while held, locked after the holder is gone
    assert not (out / LOCK_NAME).exists()
    real_open = os.open
    opened = []

    def racing_open(path, *args, **kwargs):
        opened.append(path)
        return os.dup(stale) if len(opened) == 1 else real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", racing_open)
    with out_lock(out):
        monkeypatch.setattr(os, "open", real_open)
        assert (out / LOCK_NAME).exists() and len(opened) == 2
        with pytest.raises(OutDirBusy):
            with out_lock(out):
                pass
    os.close(stale)


# --- 5: SIGTERM ----------------------------------------------------------------------------------

def _wait_for(path: Path, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < end, f"{path} never appeared"
        time.sleep(0.1)


@pytest.mark.parametrize("after_s", [0.0, 1.0], ids=["at_start", "mid_run"])
def test_sigterm_leaves_a_partial_report_and_a_matching_html(tmp_path, baseline, after_s):
    """SIGTERM mid-run, and right when report.json appears (the first report.html is being written
    then: a signal that cut an import of the HTML renderer short once gave exit 1 and no HTML)."""
    out = tmp_path / "term"
    out.mkdir()
    (out / "report.html").write_text("<html>(pass) an earlier run</html>")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "moe_fq_parity.harness", "run", "--suite", "smoke", "--backend", f"{HOSTILE}:slow",
                             "--no-sections", "--no-progress", "--out", str(out)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    _wait_for(out / "report.json")
    time.sleep(after_s)
    proc.send_signal(signal.SIGTERM)
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 143, output[-2000:]
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] is False and report["error"] == "terminated (SIGTERM)", output[-2000:]
    html = (out / "report.html").read_text()
    assert "an earlier run" not in html and "Incomplete run" in html and "terminated (SIGTERM)" in html


# --- 6, 12: input mutation; every check starts from the generated inputs ---------------------------

def test_a_backend_writing_into_its_weights_fails(tmp_path):
    rc, report = _run(tmp_path / "w", "--suite", "smoke", "--backend", f"{HOSTILE}:writes_into_weights", IN_PROCESS)
    assert rc == 1
    fwd = [r for r in report["records"] if r["check"] == "forward" and r["verdict"] == "fail"]
    assert fwd and all("wrote to its inputs (weights of expert" in r["message"] for r in fwd)


def test_amax_mutation_is_caught_per_check_and_each_repro_reproduces(tmp_path):
    rc, report = _run(tmp_path / "a", "--case", INT8, "--backend", f"{HOSTILE}:halves_amax", "--timeout", "77", IN_PROCESS)
    assert rc == 1
    fails = {r["check"]: r for r in report["records"] if r["verdict"] == "fail"}
    assert set(fails) == set(DEFAULT_CHECKS), sorted(fails)
    assert all("wrote to its inputs (amax)" in r["message"] for r in fails.values())
    for check in ("backward.clipped", "invariant.recalibrate"):
        argv = shlex.split(fails[check]["repro"])
        assert argv[:2] == ["moe-fq-parity", "run"] and "--timeout" in argv and argv[argv.index("--timeout") + 1] == "77"
        out = tmp_path / f"repro-{check}"
        argv[argv.index("--out") + 1] = str(out)
        assert main(argv[1:] + ["--no-progress"]) == 1
        again = json.loads((out / "report.json").read_text())["records"]
        assert [(r["check"], r["message"]) for r in again] == [(check, fails[check]["message"])]


# --- 7: the timeout cannot be swallowed or switched off by a negative value -----------------------

def test_timeout_ends_a_backend_that_swallows_exceptions(tmp_path):
    start = time.monotonic()
    rc, report = _run(tmp_path / "t", "--case", INT8, "--backend", f"{HOSTILE}:retries_forever", "--timeout", "0.5",
                      "--checks", "forward")
    assert time.monotonic() - start < 30
    assert rc == 1 and "CaseTimeout" in report["records"][0]["message"]


# --- 8: a backend on a device this host lacks ------------------------------------------------------

@pytest.mark.parametrize("name", ["no_cuda", "bogus_device"])
def test_unusable_backend_device_is_unavailable_with_the_reason(tmp_path, name, capsys):
    if name == "no_cuda" and torch.cuda.is_available():
        pytest.skip("this host has CUDA: the device is usable")
    out = tmp_path / name
    rc = main(["run", "--no-progress", "--no-sections", "--out", str(out), "--case", INT8, "--backend", f"{HOSTILE}:{name}", "--backend", "reference"])
    err = capsys.readouterr().err.strip()
    # named with --backend, it cannot run here: refused before any work, in one line with the reason
    assert rc == 2 and not out.exists() and err.startswith(f"error: --backend {HOSTILE}:{name}: unavailable here:") and "device" in err, err


# --- 13: pytest runs the CLI's checks --------------------------------------------------------------

def test_pytest_ready_test_runs_the_cli_checks():
    from moe_fq_parity.harness.run.parity_test import PARITY_CHECKS

    assert tuple(PARITY_CHECKS) == tuple(DEFAULT_CHECKS) and "invariant.recalibrate" in PARITY_CHECKS
