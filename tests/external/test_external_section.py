"""The ``external`` report section: rows per backend and format, skips with reasons."""

from __future__ import annotations

import json

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.external import section
from moe_fq_parity.harness.backends.modelopt_backend import ModeloptBackend
from moe_fq_parity.harness.sections import SECTION_RUNNERS

EAGER_FP8 = ModeloptBackend("eager")
EAGER_FP8.formats = {"fp8_e4m3"}
"""The eager path restricted to FP8, to keep the section test short."""


@pytest.fixture
def tiny_suite(monkeypatch):
    monkeypatch.setitem(section.SUITE_SIZES, "smoke", {"n_ties": 20, "n_split": 1})
    return "smoke"


def test_the_runner_is_registered():
    assert SECTION_RUNNERS["external"] == "moe_fq_parity.harness.sections.external.section:run"


def test_backends_that_cannot_run_are_skipped_with_their_reason(monkeypatch, tiny_suite):
    monkeypatch.setattr(section, "BACKENDS", {"modelopt": "moe_fq_parity.harness.backends.modelopt_backend:modelopt",
                                              "te": "moe_fq_parity.harness.backends.te_backend:te"})
    s = section.run(tiny_suite, 0, "cuda" if torch.cuda.is_available() else "cpu")
    if torch.cuda.is_available():
        pytest.skip("this test pins the CPU-only behaviour")
    assert [r.id for r in s.rows] == ["external/modelopt", "external/te"]
    assert all(r.verdict == "skip" and r.message for r in s.rows)
    # Model-Optimizer installed: the CUDA-extension path needs a GPU; not installed: the import failure and its pip command.
    assert "CUDA" in s.rows[0].message or ("No module named 'modelopt'" in s.rows[0].message and "pip install" in s.rows[0].message)
    assert "CUDA" in s.rows[1].message
    assert s.verdict == "skip"
    json.dumps(s.to_json())


def test_eager_rows_say_what_matched(monkeypatch, tiny_suite, modelopt_eager):
    monkeypatch.setattr(section, "BACKENDS", {"modelopt-eager": "tests.external.test_external_section:EAGER_FP8"})
    s = section.run(tiny_suite, 0, "cpu")
    by_id = {r.id: r for r in s.rows}
    row = by_id["external/modelopt-eager/fp8_e4m3/variants"]
    assert row.fields["expected"] == "eager" and "--backend modelopt-eager" in row.repro
    if "eager" in reference.variants("fp8_e4m3"):
        assert row.verdict == "pass" and row.fields["matched"] == "eager"
    else:
        assert row.verdict == "fail" and "has no variant 'eager'" in row.message
        assert row.fields["matched"] == "none" and "reciprocal=" in row.fields["mismatches"]
    ste = [r for r in s.rows if "/ste/" in r.id]
    assert len(ste) == 5 and all(r.verdict == "pass" for r in ste)
    clip = by_id["external/modelopt-eager/fp8_e4m3/ste/clip_rule"]
    assert clip.fields["matched"] == "torch_promotion" and clip.fields["mismatches"].startswith("fp32=")
    assert row.fields["version"] == "0.47.0"
    assert "calibrated: " in row.fields["per_case"] and "calibrated_tiny: " in row.fields["per_case"]
    assert {r.id for r in s.rows if "/calibration/" in r.id} == {"external/modelopt-eager/calibration/per_tensor",
                                                                 "external/modelopt-eager/calibration/per_channel"}
    assert set(section.COLUMNS) <= set(row.fields)
    json.dumps(s.to_json())


def test_unknown_suite_is_an_error():
    with pytest.raises(ValueError, match="suite"):
        section.run("weekly", 0, "cpu")
