"""Expert layers: TE parameter names, forward = per-split F.linear, sequential == grouped (bitwise)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.layers import GroupedLinearTwin, SequentialExperts, set_expert_params, split_tokens
from moe_fq_parity.harness.sections.moe.te_adapter import grouped_forward, make_grouped_linear, te_available
from moe_fq_parity.harness.core.bits import bits_equal

SHAPE = ExpertShape(5, 24, 40, 30)


@pytest.fixture(scope="module")
def data():
    return make_expert_data(SHAPE, seed=7)


def _per_split(x, splits, ws, bs):
    return torch.cat([F.linear(xi, w, b) for xi, w, b in zip(x.split(splits), ws, bs or [None] * len(ws))])


def test_twin_parameter_names_follow_transformer_engine():
    with_bias = GroupedLinearTwin(3, 8, 4, bias=True, params_dtype=torch.bfloat16)
    assert list(with_bias.state_dict()) == ["weight0", "bias0", "weight1", "bias1", "weight2", "bias2"]
    assert with_bias.weight1.shape == (4, 8) and with_bias.bias2.shape == (4,) and with_bias.weight0.dtype == torch.bfloat16
    no_bias = GroupedLinearTwin(3, 8, 4, bias=False)
    assert list(no_bias.state_dict()) == ["weight0", "weight1", "weight2"]
    assert not isinstance(no_bias.bias0, torch.nn.Parameter) and no_bias.bias0.numel() == 0
    single = GroupedLinearTwin(3, 8, 4, bias=True, single_grouped_weight=True)
    assert {k: tuple(v.shape) for k, v in single.state_dict().items()} == {"weight": (3, 4, 8), "bias": (3, 4)}


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("single", [False, True])
@pytest.mark.parametrize("splits_as_tensor", [False, True])
def test_twin_forward_is_concatenated_per_split_linear(data, bias, single, splits_as_tensor):
    twin = GroupedLinearTwin(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, bias=bias,
                             params_dtype=SHAPE.dtype, single_grouped_weight=single)
    set_expert_params(twin, data.weights, data.biases if bias else None)
    x, splits = data.routings["calib"]
    assert 0 in splits, "routing must contain an empty expert"
    m = torch.tensor(splits, dtype=torch.int64) if splits_as_tensor else splits
    expected = _per_split(x, splits, data.weights, data.biases if bias else None)
    got = twin(x, m)
    assert got.shape == (sum(splits), SHAPE.out_features)
    assert bool(bits_equal(expected, got).all())


@pytest.mark.parametrize("bias", [True, False])
def test_sequential_equals_twin_bitwise(data, bias):
    seq = SequentialExperts(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, bias=bias, params_dtype=SHAPE.dtype)
    twin = GroupedLinearTwin(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, bias=bias, params_dtype=SHAPE.dtype)
    for m in (seq, twin):
        set_expert_params(m, data.weights, data.biases if bias else None)
    assert "local_experts.3.weight" in seq.state_dict()
    for x, splits in data.routings.values():
        assert bool(bits_equal(seq(x, splits), twin(x, splits)).all())


def test_split_validation():
    x = torch.zeros(6, 4)
    assert [t.shape[0] for t in split_tokens(x, [0, 6, 0], 3)] == [0, 6, 0]
    with pytest.raises(ValueError, match="sum to 5"):
        split_tokens(x, [1, 4, 0], 3)
    with pytest.raises(ValueError, match="2 entries for 3"):
        split_tokens(x, [3, 3], 3)
    with pytest.raises(ValueError, match=">= 0"):
        split_tokens(x, [7, -1, 0], 3)
    with pytest.raises(ValueError, match="2-D"):
        split_tokens(torch.zeros(2, 3, 4), [6, 0, 0], 3)
    with pytest.raises(ValueError, match="int64"):
        split_tokens(x, torch.tensor([1.0, 5.0, 0.0]), 3)


def test_adapter_on_cpu_gives_the_twin_and_says_why_not_te():
    ok, why = te_available()
    if not torch.cuda.is_available():
        assert not ok and "CUDA" in why
    layer = make_grouped_linear(2, 8, 4, bias=False, device="cpu")
    assert isinstance(layer, GroupedLinearTwin)
    with pytest.raises(ValueError, match="device='cuda'"):
        make_grouped_linear(2, 8, 4, device="cpu", backend="te")
    with pytest.raises(ValueError, match="backend"):
        make_grouped_linear(2, 8, 4, backend="tex")


@pytest.mark.parametrize("single", [False, True])
def test_grouped_forward_substitutes_weights(data, single):
    twin = make_grouped_linear(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, bias=True,
                               params_dtype=SHAPE.dtype, single_grouped_weight=single)
    set_expert_params(twin, data.weights, data.biases)
    other = [w * 2 for w in data.weights]
    x, splits = data.routings["all_routed"]
    got = grouped_forward(twin, x, splits, other)
    assert bool(bits_equal(_per_split(x, splits, other, data.biases), got).all())
    assert bool(bits_equal(_per_split(x, splits, data.weights, data.biases), grouped_forward(twin, x, splits)).all())
