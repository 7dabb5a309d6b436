"""The pytest plugin end to end: parametrized ids, deselection of slow cases, xdist merge, report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from moe_fq_parity.reports.schema import validate

REPO = Path(__file__).resolve().parents[2]


def _pytest(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


def test_xdist_run_merges_every_record_into_one_report(tmp_path):
    out = tmp_path / "rep"
    proc = _pytest(tmp_path, "tests/harness/test_parity.py", "-n", "2", "-q", "--parity-backend", "reference",
                   "--parity-seed", "77", "--parity-report", str(out), "-k", "smoke or (ties and int4)")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads((out / "report.json").read_text())
    validate(report)
    passed = int(proc.stdout.strip().splitlines()[-1].split(" passed")[0].split()[-1])
    assert report["complete"] and report["meta"]["seed"] == 77 and report["meta"]["source"] == "pytest"
    assert len(report["records"]) >= passed > 0
    assert len({r["key"] for r in report["records"]}) == len(report["records"])
    assert (out / "report.html").exists()


def test_collection_ids_header_and_slow_deselection(tmp_path):
    proc = _pytest(tmp_path, "tests/harness/test_parity.py", "--collect-only", "-q", "--parity-backend", "reference", "--parity-seed", "5")
    lines = proc.stdout.splitlines()
    assert any("test_parity[int8.cuda/per_expert/stacked/N4/8x40/outliers/s0-reference-forward]" in ln for ln in lines)
    assert not any("5120x8192" in ln for ln in lines) and "deselected" in proc.stdout
    slow = _pytest(tmp_path, "tests/harness/test_parity.py", "--collect-only", "-m", "slow", "--parity-backend", "reference", "--parity-seed", "5")
    assert "5120x8192" in slow.stdout and "parity: seed=5 " in slow.stdout


def test_tests_of_a_case_are_adjacent_across_backends(tmp_path):
    """Case-major order: every test of a case (all backends, all checks) runs before the next case's,
    so the plugin builds a case's inputs and reference outputs once (``plugin_checks.case_tensors``, in process)."""
    proc = _pytest(tmp_path, "tests/harness/test_parity.py", "--collect-only", "-q", "--parity-backend", "reference",
                   "--parity-backend", "eager-loop", "-k", "int8.cuda/per_expert/stacked")
    ids = [ln.split("[", 1)[1] for ln in proc.stdout.splitlines() if ln.startswith("tests/harness/test_parity.py::test_parity[")]
    cases = [i.split("-reference-")[0].split("-eager-loop-")[0] for i in ids]
    runs = [c for k, c in enumerate(cases) if k == 0 or cases[k - 1] != c]
    assert len(ids) > 20 and len(runs) == len(set(runs)), f"a case's tests are split: {runs[:6]} ..."
    assert {i.split("-")[-2] for i in ids} >= {"reference", "loop"}
