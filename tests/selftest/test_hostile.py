"""Hostile input to every public entry point: a clear message, a non-zero exit, the failure in the
report, never a pass."""

from __future__ import annotations

import json

import pytest

from moe_fq_parity.harness.run.cli import main

SMOKE_CASE = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _run(tmp_path, *extra):
    return main(["run", "--no-sections", "--no-progress", "--case", SMOKE_CASE, "--out", str(tmp_path / "out"), *extra])


def _records(tmp_path):
    return json.loads((tmp_path / "out" / "report.json").read_text())["records"]


@pytest.mark.parametrize("obj,verdict_msg", [("WrongDevice", "device"), ("ReturnsNone", "")])
def test_bad_outputs_are_recorded_failures(tmp_path, obj, verdict_msg):
    assert _run(tmp_path, "--backend", f"tests.selftest.hostile_backends:{obj}") == 1
    recs = _records(tmp_path)
    fwd = [r for r in recs if r["check"] == "forward"]
    assert fwd and all(r["verdict"] == "fail" for r in fwd)
    assert verdict_msg in fwd[0]["message"]
    assert not any(r["verdict"] == "pass" for r in recs if r["check"].startswith(("forward", "invariant")))


def test_probe_that_raises_is_unavailable_not_pass(tmp_path, capsys):
    assert _run(tmp_path, "--backend", "tests.selftest.hostile_backends:ProbeRaises") == 2
    assert "driver not found" in capsys.readouterr().err  # named with --backend: refused before any work
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("spec,msg", [("tests.selftest.hostile_backends:not_a_backend", "does not meet the contract"),
                                      ("tests.selftest.no_such_module:X", "No module named"),
                                      ("tests.selftest.hostile_backends:Missing", "has no attribute")])
def test_bad_backend_specs(tmp_path, capsys, spec, msg):
    assert _run(tmp_path, "--backend", spec) == 2
    assert msg in capsys.readouterr().err


def test_unwritable_output_directory(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    assert main(["run", "--no-sections", "--case", SMOKE_CASE, "--out", str(blocker / "out")]) == 2
    assert "cannot write the report" in capsys.readouterr().err


@pytest.mark.parametrize("content,msg", [("{not json", "not a readable JSON report"),
                                         (json.dumps({"schema_version": "2.0", "complete": True, "meta": {}, "records": [], "sections": []}), "schema"),
                                         (json.dumps({"records": []}), "schema")])
def test_bad_baselines(tmp_path, capsys, content, msg):
    bad = tmp_path / "baseline.json"
    bad.write_text(content)
    assert _run(tmp_path, "--baseline", str(bad)) == 2
    assert msg in capsys.readouterr().err
    assert main(["compare", str(bad), str(bad)]) == 2


def test_compare_missing_file(tmp_path, capsys):
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json")]) == 2
    assert "a.json" in capsys.readouterr().err


def test_a_backend_wrong_only_on_large_experts_fails_ci(tmp_path):
    """Wrong only past an expert's first 4,096 elements: the ci suite's large experts catch it (its
    INT8 cases here, a quarter of the suite's time; every format has such experts, ``tests/cases``),
    and no case with small experts fails."""
    from moe_fq_parity.cases import select, suite

    rc = main(["run", "--suite", "ci", "--formats", "int8", "--checks", "forward", "--no-sections", "--no-progress",
               "--out", str(tmp_path / "out"), "--backend", "tests.selftest.hostile_backends:FirstTileOnly"])  # fmt: skip
    assert rc == 1
    failed = {r["case_id"] for r in _records(tmp_path) if r["verdict"] == "fail"}
    large = {c.id for c in select(suite("ci"), formats=["int8"]) if max(o * i for o, i in c.expert_shapes) > 4096}
    assert failed and failed == large, (failed, large)
