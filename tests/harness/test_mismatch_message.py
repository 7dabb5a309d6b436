"""Failure messages in plain words: every kind of difference is named in the headline (never a
"max 0 ULP" with the reason only in the details), a tie flip is one grid step (never a billion ULP
on fp32 output), and the recalibration check says how its failure relates to the forward check."""

import torch

from moe_fq_parity.cases import make_inputs, parse_case
from moe_fq_parity.harness.backends import load
from moe_fq_parity.harness.checks import CheckContext, check_forward, check_recalibrate, expected_forward
from moe_fq_parity.harness.checks.common import mismatch_message
from moe_fq_parity.harness.core.records import ExpertStats

MODULE = "tests.harness.test_mismatch_message"


def _fields(**counts) -> dict:
    c = {"exact": 100, "ulp1": 0, "tie_flip": 0, "nan_bits": 0, "error": 0} | counts
    c["exact"] = 100 - sum(v for k, v in counts.items() if k != "exact")
    return {"counts": c, "signed_zero": 0, "per_expert": (ExpertStats(0, 100, 1.0, 0, c),), "max_ulp": 0, "nan_mismatch": 0, "inf_mismatch": 0}


def test_sign_of_zero_only_failure_says_so_in_the_headline():
    fields = _fields() | {"signed_zero": 7}
    assert mismatch_message(fields, 100) == "7 of 100 elements differ: 7 differ in the sign of zero (+0 vs -0: 0 ULP apart, other bits)"
    assert mismatch_message(fields | {"signed_zero": 0}, 100) == ""
    # bitwise checks count a sign of zero as an error of 0 ULP: still named as a sign of zero
    bitwise = _fields(error=3) | {"signed_zero": 3}
    msg = mismatch_message(bitwise, 100, bitwise=True)
    assert msg.startswith("3 of 100 elements differ in experts [0]: 3 differ in the sign of zero") and "wrong value" not in msg


def test_nan_payload_is_named_in_the_headline():
    msg = mismatch_message(_fields(nan_bits=2), 100)
    assert msg.startswith("2 of 100 elements differ in experts [0]: 2 are NaN with other bits than the reference's NaN")


def test_kinds_each_counted_and_max_ulp_only_for_wrong_values():
    f = _fields(ulp1=1, tie_flip=2, error=3) | {"max_ulp": 40}
    msg = mismatch_message(f, 100)
    assert "1 is 1 ULP apart" in msg and "2 are tie flips" in msg and "3 are wrong values (up to 40 ULP apart)" in msg


class HalfAwayFromZero:
    """INT8 ``cuda`` variant with C's ``round`` (half away from zero): off by one grid step on ties."""

    name = "half-away"
    formats = {"int8"}
    device = "cpu"

    @staticmethod
    def rounded(v: torch.Tensor) -> torch.Tensor:
        return torch.where(v < 0, -torch.floor(-v + 0.5), torch.floor(v + 0.5))

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = []
        for x, a in zip(weights, amax):
            a = a.reshape(-1, 1) if a.dim() else a
            s = torch.full_like(a, 127.0) / a
            q = torch.clamp(self.rounded(x.float() * s), -128, 127)
            out.append(torch.where(a < 2.0**-24, torch.zeros_like(q), q / s).to(x.dtype))
        return out


def _ctx(case_id: str, backend: str = "HalfAwayFromZero") -> CheckContext:
    case = parse_case(case_id)
    return CheckContext(load(f"{MODULE}:{backend}"), make_inputs(case, 1234, "cpu"), 1234)


FP32_TIES = "int8.cuda/per_expert/list/N4/16x40.fp32/ties@design/s0"


def test_tie_flip_on_fp32_output_is_one_grid_step_not_a_billion_ulp():
    ctx = _ctx(FP32_TIES)
    rec = check_forward(ctx, expected_forward(ctx.inputs))
    assert rec.verdict == "fail" and rec.counts["tie_flip"] > 0 and rec.counts["error"] == 0, rec.message
    assert rec.max_ulp == 0 and "wrong value" not in rec.message, rec.message  # the tie flips are no ULP distance
    assert "tie flips" in rec.message and "one grid step" in rec.message
    assert {o.cls for o in rec.offenders} == {"tie_flip"} and all(o.ulp is None and o.pre_round % 1 == 0.5 for o in rec.offenders)


class FarOffAtTies(HalfAwayFromZero):
    """Three grid steps off wherever the reference rounds a tie: at a tie, but not a tie flip."""

    @staticmethod
    def rounded(v: torch.Tensor) -> torch.Tensor:
        return torch.where((v - torch.floor(v)) == 0.5, torch.round(v) + 3, torch.round(v))


def test_a_value_far_off_at_a_tie_is_an_error_not_a_tie_flip():
    ctx = _ctx(FP32_TIES, "FarOffAtTies")
    rec = check_forward(ctx, expected_forward(ctx.inputs))
    # only where the clamp at qmax keeps +3 within one step (126.5 -> 127) is it a one-step tie flip
    assert rec.verdict == "fail" and rec.counts["error"] > 400 and rec.counts["tie_flip"] <= 1, rec.message
    assert "wrong value" in rec.message


def test_recalibrate_classifies_as_forward_does_and_points_to_the_forward_failure():
    ctx = _ctx("int8.cuda/per_expert/stacked/N4/16x48/ties@design/s0")
    rec = check_recalibrate(ctx)
    assert rec.verdict == "fail", rec.message
    assert rec.message.startswith("with the amax x 0.6875 (as after recalibration): 3 of 3072 elements differ"), rec.message
    assert "are tie flips" in rec.message and "bitwise" not in rec.message and "stale" not in rec.message
    assert "the forward check of this case fails too (92 elements at the original amax)" in rec.message
    assert {o.cls for o in rec.offenders} == {"tie_flip"} and all(o.pre_round is not None for o in rec.offenders)


def test_recalibrate_of_a_stale_amax_says_so():
    ctx = _ctx("int8.cuda/per_expert/stacked/N4/16x48/outliers/s0", "StaleAmax")
    rec = check_recalibrate(ctx)
    assert rec.verdict == "fail" and "the backend kept using the old amax (a stale amax)" in rec.message, rec.message
    assert "the forward check of this case passes" in rec.message


class StaleAmax(HalfAwayFromZero):
    """Correct at the first amax it sees, which it keeps forever."""

    def __init__(self):
        self._first = None

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        from moe_fq_parity import reference

        if self._first is None:
            self._first = amax.clone()
        return [reference.fake_quant(w, a, "int8") for w, a in zip(weights, self._first)]
