"""A record that fails only on the sign of zero says so (never an empty failure message)."""

from moe_fq_parity.harness.checks.common import mismatch_message


def test_sign_of_zero_only_failure_has_a_message():
    fields = {"counts": {"exact": 100, "ulp1": 0, "tie_flip": 0, "error": 0}, "signed_zero": 7, "per_expert": (), "max_ulp": 0,
              "nan_mismatch": 0, "inf_mismatch": 0}
    assert mismatch_message(fields, 100) == "7 of 100 elements differ in the sign of zero (+0 vs -0; strict mode compares bits)"
    assert mismatch_message(fields | {"signed_zero": 0}, 100) == ""
