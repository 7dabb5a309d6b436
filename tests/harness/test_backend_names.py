"""Backends by name: every place that takes a backend accepts the built-in and external names."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from moe_fq_parity.harness.backends import BUILTINS, EXTERNAL, INSTALL_HINTS, NAMES, BackendLoadError, load
from moe_fq_parity.harness.run.cli import main

REPO = Path(__file__).resolve().parents[2]
ONE = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"
MODELOPT = load("modelopt-eager")


def test_names_cover_builtins_and_the_external_backends():
    assert set(EXTERNAL) == {"modelopt", "modelopt-eager", "te", "te-current", "modelopt-mx", "modelopt-int4-block", "modelopt-int4-group",
                             "torchao", "torchao-ceil", "torchao-even", "torchao-rceil"}
    assert NAMES == (*BUILTINS, *EXTERNAL)
    with pytest.raises(BackendLoadError, match="modelopt-eager"):
        load("modelop")  # the error lists the names


@pytest.mark.parametrize("name", NAMES)
def test_every_name_loads_and_says_why_not_with_an_install_hint(name):
    lb = load(name)
    assert lb.spec == name
    if lb.available:
        assert lb.obj is not None and lb.why_not == lb.reason
    else:
        assert lb.reason, f"{name} unavailable without a reason"
        if name in INSTALL_HINTS:
            assert INSTALL_HINTS[name] in lb.why_not and "pip install" in lb.why_not


def test_list_shows_every_backend_with_availability(capsys):
    assert main(["list", "--suite", "smoke", "--cases", "no-such-case"]) == 0
    out = capsys.readouterr().out
    for name in NAMES:
        line = next(ln for ln in out.splitlines() if ln.split()[:1] == [name])
        assert ("external" if name in EXTERNAL else "built-in") in line
        assert "available on" in line or ("unavailable: " in line and load(name).reason in line)


def test_run_takes_an_external_backend_by_name(tmp_path):
    out = tmp_path / "out"
    rc = main(["run", "--no-progress", "--no-sections", "--in-process", "--out", str(out), "--case", ONE, "--checks", "forward",
               "--backend", "modelopt-eager"])  # in process: a worker would import Model-Optimizer once more
    if not MODELOPT.available:
        assert rc == 2  # asked for by name and unavailable: exit 2, with the reason and the pip command
        return
    report = json.loads((out / "report.json").read_text())
    assert rc == 0 and [b["spec"] for b in report["meta"]["backends"]] == ["modelopt-eager"]
    assert [(r["backend"], r["verdict"]) for r in report["records"]] == [("modelopt-eager", "pass")]


def test_run_of_an_unavailable_name_prints_the_install_hint(tmp_path, capsys):
    """In this process: the refusal comes before any work (a subprocess added a torch import and every backend's probe, ~7 s)."""
    missing = next((n for n in NAMES if not load(n).available and n in INSTALL_HINTS), None)
    if missing is None:
        pytest.skip("every named backend is available here")
    rc = main(["run", "--no-progress", "--no-sections", "--case", ONE, "--checks", "forward", "--backend", missing, "--out", str(tmp_path / "o")])
    out, err = capsys.readouterr()
    assert rc == 2, out + err
    assert INSTALL_HINTS[missing] in out + err


def test_variant_match_takes_a_builtin_name(tmp_path):
    path = tmp_path / "vm.json"
    proc = subprocess.run([sys.executable, "-m", "moe_fq_parity.harness.sections.external.variant_match", "--backend", "reference",
                           "--format", "int4", "--n-ties", "20", "--json", str(path)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(path.read_text())
    assert data and data[0]["fmt"] == "int4"


def test_selftest_runs_the_named_control_backend(tmp_path):
    path = tmp_path / "st.json"
    rc = main(["selftest", "--mutant", "scale-reciprocal", "--case", ONE, "--backend", "eager-loop", "--json", str(path)])
    data = json.loads(path.read_text())
    assert [(c["backend"], c["available"]) for c in data["controls"]] == [("eager-loop", True)], data["controls"]
    assert data["controls"][0]["checks"] > 0 and data["controls"][0]["failures"] == [] and rc in (0, 1)  # rc: whether one case kills the mutant


def test_pytest_option_takes_a_name(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "tests/harness/test_parity.py", "--collect-only", "-q",
                           "--parity-backend", "modelopt-eager", "-k", "8x40 and outliers"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "-modelopt-eager-forward]" in proc.stdout and "parity: seed=" not in proc.stderr
