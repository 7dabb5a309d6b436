"""Model-Optimizer's eager path (CPU) through the harness: which reference variant it matches.

Measured facts these tests pin (numbers in the README / issue note):

* FP8 eager scales like the ``reciprocal`` variant (``s = RN(RN(1/a) * 448)``), so it differs from
  ``cuda`` by tie flips; but it dequantizes with ``RN(e * RN(1/s))``, not ``RN(e / s)``, so at
  constructed output ties it also differs from ``reciprocal`` by exactly 1 ULP.
* INT eager scales like ``cuda`` (``max_bound / amax`` is a tensor division, one rounding) and
  matches it everywhere except ``amax <= 2**-24``, where it zeroes like ``reciprocal`` (``<=``
  not ``<``, and NaN/inf inputs stay NaN).
* If the reference has an ``eager`` variant, the eager path must match it and only it.
"""

from __future__ import annotations

import math

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.contract import check_backend
from moe_fq_parity.harness.sections.external.checks import calibration_rows, ste_rows
from moe_fq_parity.harness.backends.modelopt_backend import modelopt
from moe_fq_parity.harness.sections.external.variant_match import match_variants
from moe_fq_parity.reference.constants import E4M3_MAX, TINY_AMAX

from .conftest import ReferenceVariant


def by_case(m, variant):
    return {c.case: next(v for v in c.variants if v.variant == variant) for c in m.cases}


def eager_match(backend, fmt, cases):
    """The match of the eager path, all offenders listed; ``None`` once the reference has an
    ``eager`` variant (which it must then match, alone)."""
    m = match_variants(backend, fmt, cases=cases, cap=10**6)
    if "eager" in m.variant_names:
        assert m.matched == ("eager",)
        return None
    assert m.matched == ()
    return m


def test_both_paths_meet_the_contract_and_reject_what_they_do_not_do(modelopt_eager):
    check_backend(modelopt_eager)
    check_backend(modelopt)
    w, a = [torch.ones(2, 16, dtype=torch.bfloat16)], torch.tensor([1.0])
    with pytest.raises(TypeError, match="block_size"):
        modelopt_eager.fake_quant(w, a, "int8", block_size=16)
    with pytest.raises(ValueError, match="no variant"):
        modelopt_eager.fake_quant(w, a, "int8", variant="step")
    with pytest.raises(ValueError, match="nvfp4"):
        modelopt_eager.fake_quant(w, a, "nvfp4")
    ok, why = modelopt_eager.format_available("nvfp4")
    assert not ok and "CUDA" in why
    if not torch.cuda.is_available():
        ok, why = modelopt.available()
        assert not ok and "CUDA" in why


def test_eager_fp8_scales_like_reciprocal_but_dequantizes_like_cuda(modelopt_eager, small_cases):
    m = eager_match(modelopt_eager, "fp8_e4m3", small_cases("fp8_e4m3"))
    if m is None:
        return
    cuda, recip = by_case(m, "cuda"), by_case(m, "reciprocal")
    assert recip["all_bf16"].mismatches == 0 and recip["calibrated"].mismatches == 0
    assert cuda["all_bf16"].mismatches > 0 and set(o.cls for o in cuda["all_bf16"].offenders) == {"tie_flip"}
    off = recip["near_tie/per_tensor"].offenders
    assert off and all(o.cls == "ulp1" and o.ulp == 1 for o in off)
    # fp32 outputs show the dequantization order on a large share of elements
    assert recip["fp32"].mismatches > recip["fp32"].numel // 10 and recip["fp32"].max_ulp == 1
    # every such element: same e4m3 code, but RN(e * RN(1/s)) != RN(e / s)
    for o in off[:20]:
        a = torch.tensor([o.amax], dtype=torch.float32)
        s = torch.reciprocal(a) * E4M3_MAX
        x = torch.tensor([o.input], dtype=torch.float32)
        e = (x * s).to(torch.float8_e4m3fn).to(torch.float32)
        assert (e * torch.reciprocal(s)).to(torch.bfloat16).item() == o.got
        assert (e / s).to(torch.bfloat16).item() == o.expected


def test_eager_int_matches_cuda_except_at_tiny_amax(modelopt_eager, small_cases):
    m = eager_match(modelopt_eager, "int8", small_cases("int8"))
    if m is None:
        return
    cuda, recip = by_case(m, "cuda"), by_case(m, "reciprocal")
    for case in ("near_tie/per_tensor", "near_tie/per_channel", "fp32", "calibrated"):
        assert cuda[case].mismatches == 0, case
    assert recip["near_tie/per_tensor"].mismatches > 0
    off = cuda["all_bf16"].offenders
    assert len(off) == cuda["all_bf16"].mismatches > 0
    assert all(o.amax <= TINY_AMAX for o in off)
    assert any(o.amax == TINY_AMAX for o in off)  # cuda quantizes at exactly 2**-24, eager zeroes
    # at amax 0: NaN/inf inputs give NaN (cuda +0), negative inputs -0 (cuda +0)
    at_zero = [o for o in off if o.amax == 0.0]
    nonfinite = [o for o in at_zero if not math.isfinite(o.input)]
    assert nonfinite and all(o.expected_bits == "0x0000" and math.isnan(o.got) for o in nonfinite)
    assert all(o.cls == "signed_zero" and math.copysign(1.0, o.input) < 0 and o.got_bits == "0x8000" for o in at_zero if math.isfinite(o.input))


def test_eager_backward_and_calibration_match_the_reference(modelopt_eager):
    rows = [r for fmt in ("int8", "fp8_e4m3") for r in ste_rows(modelopt_eager, fmt, 0, "t")]
    rows += calibration_rows(modelopt_eager, 0, "t")
    assert len(rows) == 2 * 4 + 2
    assert [r.id for r in rows if r.verdict != "pass"] == []


class ZeroGrad(ReferenceVariant):
    """Pass-through gradient replaced by zeros: the STE rows must catch it."""

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        return [torch.zeros_like(g) for g in grads]


def test_ste_rows_catch_a_wrong_gradient():
    rows = ste_rows(ZeroGrad("cuda"), "int8", 0, "t")
    assert {r.verdict for r in rows} == {"fail"}
    assert all(r.fields["mismatches"] > 0 for r in rows)


class RuleSequence:
    """A backend whose clipped backward follows ``rules[k]`` on its k-th call (then the last rule);
    the rule ``"zeroed"`` returns zero gradients (a call that follows no clip rule)."""

    device = "cpu"
    formats = {"int8"}

    def __init__(self, name, rules):
        self.name, self.rules, self.calls = name, rules, 0

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        rule = self.rules[min(self.calls, len(self.rules) - 1)]
        self.calls += 1
        if rule == "zeroed":
            return [torch.zeros_like(g) for g in grads]
        return reference.ste_backward_experts(weights, amax, grads, mode, clip_rule=rule)


TP, F32 = "torch_promotion", "fp32"


@pytest.mark.parametrize("name,rules,verdict,per_call", [
    ("modelopt-eager", [TP], "pass", "torch_promotion x7"),
    ("modelopt-eager", [F32], "fail", "fp32 x7"),
    ("modelopt-eager", [TP, F32], "fail", "torch_promotion x1, fp32 x6"),
    ("modelopt", [TP, TP, F32], "pass", "torch_promotion x2, fp32 x5"),
    ("modelopt", [F32], "pass", "fp32 x7"),
    ("modelopt", [TP], "pass", "torch_promotion x7"),
    # the order in which TorchScript's profiling executor fuses is not a rule: any interleaving passes
    ("modelopt", [TP] * 3 + [F32], "pass", "torch_promotion x3, fp32 x4"),
    ("modelopt", [F32, TP], "pass", "fp32 x1, torch_promotion x6"),
    ("modelopt", [TP, F32, F32, TP, F32], "pass", "torch_promotion x1, fp32 x2, torch_promotion x1, fp32 x3"),
    # a call that follows neither rule fails the row, wherever it is
    ("modelopt", [TP, F32, F32, "zeroed", F32], "fail", "torch_promotion x1, fp32 x2, none x1, fp32 x3"),
    ("modelopt", ["zeroed"], "fail", "none x7"),
    ("other", [F32, TP], "pass", "fp32 x1, torch_promotion x6"),
    ("other", [TP, "zeroed", TP], "fail", "torch_promotion x1, none x1, torch_promotion x5"),
])
def test_clip_rule_fingerprint_follows_calls(name, rules, verdict, per_call):
    from moe_fq_parity.harness.sections.external.checks import clip_rule_row

    row = clip_rule_row(RuleSequence(name, rules), "int8", 0, "t")
    assert row.verdict == verdict and row.fields["per_call"] == per_call, row
