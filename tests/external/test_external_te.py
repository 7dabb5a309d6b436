"""Transformer Engine backends: skipped with a reason where TE cannot import; argument checks."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.core.contract import check_backend
from moe_fq_parity.harness.backends.te_backend import _require_calibrated, te, te_current


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


class TECurrentScalingEmulation:
    """TE's FP8 current scaling spelled out in numpy fp32 from ``compute_scale_from_amax``
    (epsilon 0, value_for_inf FP32_MAX) and ``scale_inv = 1/scale``, with torch's float8 cast:
    independent of the reference's code.  A stand-in for ``te-current`` where TE cannot run."""

    name = "te-current-emulated"
    device = "cpu"
    formats = {"fp8_e4m3"}
    calibrated_only = frozenset({"fp8_e4m3"})

    def fake_quant(self, weights, amax, fmt, **options):
        import numpy as np

        out = []
        for w in weights:
            x = w.float().numpy()
            a = np.float32(np.abs(x).max()) if x.size else np.float32(0)
            with np.errstate(over="ignore", divide="ignore"):
                scale = np.float32(1.0) if a == 0 else np.float32(448.0) / a
            if np.isinf(scale):
                scale = np.finfo(np.float32).max
            scale_inv = np.float32(1.0) / scale
            v = np.clip(x * scale, -448.0, 448.0).astype(np.float32)
            e = torch.from_numpy(v).to(torch.float8_e4m3fn).float().numpy()
            out.append(torch.from_numpy((e * scale_inv).astype(np.float32)).to(w.dtype))
        return out


def test_current_scaling_equals_cuda_above_tiny_amax_and_te_current_everywhere():
    from moe_fq_parity.harness.sections.external.match_cases import TINY_CALIBRATED_AMAX, build_cases
    from moe_fq_parity.harness.sections.external.section import EXPECTED, variants_row
    from moe_fq_parity.harness.sections.external.variant_match import match_variants

    cases = build_cases("fp8_e4m3", seed=0, n_split=2, calibrated_only=True)
    assert [c.name for c in cases] == ["calibrated", "calibrated_tiny"]
    m = match_variants(TECurrentScalingEmulation(), "fp8_e4m3", cases=cases)
    per = {c.case: {v.variant: v.mismatches for v in c.variants} for c in m.cases}
    assert per["calibrated"]["cuda"] == 0 and per["calibrated"]["te_current"] == 0
    assert per["calibrated_tiny"]["te_current"] == 0 and per["calibrated_tiny"]["cuda"] > 0
    assert m.matched == ("te_current",)
    # where cuda and TE part: exactly the experts with 0 < amax <= 2**-24
    tiny = next(c for c in m.cases if c.case == "calibrated_tiny")
    cuda = next(v for v in tiny.variants if v.variant == "cuda")
    parted = {o.amax for o in cuda.offenders}
    assert parted and all(0 < a <= 2.0**-24 for a in parted)
    assert 0.0 in TINY_CALIBRATED_AMAX and 2.0**-24 * (1 + 2.0**-7) in TINY_CALIBRATED_AMAX
    row = variants_row(m, EXPECTED[("te-current", "fp8_e4m3")], "repro")
    assert row.verdict == "pass" and "calibrated_tiny: te_current" in row.fields["per_case"]
    assert "calibrated: cuda" in row.fields["per_case"]


def test_x_equal_amax_two_to_minus_25():
    from moe_fq_parity import reference

    x = torch.tensor([[2.0**-25, -(2.0**-25)]], dtype=torch.bfloat16)
    a = torch.tensor(2.0**-25)
    assert reference.fake_quant(x, a, "fp8_e4m3", "te_current").tolist() == [[2.0**-25, -(2.0**-25)]]
    assert reference.fake_quant(x, a, "fp8_e4m3", "cuda").tolist() == [[0.0, -0.0]]
    assert torch.equal(TECurrentScalingEmulation().fake_quant([x], a, "fp8_e4m3")[0], x)
