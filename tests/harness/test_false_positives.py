"""No false positives: correct backends that differ only where the specification leaves freedom pass
every check of the ``ci`` suite (``tests/harness/correct_backends.py``); the NaN policy is one, stated
in ``harness.core.equality``, and ``--nan-bits strict`` reports NaN bits as their own class.

The mutants staying killed is ``tests/selftest/test_selftest.py::test_every_mutant_is_killed_and_controls_pass``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.core.equality import bit_diff, bitwise, same_bits
from moe_fq_parity.harness.core.records import CHECKS
from moe_fq_parity.harness.core.ulp import compare
from moe_fq_parity.harness.run.cli import main

from . import correct_backends

MODULE = "tests.harness.correct_backends"


def _run(tmp_path: Path, *backends: str, extra: tuple[str, ...] = ()) -> tuple[int, dict]:
    out = tmp_path / "r"
    named = [a for b in backends for a in ("--backend", f"{MODULE}:{b}")]
    rc = main(["run", "--suite", "ci", *named, "--no-sections", "--no-progress", "--in-process", "--out", str(out), *extra])
    return rc, json.loads((out / "report.json").read_text())


def test_correct_backends_pass_every_ci_check(tmp_path):
    """Every correct but unusual backend at once (one run: the cases and the reference are built
    once for all of them, half the time of a run each): no check fails any of them, and each check
    passes something (none accepts nothing)."""
    from moe_fq_parity.reference import format_spec

    rc, report = _run(tmp_path, *correct_backends.ALL)
    fails = [(r["key"], r["message"][:200]) for r in report["records"] if r["verdict"] == "fail"]
    assert not fails, fails
    assert rc == 0
    for backend in correct_backends.ALL:
        mine = [r for r in report["records"] if r["backend"] == f"{MODULE}:{backend}"]
        passed = {r["check"] for r in mine if r["verdict"] == "pass"}
        # a backend of formats without amax (MX) has no amax to recalibrate: that check skips with the reason
        no_amax = all(not format_spec(f).takes_amax for f in getattr(correct_backends, backend).formats)
        want = set(CHECKS) - {"perf"} - ({"invariant.recalibrate"} if no_amax else set())
        assert passed == want, f"{backend}: checks that accepted nothing: {want - passed}"


def test_numpy_backend_under_strict_nan_bits_fails_only_on_nan_bits_with_that_diagnosis(tmp_path):
    rc, report = _run(tmp_path, "numpy_fp32", extra=("--nan-bits", "strict"))
    fails = [r for r in report["records"] if r["verdict"] == "fail"]
    assert rc == 1 and fails and report["meta"]["nan_bits"] == "strict"
    assert {r["check"] for r in fails} == {"forward", "invariant.recalibrate"}
    for r in fails:
        assert r["counts"]["nan_bits"] > 0 and r["counts"]["error"] == 0, r["counts"]
        assert "stale" not in r["message"] and "NaN with other bits" in r["message"], r["message"]
        assert {o["cls"] for o in r["offenders"]} == {"nan_bits"}
        assert {(o["expected_bits"], o["got_bits"]) for o in r["offenders"]} == {("0x7FFF", "0x7FC0")}
        assert "--nan-bits strict" in r["repro"]


def test_policy_nan_payload_signed_zero_and_nan_vs_number():
    bf = torch.bfloat16
    canon = torch.tensor([0x7FFF], dtype=torch.int16).view(bf)
    quiet_neg = torch.tensor([-0x40], dtype=torch.int16).view(bf)  # 0xFFC0: sign set, other payload
    assert bool(torch.isnan(quiet_neg).all())
    assert bool(same_bits(canon, quiet_neg).all()) and not bool(same_bits(canon, quiet_neg, "strict").all())
    pz, nz = torch.tensor([0.0], dtype=bf), torch.tensor([-0.0], dtype=bf)
    assert not bool(same_bits(pz, nz).any())  # -0 vs +0 differs wherever bits are demanded
    one = torch.tensor([1.0], dtype=bf)
    assert not bool(same_bits(canon, one).any()) and not bool(same_bits(one, canon).any())
    # compare (forward): NaN payload exact by default, its own class under strict, NaN vs number an error
    assert compare(canon, quiet_neg).counts["exact"] == 1
    assert compare(canon, quiet_neg, nan_bits="strict").counts["nan_bits"] == 1
    assert compare(canon, one, nan_bits="strict").counts["error"] == 1 and compare(canon, one).counts["error"] == 1
    c = compare(pz, nz)
    assert c.signed_zero == 1 and not c.passes("strict") and c.passes("1-ulp")
    # bitwise: the same rules, NaN bits counted apart from errors
    b = bitwise(torch.cat([canon, pz, one]), torch.cat([quiet_neg, nz, canon]), "strict")
    assert b.counts == {"exact": 0, "ulp1": 0, "tie_flip": 0, "nan_bits": 1, "error": 2}
    d = bit_diff([torch.cat([canon, one])], [torch.cat([quiet_neg, one])], nan_bits="strict")
    assert d.mismatches == 1 and d.nan_bits == 1 and "0x7FFF" in d.summary() and "0xFFC0" in d.summary()
    assert bit_diff([torch.cat([canon, one])], [torch.cat([quiet_neg, one])]).equal


def test_unknown_nan_bits_policy_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--nan-bits", "loose", "--out", str(tmp_path / "x")])
    assert exc.value.code == 2 and "--nan-bits" in capsys.readouterr().err
    with pytest.raises(ValueError, match="nan_bits must be one of"):
        same_bits(torch.zeros(1), torch.zeros(1), "loose")
