"""Test data: per-expert amax differ in a way every format can see; seeds are stable."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.moe.compare import POWER_OF_TWO_BLIND, count_distinct, visible_amax
from moe_fq_parity.cases.inputs import seed_for_id
from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.layers import split_tokens


@pytest.mark.parametrize("n", [3, 4, 8, 16, 32, 128])
def test_expert_amax_have_distinct_mantissas(n):
    shape = ExpertShape(n, 4, 16, 4 * n)
    data = make_expert_data(shape, seed=seed_for_id(f"data/{n}", 0))
    w_amax = [reference.max_calibrate(w) for w in data.weights]
    assert count_distinct(w_amax, "fp8_e4m3") == n
    x, splits = data.calib[0]
    x_amax = [reference.max_calibrate(xi) for i, xi in enumerate(split_tokens(x, splits, n)) if i not in shape.empty]
    assert count_distinct(x_amax, "nvfp4") == len(x_amax) == n - len(shape.empty)
    assert all(splits[i] == 0 for i in shape.empty) and all(s > 0 for s in data.routings["all_routed"][1])


def test_power_of_two_amax_change_is_invisible_to_fp8_but_not_int8():
    """Why ``visible_amax`` compares mantissas for FP8/NVFP4 (normal-range data)."""
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(64, 64, generator=g) * 0.5 + 0.5).to(torch.bfloat16)  # <= amax, |x*s| in E4M3's normal range
    a = torch.tensor(1.3)
    for fmt in POWER_OF_TWO_BLIND[:1]:
        assert torch.equal(reference.fake_quant(x, a, fmt), reference.fake_quant(x, a * 2, fmt))
    assert not torch.equal(reference.fake_quant(x, a, "int8"), reference.fake_quant(x, a * 2, "int8"))
    assert torch.equal(visible_amax(a, "fp8_e4m3"), visible_amax(a * 4, "fp8_e4m3"))
    assert not torch.equal(visible_amax(a, "int8"), visible_amax(a * 4, "int8"))


def test_data_is_deterministic_and_seed_sensitive():
    shape = ExpertShape(4, 8, 16, 16)
    a, b, c = (make_expert_data(shape, s) for s in (5, 5, 6))
    assert all(torch.equal(x, y) for x, y in zip(a.weights, b.weights))
    assert not torch.equal(a.weights[0], c.weights[0])
    assert seed_for_id("x", 3) == seed_for_id("x", 0) + 3 and seed_for_id("x", 0) != seed_for_id("y", 0)
    with pytest.raises(ValueError, match="num_experts"):
        ExpertShape(2, 8, 8, 8)
