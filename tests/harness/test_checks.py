"""Checks: every failure path of a backend becomes a recorded failure, never a pass or a crash."""

from __future__ import annotations

import pytest

from moe_fq_parity.cases import Case, make_inputs
from moe_fq_parity.harness.backends import BackendLoadError, load
from moe_fq_parity.harness.checks import CheckContext, run_case_checks
from moe_fq_parity.harness.core.records import CheckRecord

BROKEN = "tests.harness.broken_backends"


def _case(**kw) -> Case:
    base = dict(fmt="int8", variant="cuda", granularity="per_expert", layout="stacked", n=4, shape=(8, 40), dist="normal")
    return Case(**(base | kw))


def _run(spec: str, case: Case, checks=("forward",), mode="strict", timeout_s=60.0) -> dict[str, CheckRecord]:
    lb = load(spec)
    ctx = CheckContext(lb, make_inputs(case, 1234, lb.device or "cpu"), 1234, mode, timeout_s)
    return {r.check: r for r in run_case_checks(ctx, checks)}


ALL = ("forward", "backward.pass_through", "backward.clipped", "invariant.layout", "invariant.grouped")


@pytest.mark.parametrize("case", [
    _case(dist="ties", amax="design"), _case(fmt="nvfp4", variant="te", dist="nan"),
    _case(layout="ragged", n=6, shape=(9, 21), empty=2, dist="special", amax="design"),
    _case(fmt="fp8_e4m3", granularity="per_channel", dist="edges", amax="design"),
], ids=lambda c: c.id)
@pytest.mark.parametrize("spec", ["reference", "eager-loop"])
def test_builtin_backends_pass_everything(spec, case):
    recs = _run(spec, case, ALL)
    assert all(r.verdict != "fail" for r in recs.values()), {k: r.message for k, r in recs.items()}
    assert recs["forward"].verdict == "pass"


def test_op_order_flip_is_a_tie_flip_with_offenders_and_repro():
    case = _case(n=8, shape=(16, 64), dist="neartie", amax="design")
    rec = _run(f"{BROKEN}:StepVariant", case)["forward"]
    assert rec.verdict == "fail" and rec.counts["tie_flip"] > 0 and rec.counts["error"] == 0
    o = rec.offenders[0]
    assert o.cls == "tie_flip" and o.pre_round is not None and abs(o.pre_round - round(o.pre_round)) == pytest.approx(0.5, abs=1e-3)
    assert rec.per_expert[o.expert].counts["tie_flip"] > 0
    assert "--case" in rec.repro and case.id in rec.repro and "--seed 1234" in rec.repro


def test_one_ulp_fails_strict_passes_1ulp_and_names_the_expert():
    case = _case(dist="outliers")
    strict = _run(f"{BROKEN}:OneUlpHigh", case)["forward"]
    loose = _run(f"{BROKEN}:OneUlpHigh", case, mode="1-ulp")["forward"]
    assert strict.verdict == "fail" and loose.verdict == "pass" and strict.max_ulp == 1
    assert {o.expert for o in strict.offenders} == {case.n - 1}
    assert [s.counts["ulp1"] > 0 for s in strict.per_expert] == [False] * (case.n - 1) + [True]


@pytest.mark.parametrize("cls, needle", [("Raises", "kernel exploded"), ("WrongDtype", "dtype"), ("WrongShape", "shape"),
                                         ("Nans", "NaN where the reference has none")])
def test_broken_outputs_are_recorded_failures(cls, needle):
    rec = _run(f"{BROKEN}:{cls}", _case())["forward"]
    assert rec.verdict == "fail" and needle in rec.message


def test_timeout_is_a_failure():
    rec = _run(f"{BROKEN}:Sleeps", _case(), timeout_s=0.3)["forward"]
    assert rec.verdict == "fail" and "timed out" in rec.message and rec.duration_s < 5


def test_clipped_backward_at_amax_is_bit_exact():
    case = _case(dist="edges", amax="design")
    recs = _run(f"{BROKEN}:ClipExclusive", case, ("backward.pass_through", "backward.clipped"))
    assert recs["backward.pass_through"].verdict == "pass"
    bad = recs["backward.clipped"]
    assert bad.verdict == "fail" and all(abs(o.input) == o.pre_round for o in bad.offenders)


def test_grouped_invariant_catches_a_shared_amax():
    recs = _run(f"{BROKEN}:GroupedDiffers", _case(dist="spread"), ("invariant.grouped", "invariant.layout"))
    assert recs["invariant.grouped"].verdict == "fail" and recs["invariant.layout"].verdict == "pass"


def test_accepting_what_the_spec_rejects_fails():
    rec = _run(f"{BROKEN}:AcceptsNan", _case(fmt="nvfp4", variant="modelopt_static", dist="nan"))["forward"]
    assert rec.verdict == "fail" and "rejects" in rec.message


def test_not_implemented_is_a_skip_with_reason_unless_the_format_is_declared():
    class Partial:
        name, formats = "partial", {"int8"}

        def fake_quant(self, weights, amax, fmt, **options):
            raise NotImplementedError("no such variant here")

    from moe_fq_parity.harness import backends as hb

    lb = hb.LoadedBackend("partial", Partial(), True, "", "cpu")
    rec = run_case_checks(CheckContext(lb, make_inputs(_case(variant="eager")), 1), ["forward"])[0]
    assert rec.verdict == "skip" and "no such variant" in rec.message  # a non-default variant may be declined
    rec = run_case_checks(CheckContext(lb, make_inputs(_case()), 1), ["forward"])[0]
    assert rec.verdict == "fail" and "declined a format it declares" in rec.message  # int8 is declared
    rec = run_case_checks(CheckContext(lb, make_inputs(_case(fmt="fp8_e4m3")), 1), ["forward", "backward.clipped"])
    assert [r.verdict for r in rec] == ["skip", "skip"]


def test_refusing_an_option_is_a_skip_but_refusing_a_default_call_fails():
    class OnlyDefaults:
        name, formats = "only-defaults", set(["nvfp4", "int8"])

        def fake_quant(self, weights, amax, fmt, **options):
            raise ValueError(f"not implemented: {sorted(options)}")

    from moe_fq_parity.harness import backends as hb

    lb = hb.LoadedBackend("only-defaults", OnlyDefaults(), True, "", "cpu")
    opt = _case(fmt="nvfp4", variant="te", shape=(8, 64), options=(("block_size", 32),))
    assert run_case_checks(CheckContext(lb, make_inputs(opt), 1), ["forward"])[0].verdict == "skip"
    assert run_case_checks(CheckContext(lb, make_inputs(_case()), 1), ["forward"])[0].verdict == "fail"


@pytest.mark.parametrize("spec, needle", [("nosuch_pkg.mod:obj", "cannot import module"), (f"{BROKEN}:Missing", "no attribute"),
                                          (f"{BROKEN}:NoName", "does not meet the contract"), ("bogus", "unknown backend")])
def test_external_loader_messages(spec, needle):
    with pytest.raises(BackendLoadError, match=needle):
        load(spec)


def test_record_json_round_trip():
    rec = _run(f"{BROKEN}:OneUlpHigh", _case())["forward"]
    assert CheckRecord.from_json(rec.to_json()) == rec
