"""The report section: plan per suite, rows from verdicts, skip without GPUs."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.sections.checkpoint import section
from moe_fq_parity.harness.sections.checkpoint.matrix import DistPlan
from moe_fq_parity.harness.sections import SECTION_RUNNERS, Section


def test_runner_is_registered():
    assert SECTION_RUNNERS["dist"] == "moe_fq_parity.harness.sections.checkpoint.section:run"


def test_plan_per_suite():
    smoke = section.plan_for("smoke", 5, "cpu")
    assert isinstance(smoke, DistPlan) and [lay.id for lay in smoke.save_layouts] == ["tp1ep1", "tp1ep2", "tp2ep1"]
    assert len(section.plan_for("ci", 5, "cpu").load_layouts) == 7
    with pytest.raises(ValueError, match="unknown suite"):
        section.plan_for("weekly", 5, "cpu")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="checks the skip path of machines without 2 GPUs")
def test_cuda_without_two_gpus_runs_gloo_and_says_nccl_was_skipped(monkeypatch):
    if torch.cuda.device_count() >= 2:
        pytest.skip("this host has 2 GPUs: NCCL runs")
    seen = []
    monkeypatch.setattr(section, "run_plan_blocks", lambda plan, workdir, part: seen.append(plan.device) or [])
    sec = section.run("ci", 5, "cuda")
    assert isinstance(sec, Section) and seen and set(seen) == {"cpu"}
    assert "NCCL skipped" in sec.notes and "at least 2 GPUs" in sec.notes


@pytest.mark.dist
def test_rows_from_the_gloo_run(gloo_run):
    sec = Section("dist", section.TITLE, section.COLUMNS, section.to_rows(list(gloo_run.verdicts), gloo_run.seed, "cpu"))
    assert sec.name == "dist" and sec.columns == section.COLUMNS
    assert sec.verdict == "pass", [r.id for r in sec.rows if r.verdict == "fail"]
    row = next(r for r in sec.rows if r.id == "roundtrip/tp2ep2->tp1ep8/one_vector/nvfp4/static")
    assert row.fields["save"] == "tp2ep2" and row.fields["load"] == "tp1ep8" and row.fields["mismatches"] == 0
    assert row.repro.startswith("python -m moe_fq_parity.harness.sections.checkpoint") and "--save tp2ep2 --load tp1ep8" in row.repro
    assert sec.to_json()["verdict"] == "pass"


def test_plan_validation_names_each_bad_argument():
    from moe_fq_parity.harness.sections.checkpoint.layout import Layout

    plan = DistPlan(1, (Layout(1, 3),), (Layout(1, 1),), device="tpu", engine="x", qf_ids=("int3",))
    with pytest.raises(ValueError) as info:
        plan.validate()
    text = str(info.value)
    for part in ("device='tpu'", "engine='x'", "qf_ids has 'int3'", "not divisible by ep=3"):
        assert part in text
    with pytest.raises(TypeError):
        DistPlan(1, (Layout(1, 1),), (Layout(1, 1),), "cpu")


def test_engine_rows_stand_side_by_side():
    from moe_fq_parity.harness.sections.checkpoint.checks import Verdict

    v = Verdict("roundtrip/tp1ep1->tp1ep2/n_quantizer/fp8_e4m3/per_expert", "pass", {"engine": "megatron"})
    assert section.engine_row(v, "dcp") is v
    assert section.engine_row(v, "megatron").id == "megatron/" + v.id
    skip = Verdict("engine/megatron", "skip", {}, "not importable")
    assert section.engine_row(skip, "megatron").id == "engine/megatron"
    assert section.engine_label("dcp") == "dcp" and section.engine_label("megatron").startswith("megatron")
