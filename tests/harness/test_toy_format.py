"""Acceptance test of the format registry: a toy format registered at test time (INT6: an INT
``FormatSpec`` with 6 bits) runs through the reference, the case generator and the harness with no
other file touched; the Triton backend declines it with a reason; unregistering removes it again."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from hypothesis import find, settings

from moe_fq_parity import kernels, reference
from moe_fq_parity.cases import make_inputs, parse_case, select, suite
from moe_fq_parity.cases.strategies import cases as case_strategy
from moe_fq_parity.harness.backends.triton_backend import TritonBackend
from moe_fq_parity.harness.core.ulp import near_tie
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.sections.selftest.mutants import build_mutants
from moe_fq_parity.harness.sections.selftest.runner import run_selftest
from moe_fq_parity.reports.schema import validate
from tests.extras import needs


@pytest.fixture
def int6():
    reference.register_format(reference.int_format("int6", 6))
    try:
        yield "int6"
    finally:
        reference.unregister_format("int6")
    assert "int6" not in reference.FORMATS


def test_the_case_generator_builds_int6_cases(int6):
    ci = [c for c in suite("ci") if c.fmt == "int6"]
    assert {c.variant for c in ci} == set(reference.variants("int6"))
    assert {c.dist for c in ci} >= {"ties", "outties", "neartie", "edges", "special"} and "nan" not in {c.dist for c in ci}
    assert any(c.options == (("narrow_range", True),) for c in ci) and any(c.options == (("unsigned", True),) for c in ci)
    assert any(c.granularity == "per_channel" for c in ci)
    ties = parse_case("int6.cuda/per_expert/stacked/N4/16x64/ties@design/s0")
    inp = make_inputs(ties)
    traced = [reference.fake_quant_traced(w, a, "int6") for w, a in zip(inp.weights, inp.amax)]
    hits = sum(int(near_tie(t.pre_round, t.grid_round, window=1).sum()) for t in traced)
    assert hits / ties.numel > 0.05  # ties of the 6-bit grid, from the registry's scale numerator 31
    assert float(inp.amax.max()) < 40 * 2.0**2


def test_strategies_draw_int6(int6):
    drawn = find(case_strategy(formats=("int6",)), lambda c: c.options and c.granularity == "per_channel",
                 settings=settings(database=None, max_examples=500))
    assert drawn.fmt == "int6" and parse_case(drawn.id) == drawn and make_inputs(drawn).amax.shape == (drawn.n, drawn.shape[0])


@needs("triton")
def test_the_harness_runs_int6_and_triton_declines_it(int6, tmp_path: Path):
    out = tmp_path / "out"
    rc = main(["run", "--no-progress", "--no-sections", "--suite", "smoke", "--formats", "int6",
               "--backend", "reference,eager-loop,triton", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    validate(report)
    assert rc == 0
    recs = report["records"]
    n_smoke = len(select(suite("smoke"), formats=["int6"]))  # the smoke cases of every format, int6's
    assert {r["case_id"].split("/")[0] for r in recs} == {"int6.cuda"} and len({r["case_id"] for r in recs}) == n_smoke >= 2
    for backend in ("reference", "eager-loop"):
        fwd = [r for r in recs if r["backend"] == backend and r["check"] == "forward"]
        assert len(fwd) == n_smoke and all(r["verdict"] == "pass" for r in fwd), fwd
        assert all(r["verdict"] in ("pass", "skip") for r in recs if r["backend"] == backend)
    tri = [r for r in recs if r["backend"] == "triton"]
    if not next(b for b in report["meta"]["backends"] if b["spec"] == "triton")["available"]:
        pytest.skip("the triton backend is not available here")
    # a format the kernel does not declare is not applicable to it: no record, counted with the reason
    na = report["not_applicable"]["triton"]
    assert not tri and na["cases"] == n_smoke and all("do not include int6" in r["reason"] for r in na["reasons"]), (tri, na)


@needs("triton")
def test_triton_backend_and_kernels_decline_int6_with_a_reason(int6):
    be = TritonBackend()
    assert "int6" not in be.formats and be.formats == set(kernels.FORMATS)
    ok, why = be.format_available("int6")
    assert not ok and "does not implement int6" in why
    with pytest.raises(NotImplementedError, match="does not implement int6"):
        be._check_variant("int6", "cuda")
    w = [torch.randn(2, 16).to(torch.bfloat16)]
    with pytest.raises(ValueError, match="do not implement the format 'int6'"):
        kernels.fake_quant_experts(w, torch.ones(1), "int6")
    with pytest.raises(ValueError, match="do not implement the format 'int6'"):
        kernels.variants("int6")


def test_int_mutants_cover_int6_and_die_on_it(int6):
    ints = {m.name for m in build_mutants() if "int6" in m.formats}
    assert {"scale-reciprocal", "round-half-away", "no-saturation", "neighbour-amax"} <= ints
    assert not any("int6" in m.formats for m in build_mutants() if m.name.startswith("nvfp4"))
    ids = [c.id for c in suite("ci") if c.fmt == "int6" and c.variant == "cuda" and c.dist in ("ties", "edges") and not c.options]
    res = run_selftest("ci", mutants=["round-half-away", "no-saturation"], case_ids=ids, controls=("reference",))
    assert res.ok, res
