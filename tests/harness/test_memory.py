"""Memory: the chunked reference gives the same bits, out of memory is its own outcome, the pytest
plugin drops a case's tensors, and (on a GPU) every check of the Ultra case stays within the budget."""

from __future__ import annotations

import gc
import json
import weakref
from types import SimpleNamespace

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.cases import Case, make_inputs, select, suite
from moe_fq_parity.harness.backends import load
from moe_fq_parity.harness.backends.reference_backend import ReferenceBackend, expert_chunks
from moe_fq_parity.harness.checks import DEFAULT_CHECKS, CheckContext, expected_forward, run_case_checks
from moe_fq_parity.harness.core import memory
from moe_fq_parity.harness.run import plugin_checks
from moe_fq_parity.harness.run.plugin_options import ParitySettings
from moe_fq_parity.harness.run.plugin_state import ParitySession
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.run.diff import diff_reports
from moe_fq_parity.reports.schema import validate

from . import broken_backends

BROKEN = "tests.harness.broken_backends"
BIG = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"  # 1280 elements: over broken_backends.OOM_NUMEL
SMALL = "int8.cuda/per_expert/stacked/N1/8x40/outliers/s0"  # 320 elements


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


def _stacked_cases() -> list[Case]:
    return [c for c in suite("ci") if c.layout == "stacked" and c.n > 1 and not c.option_dict.get("block_amax")]


def test_expert_chunks_cover_every_expert_once_in_whole_experts():
    assert list(expert_chunks(5, 10, 25)) == [(0, 2), (2, 4), (4, 5)]
    assert list(expert_chunks(3, 100, 10)) == [(0, 1), (1, 2), (2, 3)]  # an expert larger than a chunk is one chunk
    assert list(expert_chunks(4, 10, 10**9)) == [(0, 4)]
    with pytest.raises(ValueError, match="chunk_elements must be a positive int"):
        ReferenceBackend(chunk_elements=0)


def test_chunked_reference_gives_the_bits_of_one_call_over_the_stack():
    """Every stacked ci case, every format/variant/granularity: chunks of 1-2 experts == one call."""
    cases = _stacked_cases()
    assert {c.fmt for c in cases} == set(reference.FORMATS) and {c.granularity for c in cases} == {"per_expert", "per_channel", "from_data"}
    compared = 0
    for case in cases:
        inputs = make_inputs(case, 1234)
        stacked = torch.stack(inputs.weights)
        opts = dict(case.option_dict)
        chunked = ReferenceBackend(chunk_elements=max(1, 2 * inputs.weights[0].numel() - 1))  # one expert per chunk
        pairs = ReferenceBackend(chunk_elements=2 * inputs.weights[0].numel())  # two experts per chunk
        assert len(list(expert_chunks(case.n, inputs.weights[0].numel(), chunked.chunk_elements))) == case.n
        try:
            whole = reference.fake_quant(stacked, inputs.amax, case.fmt, case.variant, **opts)
        except ValueError:  # NVFP4 NaN input: the chunked paths must reject it too
            with pytest.raises(ValueError):
                chunked.fake_quant_stacked(stacked, inputs.amax, case.fmt, case.variant, **opts)
            continue
        for backend in (chunked, pairs):
            got_stacked = backend.fake_quant_stacked(stacked, inputs.amax, case.fmt, case.variant, **opts)
            got_list = torch.stack(backend.fake_quant(inputs.weights, inputs.amax, case.fmt, case.variant, **opts))
            assert torch.equal(_bits(got_stacked), _bits(whole)), case.id
            assert torch.equal(_bits(got_list), _bits(whole)), case.id
        compared += 1
    assert compared > 40


def test_the_bit_comparison_sees_one_expert_with_another_amax():
    """The comparison above is not blind: one expert quantized with a neighbour's amax differs."""
    case = next(c for c in _stacked_cases() if c.fmt == "int8" and c.granularity == "per_expert" and c.dist == "normal")
    inputs = make_inputs(case, 1234)
    stacked = torch.stack(inputs.weights)
    whole = reference.fake_quant(stacked, inputs.amax, case.fmt, case.variant)
    wrong = inputs.amax.clone()
    wrong[1] = wrong[0] * 1.5
    got = ReferenceBackend(chunk_elements=1).fake_quant_stacked(stacked, wrong, case.fmt, case.variant)
    assert not torch.equal(_bits(got), _bits(whole))


def test_reference_outputs_equal_the_traced_outputs():
    for case in select(suite("ci"), formats=["nvfp4", "fp8_e4m3"])[:20]:
        inputs = make_inputs(case, 1234)
        expected = expected_forward(inputs)
        if expected.error is not None:
            continue
        per = reference.split_expert_amax(inputs.weights, inputs.amax)
        for w, a, out in zip(inputs.weights, per, expected.outputs):
            traced = reference.fake_quant_traced(w, a, case.fmt, case.variant, **case.option_dict)
            assert torch.equal(_bits(traced.out), _bits(out)), case.id


def test_forward_traces_only_the_experts_that_mismatch(monkeypatch):
    from moe_fq_parity.harness.checks import forward

    traced = []
    real = forward.trace_expert
    monkeypatch.setattr(forward, "trace_expert", lambda inputs, e, amax=None: traced.append(e) or real(inputs, e, amax))
    inputs = make_inputs(Case.from_id(BIG), 1234)
    ok = run_case_checks(CheckContext(load("reference"), inputs, 1234), ["forward"])[0]
    assert ok.verdict == "pass" and traced == []
    bad = run_case_checks(CheckContext(load(f"{BROKEN}:OneUlpHigh"), inputs, 1234), ["forward"])[0]
    assert bad.verdict == "fail" and traced == [3]  # OneUlpHigh bumps the last expert only
    assert bad.offenders and all(o.expert == 3 and o.pre_round is not None for o in bad.offenders)


def _cli(tmp_path, name: str, *args: str) -> tuple[int, dict]:
    out = tmp_path / name
    # in process: the tests look at this process's backend buffers and patch its input building
    rc = main(["run", "--no-progress", "--no-sections", "--in-process", "--out", str(out), *args])
    return rc, json.loads((out / "report.json").read_text())


def test_backend_out_of_memory_is_its_own_outcome_and_the_next_case_runs(tmp_path, capsys):
    broken_backends.HELD.clear()
    rc, report = _cli(tmp_path, "oom", "--backend", f"{BROKEN}:OutOfMemoryOnLarge", "--case", BIG, "--case", SMALL)
    validate(report)
    err = capsys.readouterr().err
    assert rc == 1 and report["complete"]
    big = [r for r in report["records"] if r["case_id"] == BIG]
    small = [r for r in report["records"] if r["case_id"] == SMALL]
    assert {r["check"] for r in big} == set(DEFAULT_CHECKS)
    assert all(r["outcome"] == "oom" and r["verdict"] == "fail" for r in big), [r["message"] for r in big]
    for r in big:
        assert r["message"].startswith("out of memory in the backend call (not a parity verdict) for case " + BIG)
        assert "(0.00 GB = 5120 bytes input + output)" in r["message"] and "free" in r["message"] and "CUDA out of memory" in r["message"]
        assert "differ" not in r["message"] and r["counts"] == {} and r["case_bytes"] == 2 * 1280 * 2
    assert small and all(r["outcome"] == "checked" and r["verdict"] == "pass" for r in small)
    gc.collect()
    assert broken_backends.HELD and all(ref() is None for ref in broken_backends.HELD)  # the failed calls' buffers were freed
    assert "checks ran out of memory" in err and BIG in err
    rc_ok, good = _cli(tmp_path, "good", "--backend", "reference", "--case", BIG, "--case", SMALL)
    good["records"] = [dict(r, backend=f"{BROKEN}:OutOfMemoryOnLarge", key=r["key"].replace("|reference|", f"|{BROKEN}:OutOfMemoryOnLarge|"))
                       for r in good["records"]]
    diff = diff_reports(good, report)
    assert rc_ok == 0 and len(diff.regressions) == len(big)
    assert all(x.startswith("out of memory (no verdict): " + BIG) for x in diff.regressions)


def test_out_of_memory_while_building_a_case_names_it_and_the_run_goes_on(tmp_path, monkeypatch):
    from moe_fq_parity.harness.run import chunks

    real = chunks.make_inputs

    def make_inputs(case, seed, device):
        if case.id == BIG:
            raise torch.OutOfMemoryError("CUDA out of memory (simulated while building)")
        return real(case, seed, device)

    monkeypatch.setattr(chunks, "make_inputs", make_inputs)
    rc, report = _cli(tmp_path, "build", "--backend", "reference", "--case", BIG, "--case", SMALL)
    big = [r for r in report["records"] if r["case_id"] == BIG]
    assert rc == 1 and len(big) == 1 and big[0]["outcome"] == "oom"
    assert "building the case inputs and reference outputs" in big[0]["message"] and BIG in big[0]["message"]
    assert all(r["verdict"] == "pass" for r in report["records"] if r["case_id"] == SMALL)


def test_out_of_memory_inside_a_check_is_an_oom_record(monkeypatch):
    from moe_fq_parity import harness

    def explode(ctx, mode):
        raise torch.OutOfMemoryError("CUDA out of memory (simulated in the comparison)")

    monkeypatch.setattr(harness.checks, "check_backward", explode)
    inputs = make_inputs(Case.from_id(BIG), 1234)
    recs = run_case_checks(CheckContext(load("reference"), inputs, 1234), ["forward", "backward.clipped"])
    assert [r.outcome for r in recs] == ["checked", "oom"]
    assert recs[1].verdict == "fail" and "the check's own computation" in recs[1].message


def test_a_record_cannot_be_an_oom_pass():
    from moe_fq_parity.harness.core.records import CheckRecord

    with pytest.raises(ValueError, match="out-of-memory record has verdict 'fail'"):
        CheckRecord(case_id="x", backend="b", check="forward", verdict="pass", fmt="int8", n=1, numel=1, outcome="oom")
    with pytest.raises(ValueError, match="outcome must be one of"):
        CheckRecord(case_id="x", backend="b", check="forward", verdict="fail", fmt="int8", n=1, numel=1, outcome="exploded")


def _item(case):
    return SimpleNamespace(callspec=SimpleNamespace(params={"parity_case": case}))


def test_plugin_keeps_a_case_only_while_the_next_test_checks_it():
    a, b = Case.from_id(BIG), Case.from_id(SMALL)
    state = ParitySession(ParitySettings(report_dir=None, seed=1, suite=None, backends=(), mode="strict", timeout_s=None,
                                         hypothesis_profile=None))
    first = plugin_checks.case_tensors(state, a, 1, "cpu")
    assert plugin_checks.case_tensors(state, a, 1, "cpu") is first  # consecutive checks share the tensors
    held = weakref.ref(first.inputs.weights[0])
    plugin_checks.teardown(state, _item(a), _item(a))
    assert state.current is not None and held() is not None
    del first
    plugin_checks.teardown(state, _item(a), _item(b))
    gc.collect()
    assert state.current is None and held() is None
    plugin_checks.case_tensors(state, b, 1, "cpu")
    plugin_checks.teardown(state, _item(b), None)  # last test of the session (or of the worker's queue)
    assert state.current is None


ULTRA = [c for c in suite("ultra") if c.n == 32 and c.shape == (5120, 8192)]


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["reference", "triton", "eager-loop"])
@pytest.mark.parametrize("case", ULTRA, ids=[c.id for c in ULTRA])
def test_every_check_of_the_ultra_case_stays_within_the_memory_budget(case, backend):
    """Peak of each check <= BUDGET_FACTOR x input + output bytes, counted from before the case's tensors."""
    lb = load(backend)
    if not lb.available:
        pytest.skip(f"backend {backend} unavailable: {lb.reason}")
    device = torch.device("cuda")
    memory.release(device)
    before = torch.cuda.memory_allocated(device)
    inputs = make_inputs(case, 1234, "cuda")
    expected = expected_forward(inputs)
    ctx = CheckContext(lb, inputs, 1234, mem_base=before)
    records = run_case_checks(ctx, list(DEFAULT_CHECKS) + ["perf"], expected)
    budget = memory.BUDGET_FACTOR * inputs.nbytes
    lines = [f"{r.check}: {r.verdict} {memory.budget_text(r.peak_bytes, r.case_bytes)} {r.message[:120]}" for r in records]
    assert all(r.outcome == "checked" and r.verdict != "fail" for r in records), "\n".join(lines)
    assert all(r.peak_bytes is not None and r.peak_bytes <= budget for r in records if r.verdict == "pass"), "\n".join(lines)
    del inputs, expected, ctx
    memory.release(device)
    assert torch.cuda.memory_allocated(device) - before < 64 << 20, "the case's tensors outlived the test"


def test_tidy_collects_only_when_memory_outlived_its_test(monkeypatch):
    """Between GPU tests: a full garbage collection (0.2-0.4 s in a pytest process) only when more
    than ``keep_bytes`` + slack is still allocated; the cache emptied only when much of it is unused."""
    import gc

    from moe_fq_parity.harness.core import memory

    state = {"allocated": 0, "reserved": 0}
    calls = {"gc": 0, "empty": 0}
    cuda = memory.torch.cuda
    monkeypatch.setattr(cuda, "is_available", lambda: True)
    monkeypatch.setattr(cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(cuda, "current_device", lambda: 0)
    monkeypatch.setattr(cuda, "memory_allocated", lambda dev=None: state["allocated"])
    monkeypatch.setattr(cuda, "memory_reserved", lambda dev=None: state["reserved"])
    monkeypatch.setattr(cuda, "empty_cache", lambda: calls.__setitem__("empty", calls["empty"] + 1))
    monkeypatch.setattr(gc, "collect", lambda *a: calls.__setitem__("gc", calls["gc"] + 1) or 0)
    slack = memory.TIDY_SLACK_BYTES
    state.update(allocated=5 << 30, reserved=(5 << 30) + slack // 2)
    memory.tidy(keep_bytes=5 << 30)  # holds what it should, little unused cache: nothing to do
    assert calls == {"gc": 0, "empty": 0}
    state.update(allocated=(5 << 30) + slack + 1, reserved=(7 << 30) + 2 * slack)
    memory.tidy(keep_bytes=5 << 30)  # more than it should hold, and a large unused cache
    assert calls == {"gc": 1, "empty": 1}
    memory.tidy(keep_bytes=None)  # no expectation given: always collect
    assert calls["gc"] == 2
    assert memory.allocated_here() == state["allocated"]
