"""Quantizers and layouts: max calibration, empty experts, STE backward, explicit per-expert opt-in."""

from __future__ import annotations

import pathlib
import re

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.layers import GroupedLinearTwin, SequentialExperts, set_expert_params
from moe_fq_parity.harness.sections.moe.quantized import QuantGroupedExperts, QuantSequentialExperts, calibrate
from moe_fq_parity.harness.sections.moe.quantizers import ExpertQuantizer, FakeQuantSTE, MaxQuantizer, set_quant_mode
from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe
from moe_fq_parity.harness.core.bits import bits_equal

SHAPE = ExpertShape(4, 16, 32, 24)
FP8 = QuantSpec("fp8_e4m3", "per_tensor")
INT8_PC = QuantSpec("int8", "per_channel")
INT8 = QuantSpec("int8", "per_tensor")


def _recipe(w: QuantSpec, i: QuantSpec = INT8) -> Recipe:
    return Recipe.uniform(["fc1"], w, i)


@pytest.fixture(scope="module")
def data():
    return make_expert_data(SHAPE, seed=3)


def _grouped(data, **kw) -> QuantGroupedExperts:
    twin = GroupedLinearTwin(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, params_dtype=SHAPE.dtype)
    set_expert_params(twin, data.weights, data.biases)
    m = QuantGroupedExperts(twin, kw.pop("recipe", _recipe(FP8)), "fc1", **kw)
    calibrate(m, data.calib)
    return m


def _sequential(data, recipe=None, **kw) -> QuantSequentialExperts:
    seq = SequentialExperts(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, params_dtype=SHAPE.dtype)
    set_expert_params(seq, data.weights, data.biases)
    m = QuantSequentialExperts(seq, recipe or _recipe(FP8), "fc1", **kw)
    calibrate(m, data.calib)
    return m


def test_max_quantizer_running_max_and_granularity():
    q = MaxQuantizer(INT8_PC, (3,))
    q.mode = "calibrate"
    a = torch.tensor([[1.0, -4.0], [0.5, 0.25], [-2.0, 2.0]])
    b = torch.tensor([[3.0, 0.0], [-0.75, 0.0], [1.0, 1.0]])
    assert q(a) is a
    q(b)
    assert q.amax.tolist() == [4.0, 0.75, 2.0]
    q.mode = "bogus"
    with pytest.raises(ValueError, match="mode"):
        q(a)


def test_empty_input_keeps_amax_zero_and_quantizes_to_empty():
    q = MaxQuantizer(FP8, ())
    q.mode = "calibrate"
    q(torch.empty(0, 8, dtype=torch.bfloat16))
    assert q.amax.item() == 0.0 and not torch.signbit(q.amax)
    nv = MaxQuantizer(QuantSpec("nvfp4", "per_tensor"), ())
    nv.mode = "quantize"
    assert nv(torch.empty(0, 32, dtype=torch.bfloat16)).shape == (0, 32)


@pytest.mark.parametrize("layout,form,shape", [
    ("shared", "flat", ()), ("n_quantizer", "flat", None), ("one_vector", "flat", (4,)), ("one_vector", "broadcast", (4, 1, 1)),
])
def test_weight_layout_state_keys_and_shapes(data, layout, form, shape):
    m = _grouped(data, per_expert=layout != "shared", weight_layout=layout, vector_form=form)
    keys = {k: tuple(v.shape) for k, v in m.state_dict().items() if k.startswith("weight_quantizer")}
    if layout == "n_quantizer":
        assert keys == {f"weight_quantizer_{i}._amax": () for i in range(4)}
    else:
        assert keys == {"weight_quantizer._amax": shape}
    per = [float(reference.max_calibrate(w)) for w in data.weights]
    want = [max(per)] * 4 if layout == "shared" else per
    assert [float(a) for a in m.weight_amax()] == want
    assert len(set(per)) == 4, "test data must give every expert a different amax"


def test_per_channel_one_vector_broadcast_shape(data):
    m = _grouped(data, recipe=_recipe(INT8_PC), per_expert=True, weight_layout="one_vector", vector_form="broadcast")
    assert m.state_dict()["weight_quantizer._amax"].shape == (4, SHAPE.out_features, 1)
    ref = reference.max_calibrate_experts(data.weights, "per_channel")
    assert all(bool(bits_equal(ref[i], a).all()) for i, a in enumerate(m.weight_amax()))


def test_per_expert_opt_in_is_required_and_checked(data):
    twin = GroupedLinearTwin(4, 32, 16)
    with pytest.raises(TypeError, match="per_expert"):
        QuantGroupedExperts(twin, _recipe(FP8), "fc1")  # no default: must be explicit
    with pytest.raises(TypeError, match="True or False"):
        QuantGroupedExperts(twin, _recipe(FP8), "fc1", per_expert=1)
    with pytest.raises(ValueError, match="contradicts"):
        QuantGroupedExperts(twin, _recipe(FP8), "fc1", per_expert=False, weight_layout="n_quantizer")
    with pytest.raises(ValueError, match="contradicts"):
        QuantGroupedExperts(twin, _recipe(FP8), "fc1", per_expert=True, weight_layout="shared")
    with pytest.raises(ValueError, match="vector_form"):
        ExpertQuantizer(FP8, 4, 16, "n_quantizer", vector_form="broadcast")


def test_nothing_in_harness_moe_reads_the_environment():
    root = pathlib.Path(__file__).resolve().parents[2] / "harness" / "moe"
    offenders = [p.name for p in root.glob("*.py") if re.search(r"os\.environ|getenv", p.read_text())]
    assert offenders == []


def test_uncalibrated_expert_amax_zero_and_its_effect(data):
    """Expert 1 gets no calibration tokens: amax +0; INT8 then zeroes its routed tokens' inputs."""
    int8 = _recipe(INT8, INT8)
    g = _grouped(data, recipe=int8, per_expert=True, input_layout="per_expert")
    s = _sequential(data, recipe=int8)
    assert SHAPE.empty == (1,)
    assert float(g.input_amax()[1]) == 0.0 and float(s.input_amax()[1]) == 0.0
    x, splits = data.routings["all_routed"]
    start = splits[0]
    rows = slice(start, start + splits[1])
    out = g(x, splits)
    bias = data.biases[1].expand(splits[1], -1)
    assert splits[1] > 0 and bool(bits_equal(out[rows], bias).all()), "zero input amax -> x_q = 0 -> output = bias"
    assert bool(bits_equal(out, s(x, splits)).all())


def test_synced_and_shared_input_amax(data):
    shared = _grouped(data, per_expert=True, input_layout="shared")
    synced = _grouped(data, per_expert=True, input_layout="synced")
    seq_synced = _sequential(data, input_layout="synced")
    per = _sequential(data)
    m = max(float(a) for a in per.input_amax())
    assert [float(a) for a in shared.input_amax()] == [m] * 4
    assert [float(a) for a in synced.input_amax()] == [m] * 4
    assert [float(a) for a in seq_synced.input_amax()] == [m] * 4
    with pytest.raises(ValueError, match="sequential input_layout"):
        _sequential(data, input_layout="shared")


@pytest.mark.parametrize("mode", ["pass_through", "clipped"])
def test_ste_backward_follows_the_spec(mode):
    spec = QuantSpec("int8", "per_tensor", mode)
    x = torch.tensor([[-3.0, -1.0, 0.5, 1.0, 2.5]], dtype=torch.bfloat16, requires_grad=True)
    amax = torch.tensor(1.0)
    g = torch.tensor([[1.0, 2.0, 3.0, 4.0, 5.0]], dtype=torch.bfloat16)
    FakeQuantSTE.apply(x, amax, spec).backward(g)
    want = g if mode == "pass_through" else torch.tensor([[0.0, 2.0, 3.0, 4.0, 0.0]], dtype=torch.bfloat16)
    assert bool(bits_equal(x.grad, want).all())


def test_off_mode_is_identity(data):
    m = _grouped(data, per_expert=True)
    set_quant_mode(m, "off")
    x, splits = data.routings["calib"]
    assert bool(bits_equal(m(x, splits), m.layer(x, splits)).all())
    with pytest.raises(ValueError, match="mode"):
        set_quant_mode(m, "on")
    with pytest.raises(ValueError, match="at least one batch"):
        calibrate(m, [])
