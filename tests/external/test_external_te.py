"""Transformer Engine backends: skipped with a reason where TE cannot import; argument checks."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.core.contract import check_backend
from moe_fq_parity.harness.sections.external.te_backend import _require_calibrated, te, te_current


def test_te_backends_meet_the_contract():
    check_backend(te)
    check_backend(te_current)
    assert te.formats == {"fp8_e4m3", "nvfp4"} and te_current.formats == {"fp8_e4m3"}
    assert te.calibrated_only == {"nvfp4"} and te_current.calibrated_only == {"fp8_e4m3"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="pins the CPU-only behaviour")
def test_without_a_gpu_te_is_unavailable_and_says_why():
    for backend in (te, te_current):
        ok, why = backend.available()
        assert not ok and "CUDA" in why
        with pytest.raises(RuntimeError, match="CUDA"):
            backend.fake_quant([torch.ones(16, 16, dtype=torch.bfloat16)], torch.tensor([1.0]), "fp8_e4m3")


def test_options_te_does_not_have_are_refused_before_anything_runs():
    w, a = [torch.ones(16, 16, dtype=torch.bfloat16)], torch.tensor([1.0])
    with pytest.raises(TypeError, match="narrow_range"):
        te.fake_quant(w, a, "fp8_e4m3", narrow_range=True)
    with pytest.raises(ValueError, match="variant"):
        te.fake_quant(w, a, "fp8_e4m3", variant="cuda")
    with pytest.raises(ValueError, match="int8"):
        te.fake_quant(w, a, "int8")
    with pytest.raises(ValueError, match="not 32"):
        te.fake_quant(w, a, "nvfp4", block_size=32)


def test_data_derived_amax_must_be_the_data_max():
    w = torch.tensor([[0.5, -2.0]], dtype=torch.bfloat16)
    _require_calibrated(w, torch.tensor(2.0), "te-current")
    with pytest.raises(ValueError, match="max\\|w\\|"):
        _require_calibrated(w, torch.tensor(1.0), "te-current")
