"""The pytest plugin end to end: parametrized ids, deselection of slow cases, xdist merge, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_fq_parity.reports.schema import validate

REPO = Path(__file__).resolve().parents[2]


def _pytest(*args: str) -> subprocess.CompletedProcess:
    """A pytest session in a subprocess, in the repository.  None of these sessions is about Hypothesis: its
    plugin stays out (about 0.5 s a process, each xdist worker included); the parity plugin resolves the same
    Hypothesis profile either way (no ``--hypothesis-profile`` is given)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_xdist_run_merges_every_record_into_one_report(tmp_path):
    out = tmp_path / "rep"
    proc = _pytest("tests/harness/test_parity.py", "-n", "2", "-q", "--parity-backend", "reference",
                   "--parity-backend", "tests.harness.test_not_applicable:CudaOnly",
                   "--parity-seed", "77", "--parity-report", str(out), "-k", "smoke or (ties and int4)")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    validate(report)
    # the workers deselect the int4 cases of the INT8-only backend; the controller counts them once
    na = report["not_applicable"]["tests.harness.test_not_applicable:CudaOnly"]
    assert na["records"] > 0 and [ln for ln in proc.stdout.splitlines() if "not applicable" in ln] == [
        f"parity: {na['records']} checks not applicable to their backend (not run, not skips): {na['records']} on "
        f"tests.harness.test_not_applicable:CudaOnly ({na['cases']} cases)"], proc.stdout[-3000:]
    passed = int(proc.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert report["complete"] and report["meta"]["seed"] == 77 and report["meta"]["source"] == "pytest"
    assert len(report["records"]) >= passed > 0
    assert len({r["key"] for r in report["records"]}) == len(report["records"])
    assert (out / "report.html").exists()


@pytest.fixture(scope="module")
def listed() -> subprocess.CompletedProcess:
    """One ``--collect-only`` session of the repository's parity test on two backends (no ``-m``, seed 5),
    shared by the tests on what it lists."""
    return _pytest("tests/harness/test_parity.py", "--collect-only", "-q", "--parity-backend", "reference",
                   "--parity-backend", "eager-loop", "--parity-seed", "5")


def test_collection_ids_header_and_slow_deselection(listed):
    lines = listed.stdout.splitlines()
    assert any("test_parity[int8.cuda/per_expert/stacked/N4/8x40/outliers/s0-reference-forward]" in ln for ln in lines)
    assert not any("5120x8192" in ln for ln in lines) and "deselected" in listed.stdout
    slow = _pytest("tests/harness/test_parity.py", "--collect-only", "-m", "slow", "--parity-backend", "reference", "--parity-seed", "5")
    assert "5120x8192" in slow.stdout and "parity: seed=5 " in slow.stdout


def test_tests_of_a_case_are_adjacent_across_backends(listed):
    """Case-major order: every test of a case (all backends, all checks) runs before the next case's,
    so the plugin builds a case's inputs and reference outputs once (``plugin_checks.case_tensors``, in process).
    Proven on every listed test, and on those of ``int8.cuda/per_expert/stacked`` alone (many of them)."""
    ids = [ln.split("[", 1)[1] for ln in listed.stdout.splitlines() if ln.startswith("tests/harness/test_parity.py::test_parity[")]
    for chosen in (ids, [i for i in ids if "int8.cuda/per_expert/stacked" in i]):
        cases = [i.split("-reference-")[0].split("-eager-loop-")[0] for i in chosen]
        runs = [c for k, c in enumerate(cases) if k == 0 or cases[k - 1] != c]
        assert len(chosen) > 20 and len(runs) == len(set(runs)), f"a case's tests are split: {runs[:6]} ..."
        assert {i.split("-")[-2] for i in chosen} >= {"reference", "loop"}


READY = "moe_fq_parity.harness.run.parity_test"
CUDA_ONLY = "tests.harness.test_not_applicable:CudaOnly"
"""INT8 ``cuda`` only, declared (variants and options): every other format and variant is not applicable to it."""


def _in_process(capsys, monkeypatch, tmp_path, *args: str, target: tuple[str, ...] = ("--pyargs", READY)) -> tuple[int, str]:
    """A pytest session in this process (default: on the ready parity test): ``(exit code, stdout)``."""
    for key in [k for k in os.environ if k.startswith("PARITY_")]:
        monkeypatch.delenv(key)
    capsys.readouterr()
    rc = pytest.main(["-p", "no:cacheprovider", "--rootdir", str(tmp_path), *target, *args])
    return int(rc), capsys.readouterr().out


@pytest.mark.parametrize("markexpr,says", [
    (None, "cases=379 of 1,953 (ci 379 of 379, larger slow-marked nightly 0 of 1,574; no -m: the plugin deselects the slow-marked"),
    ("not slow", "cases=379 of 1,953 (ci 379 of 379, larger slow-marked nightly 0 of 1,574; -m 'not slow')"),
    ("slow", "cases=1,574 of 1,953 (ci 0 of 379, larger slow-marked nightly 1,574 of 1,574; -m 'slow')"),
    ("parity and not slow and not gpu", "cases=379 of 1,953 (ci 379 of 379"),
])
def test_header_says_what_the_markers_selected(capsys, monkeypatch, tmp_path, markexpr, says):
    """The session header counts the parity cases the ``-m`` expression (or the plugin's default)
    keeps, by pytest's own expression rules: under ``-m "not slow"`` it never claims the slow-marked
    larger cases."""
    (tmp_path / "test_other.py").write_text("def test_other():\n    pass\n")  # the header comes before collection: collect little
    rc, out = _in_process(capsys, monkeypatch, tmp_path, "--parity-backend", "reference", "--collect-only",
                          *(("-m", markexpr) if markexpr else ()), target=(str(tmp_path / "test_other.py"),))
    header = next(ln for ln in out.splitlines() if ln.startswith("parity: seed="))
    assert says in header, header
    assert ("need a CUDA device" in header) == (markexpr == "slow" and not torch.cuda.is_available()), header


def test_not_applicable_tests_are_deselected_and_counted_once(capsys, monkeypatch, tmp_path):
    """The tests of cases outside what the backend declares are not generated as skips: deselected,
    counted in one summary line (as ``moe-fq-parity run`` prints it) and in the report's
    ``not_applicable``; ``-rs`` lists only the skips a user can act on."""
    rep, select = tmp_path / "rep", ("--parity-suite", "ci", "-q", "-k", "N4 and 16x48 and ties")
    rc, listed = _in_process(capsys, monkeypatch, tmp_path, "--parity-backend", "reference", "--collect-only", *select)
    every = int(listed.strip().splitlines()[-1].split("/")[0])  # "96/492 tests collected (...)": the reference declares every case
    rc, out = _in_process(capsys, monkeypatch, tmp_path, "--parity-backend", CUDA_ONLY, "-rs", "--parity-report", str(rep),
                          "--parity-in-process", *select)
    assert rc == 0, out[-3000:]
    counts = {w: int(n) for n, w in (p.split()[:2] for p in out.strip().splitlines()[-1].split(" in ")[0].split(", "))}
    report = json.loads((rep / "report.json").read_text())
    validate(report)
    na = report["not_applicable"][CUDA_ONLY]
    assert na["records"] > 0 and na["cases"] > 0 and counts["passed"] + counts.get("skipped", 0) + na["records"] == every, (counts, na, every)
    lines = [ln for ln in out.splitlines() if "not applicable to their backend" in ln]
    assert lines == [f"parity: {na['records']} checks not applicable to their backend (not run, not skips): {na['records']} on {CUDA_ONLY} "
                     f"({na['cases']} cases)"], lines
    assert "not applicable" not in out.replace(lines[0], "")  # no skip says it
    assert {r["reason"].split(" ")[0] for r in na["reasons"]} >= {"backend", "cuda-only"}  # other formats; other int8 variants
    assert not any(r["verdict"] == "skip" and "not applicable" in r["message"] for r in report["records"])
