"""The MoE report section: every row passes on the smoke suite, and every kind of check can fail.

The mutation tests break one thing in a calibrated bench (an amax, a spec, the data, a
state-dict converter) and assert that exactly the rows that should notice it fail.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from moe_fq_parity.harness.sections.moe import checks_state as checks_state
from moe_fq_parity.harness.sections.moe import quantized as quantized
from moe_fq_parity.harness.sections.moe.bench import build_bench
from moe_fq_parity.harness.sections.moe.checks_input import input_rows
from moe_fq_parity.harness.sections.moe.checks_state import layout_rows, quantizer_state_rows
from moe_fq_parity.harness.sections.moe.checks_weight import weight_rows
from moe_fq_parity.harness.sections.moe.compare import RowSink
from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe
from moe_fq_parity.harness.sections.moe.section import SUITES, run
from moe_fq_parity.harness.sections import Section

SHAPE = ExpertShape(4, 16, 32, 24)
SPECS = {
    "fp8": (QuantSpec("fp8_e4m3", "per_tensor"), QuantSpec("fp8_e4m3", "per_tensor")),
    "int8_pc": (QuantSpec("int8", "per_channel"), QuantSpec("int8", "per_tensor")),
    "nvfp4": (QuantSpec("nvfp4", "per_tensor"), QuantSpec("nvfp4", "per_tensor")),
}


@pytest.fixture(scope="module")
def smoke() -> Section:
    return run("smoke", 0, "cpu")


def test_smoke_section_passes_with_every_check_for_three_formats(smoke):
    assert smoke.name == "moe" and smoke.verdict == "pass"
    failing = [(r.id, r.message) for r in smoke.rows if r.verdict == "fail"]
    assert failing == []
    ids = [r.id for r in smoke.rows]
    assert len(ids) == len(set(ids)), "row ids must be unique"
    for fmt in ("fp8_e4m3/per_tensor", "int8/per_channel", "nvfp4/per_tensor"):
        for check in ("amax/shared_eq_max_sequential", "amax/n_quantizer_eq_sequential", "amax/one_vector_flat_eq_sequential",
                      "fq_weight/n_quantizer_eq_sequential", "output/n_quantizer_eq_sequential/calib", "data/weight_amax_differ",
                      "data/input_amax_differ", "equivalence/grouped_shared~sequential_synced/calib", "state_dict/quantizer/roundtrip/flat"):
            assert any(f"twin/{fmt}/" in i and f"/{check}/" in i for i in ids), (fmt, check)
    assert any("/state_dict/roundtrip/packed/" in i for i in ids)
    assert all(r.repro.startswith("python -m moe_fq_parity.harness.sections.moe") and r.id in r.repro for r in smoke.rows if r.verdict != "skip")
    assert set(smoke.columns) <= set().union(*(r.fields for r in smoke.rows))


def test_real_te_rows_skip_with_reason_on_cpu(smoke):
    te = [r for r in smoke.rows if r.id.startswith("te/")]
    assert len(te) == 1 and te[0].verdict == "skip" and te[0].message


def test_suites_and_bad_suite():
    assert {"smoke", "ci", "nightly"} <= set(SUITES)
    with pytest.raises(ValueError, match="unknown suite"):
        run("weekly", 0, "cpu")


def _bench(spec="fp8", shape=SHAPE, data=None):
    w, i = SPECS[spec]
    data = data or make_expert_data(shape, seed=5)
    return build_bench(Recipe.uniform(["fc1"], w, i), "fc1", shape, data, backend="twin", device="cpu")


def _verdicts(bench, fn=None) -> dict[str, str]:
    sink = RowSink("t", "smoke", 0, "cpu")
    (fn or (lambda b, s: (weight_rows(b, s), input_rows(b, s))))(bench, sink)
    return {_key(r.id): r.verdict for r in sink.rows}


def _key(row_id: str) -> str:
    """``t/grouped_linear/weight/fc1/amax/x/s0`` -> ``amax/x`` (the check name)."""
    return row_id.split("/", 4)[4].rsplit("/", 1)[0]


def _failed(v: dict[str, str]) -> set[str]:
    return {k for k, x in v.items() if x == "fail"}


@pytest.mark.parametrize("spec", list(SPECS))
def test_untouched_bench_passes(spec):
    assert _failed(_verdicts(_bench(spec))) == set()


@pytest.mark.parametrize("spec", ["fp8", "int8_pc"])
def test_wrong_n_quantizer_amax_fails_amax_fq_output_and_grad(spec):
    b = _bench(spec)
    b.weight_models["n_quantizer"].weight_quantizer.children_quantizers()[0]._amax.mul_(1.5)  # x2 would be invisible to FP8 (exponent shift)
    failed = _failed(_verdicts(b))
    assert {"amax/n_quantizer_eq_sequential", "fq_weight/n_quantizer_eq_sequential",
            "output/n_quantizer_eq_sequential/calib", "grad/n_quantizer_eq_sequential/calib"} <= failed
    assert "amax/one_vector_flat_eq_sequential" not in failed


def test_wrong_shared_and_vector_amax_fail():
    b = _bench()
    b.weight_models["shared"].weight_quantizer._amax.mul_(0.5)
    b.weight_models["one_vector_broadcast"].weight_quantizer._amax[2].mul_(3)
    failed = _failed(_verdicts(b))
    assert {"amax/shared_eq_max_sequential", "amax/one_vector_broadcast_eq_sequential",
            "output/one_vector_broadcast_eq_sequential/all_routed"} <= failed
    assert "amax/one_vector_flat_eq_sequential" not in failed


def test_experts_with_equal_amax_make_the_data_checks_fail():
    data = make_expert_data(SHAPE, seed=5)
    same = dataclasses.replace(data, weights=[data.weights[0].clone() for _ in data.weights])
    failed = _failed(_verdicts(_bench(data=same)))
    assert {"data/weight_amax_differ", "fq_weight/shared_differs_control"} <= failed


def test_sequential_amax_off_the_reference_fails():
    b = _bench()
    b.sequential.experts.local_experts[3].weight_quantizer._amax.mul_(2)
    assert "amax/sequential_eq_reference" in _failed(_verdicts(b))


def test_fake_quant_off_the_reference_fails(monkeypatch):
    b = _bench()
    real = quantized.fake_quant_spec

    def nudged(x, amax, spec):
        y = real(x, amax, spec)
        return torch.nextafter(y, torch.full_like(y, float("inf"))) if y.numel() else y

    monkeypatch.setattr(quantized, "fake_quant_spec", nudged)
    assert "fq_weight/sequential_eq_reference" in _failed(_verdicts(b))


def test_input_layout_breakage_fails_amax_and_equivalence_rows():
    b = _bench()
    b.input_models["sequential_synced"].experts.local_experts[2].input_quantizer._amax.mul_(0.75)  # not 0.5: FP8 cannot see powers of two
    b.input_models["grouped_per_expert"].input_quantizer.children_quantizers()[1]._amax.fill_(0.3)  # 1.0 == 0 for FP8 (zero amax is treated as 1)
    failed = _failed(_verdicts(b))
    assert {"amax/synced_eq_shared", "amax/uncalibrated_expert_zero", "amax/per_expert_eq_reference",
            "equivalence/grouped_shared~sequential_synced/calib",
            "equivalence/grouped_per_expert~sequential_per_expert/all_routed"} <= failed
    assert "equivalence/grouped_per_expert~sequential_per_expert/calib" not in failed, "expert 1 gets no tokens in calib"


def test_shared_input_amax_off_and_nan_amax_fail():
    b = _bench()
    b.input_models["grouped_shared"].input_quantizer._amax.fill_(float("nan"))
    failed = _failed(_verdicts(b))
    assert {"amax/shared_eq_max_per_expert", "layouts/grouped_shared", "equivalence/grouped_shared~grouped_synced/calib"} <= failed


def test_inputs_with_equal_amax_fail_the_input_data_check():
    data = make_expert_data(SHAPE, seed=5)
    x, s = data.calib[0]
    flat = torch.ones_like(x)
    same = dataclasses.replace(data, calib=[(flat, s), (flat, s)])
    assert "data/input_amax_differ" in _failed(_verdicts(_bench(data=same)))


def test_ste_mode_mismatch_fails_the_gradient_check():
    b = _bench("int8_pc")
    clipped = dataclasses.replace(b.sequential.input_spec, ste_mode="clipped")
    for e in b.sequential.experts.local_experts:
        e.input_quantizer.spec = clipped
    failed = _failed(_verdicts(b))
    assert "grad/n_quantizer_eq_sequential/all_routed" in failed


def test_state_dict_converter_breakage_fails_layout_rows(monkeypatch, tmp_path):
    data = make_expert_data(SHAPE, seed=5)

    def rows():
        sink = RowSink("t", "smoke", 0, "cpu")
        layout_rows(SHAPE, data, "fc1", sink, str(tmp_path), torch.device("cpu"))
        return {_key(r.id): r.verdict for r in sink.rows}

    assert _failed(rows()) == set()
    real_split, real_stack = checks_state.grouped_to_indexed, checks_state.indexed_to_grouped

    def lossy_split(sd, prefix, param, n):
        act = real_split(sd, prefix, param, n)
        key = f"{prefix}{param}0"
        if key in sd and act == "converted":
            sd[key] = (sd[key].view(torch.int16) ^ 1).view(sd[key].dtype)  # flip the lowest bit
        return act

    def no_error_split(sd, prefix, param, n):
        try:
            return real_split(sd, prefix, param, n)
        except ValueError:
            return "converted"

    def greedy_stack(sd, prefix, param, n, packed=False):
        sd.pop(prefix + param, None)
        return real_stack(sd, prefix, param, n, packed=packed)

    monkeypatch.setattr(checks_state, "grouped_to_indexed", lossy_split)
    assert {"state_dict/roundtrip/stacked", "state_dict/roundtrip/packed"} <= _failed(rows())
    monkeypatch.setattr(checks_state, "grouped_to_indexed", no_error_split)
    assert "state_dict/split_error" in _failed(rows())
    monkeypatch.setattr(checks_state, "grouped_to_indexed", real_split)
    monkeypatch.setattr(checks_state, "indexed_to_grouped", greedy_stack)
    assert "state_dict/early_return/target_present" in _failed(rows())


def test_quantizer_state_breakage_fails(monkeypatch, tmp_path):
    b = _bench("int8_pc")

    def rows():
        sink = RowSink("t", "smoke", 0, "cpu")
        quantizer_state_rows(b, sink, str(tmp_path), torch.device("cpu"))
        return _failed({_key(r.id): r.verdict for r in sink.rows})

    assert rows() == set()
    real = checks_state.vector_to_n

    def reversed_experts(sd, prefix, n, **kw):
        act = real(sd, prefix, n, **kw)
        if act != "converted" or kw.get("quantizer", "weight_quantizer") != "weight_quantizer":
            return act
        keys = [k for k in sd if k.startswith(prefix + ("weight_quantizer." if kw.get("naming") == "list" else "weight_quantizer_"))]
        vals = [sd[k] for k in keys]
        for k, v in zip(keys, reversed(vals)):
            sd[k] = v
        return act

    monkeypatch.setattr(checks_state, "vector_to_n", reversed_experts)
    failed = rows()
    assert {"state_dict/quantizer/roundtrip/flat", "state_dict/quantizer/roundtrip/broadcast"} <= failed
    assert "state_dict/quantizer/load/vector_to_n" not in failed, "the load goes through the module's own hook"
    monkeypatch.setattr(quantized, "vector_to_n", reversed_experts)
    assert "state_dict/quantizer/load/vector_to_n" in rows()


def test_internal_key_names_in_the_state_dict_fail_the_upstream_keys_row(monkeypatch, tmp_path):
    """A model that writes its internal ``weight_quantizer.{i}`` paths instead of the upstream keys."""
    b = _bench("fp8")

    def rows():
        sink = RowSink("t", "smoke", 0, "cpu")
        quantizer_state_rows(b, sink, str(tmp_path), torch.device("cpu"))
        return _failed({_key(r.id): r.verdict for r in sink.rows})

    assert rows() == set()
    monkeypatch.setattr(quantized, "to_upstream_keys", lambda *a, **k: 0)
    assert "state_dict/quantizer/upstream_keys" in rows()


def test_loss_rows_fail_when_nothing_is_quantised_or_the_error_is_not_finite():
    from moe_fq_parity.harness.sections.moe.checks_loss import ep_outputs, loss_rows

    b = _bench("fp8")

    def rows(outputs):
        sink = RowSink("t", "smoke", 0, "cpu")
        loss_rows(b, sink, outputs)
        return _failed({_key(r.id): r.verdict for r in sink.rows})

    assert rows(ep_outputs) == set()
    unquantised = lambda bench, label, ep: (ep_outputs(bench, label, ep)[1],) * 2  # noqa: E731
    assert {"loss/n_quantizer/ep1", "loss/sequential/ep2", "loss/ep2_eq_ep1/shared"} <= rows(unquantised)

    def nan_sequential(bench, label, ep):
        q, ref = ep_outputs(bench, label, ep)
        return (torch.full_like(q, float("nan")) if label == "sequential" else q), ref

    assert rows(nan_sequential) == {"loss/sequential/ep1", "loss/sequential/ep2", "loss/grouped_eq_sequential/ep1", "loss/grouped_eq_sequential/ep2"}
