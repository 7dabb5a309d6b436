"""The selftest itself: every mutant dies on the ci cases; a correct 'mutant' survives and fails the run."""

from __future__ import annotations

import json

from moe_fq_parity.harness.sections.selftest import runner as runner
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.sections.selftest.mutants import Mutant, build_mutants


def test_every_mutant_is_killed_and_controls_pass():
    r = runner.run_selftest("ci")
    survivors = [(m.name, m.message) for m in r.mutants if not m.killed]
    assert not survivors, survivors
    assert len(r.mutants) >= 15
    assert all(c.available and not c.failures for c in r.controls), [(c.backend, c.reason, c.failures[:1]) for c in r.controls]
    assert r.ok


def test_kills_name_the_check_and_the_generated_case():
    r = runner.run_selftest("ci", mutants=["clipped-ste-lt", "stale-amax-cache"], controls=())
    by = {m.name: m for m in r.mutants}
    assert by["clipped-ste-lt"].check == "backward.clipped"
    assert by["stale-amax-cache"].check == "invariant.recalibrate"
    assert all(m.case_id in {c.id for c in runner.suite_cases("ci")} for m in r.mutants)


def test_a_correct_backend_survives_and_fails_the_selftest(monkeypatch, tmp_path, capsys):
    harmless = Mutant("harmless", "no bug at all", {"int8", "int4", "fp8_e4m3", "nvfp4"})
    monkeypatch.setattr(runner, "build_mutants", lambda: build_mutants()[:1] + [harmless])
    out = tmp_path / "st.json"
    assert main(["selftest", "--no-controls", "--json", str(out)]) == 1
    assert "SURVIVED harmless" in capsys.readouterr().out
    data = json.loads(out.read_text())
    killed = {m["name"]: m["killed"] for m in data["mutants"]}
    assert not data["ok"] and killed.pop("harmless") is False and all(killed.values())


def test_a_failing_control_fails_the_selftest(monkeypatch):
    monkeypatch.setattr(runner, "build_mutants", lambda: [])
    r = runner.run_selftest("ci", controls=["tests.harness.broken_backends:OneUlpHigh"])
    assert not r.ok and r.controls[0].failures


def test_unknown_mutant_is_a_usage_error(capsys):
    assert main(["selftest", "--mutant", "no-such-bug"]) == 2
    assert "unknown mutant" in capsys.readouterr().err


def test_section_rows():
    from moe_fq_parity.harness.sections.selftest.report import section_of

    r = runner.run_selftest("ci", mutants=["bf16-truncate"], controls=("reference",))
    sec = section_of(r)
    assert [row.id for row in sec.rows] == ["mutant/bf16-truncate", "control/reference"]
    assert sec.verdict == "pass"


def test_smoke_kills_every_mutant(tmp_path):
    """``selftest --suite smoke``: every built-in mutant dies on the smoke cases (the step-multiply
    op order included) and the unmutated controls pass them."""
    out = tmp_path / "st.json"
    assert main(["selftest", "--suite", "smoke", "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["suite"] == "smoke" and data["ok"]
    assert {m["name"] for m in data["mutants"] if m["killed"]} >= {m.name for m in build_mutants()}
    assert [c["backend"] for c in data["controls"]] == ["reference", "eager-loop"] and all(not c["failures"] for c in data["controls"])


def test_step_multiply_mutant_is_the_step_op_order():
    """The mutant computes exactly the reference's ``step`` variant (``RN(amax/qmax)``, ``x/step``,
    ``q*step``), which differs from the default somewhere on near ties."""
    import torch

    from moe_fq_parity import reference
    from moe_fq_parity.cases import make_case, make_inputs

    (m,) = [m for m in build_mutants() if m.name == "step-multiply"]
    inp = make_inputs(make_case(fmt="int8", variant="cuda", granularity="per_channel", layout="stacked", n=4, shape=(8, 40), dtype="fp32",
                                dist="neartie", amax="design"))  # fmt: skip
    got = m.fake_quant(inp.weights, inp.amax, "int8")
    assert all(torch.equal(g, reference.fake_quant(w, a, "int8", "step")) for g, w, a in zip(got, inp.weights, inp.amax))
    assert any(not torch.equal(g, reference.fake_quant(w, a, "int8")) for g, w, a in zip(got, inp.weights, inp.amax))


def test_selftest_suite_without_a_selftest_is_a_usage_error(capsys):
    assert main(["selftest", "--suite", "ultra"]) == 2
    assert "no selftest for suite 'ultra'" in capsys.readouterr().err


def test_smoke_kills_tile_2d_ignored_on_a_2d_case_of_each_format():
    """A backend that computes 1D blocks where ``tile_2d`` asks for square tiles dies in smoke for
    every format with 2D tiles, on a 2D case of that format (FP8 block-wise used to survive smoke)."""
    names = [m.name for m in build_mutants() if m.name.startswith("tile-2d-ignored-")]
    r = runner.run_selftest("smoke", mutants=names, controls=())
    assert len(r.mutants) >= 4 and all(m.killed for m in r.mutants), [(m.name, m.message) for m in r.mutants]
    assert all(m.case_id.startswith(m.name.removeprefix("tile-2d-ignored-") + ".") and "+2d/" in m.case_id for m in r.mutants)
