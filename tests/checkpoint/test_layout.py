"""Megatron's expert and tensor-parallel rules, with literal expectations."""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.core.bits import bits_equal
from moe_fq_parity.harness.sections.checkpoint.layout import Coords, Layout, matrix_layouts, parse_layout, tp_chunk
from moe_fq_parity.harness.sections.checkpoint.model import MoEConfig, expert_weight, full_weights, local_weights


def test_rank_order_is_tp_fastest():
    lay = Layout(tp=2, ep=4)
    assert [lay.coords(r) for r in range(8)] == [Coords(e, t) for e in range(4) for t in range(2)]


@pytest.mark.parametrize(
    "ep,ep_rank,expected",
    [(1, 0, [0, 1, 2, 3, 4, 5, 6, 7]), (2, 1, [4, 5, 6, 7]), (4, 2, [4, 5]), (8, 7, [7])],
)
def test_global_expert_index(ep, ep_rank, expected):
    assert Layout(1, ep).local_experts(8, ep_rank) == expected


def test_errors_name_the_problem():
    with pytest.raises(ValueError, match="num_experts=6 is not divisible by ep=4"):
        Layout(1, 4).num_local_experts(6)
    with pytest.raises(ValueError, match="local expert 2 out of range"):
        Layout(1, 4).global_expert(8, 0, 2)
    with pytest.raises(ValueError, match="tp must be a positive int"):
        Layout(0, 1)
    with pytest.raises(ValueError, match="not divisible by tp=2"):
        tp_chunk(5, 2, 0)
    with pytest.raises(ValueError, match="in-shard 24 is not a whole number of 16-blocks"):
        MoEConfig(ffn=48).check_layout(Layout(2, 1))


def test_parse_and_matrix():
    assert parse_layout("tp2ep4") == Layout(2, 4) and Layout(2, 4).id == "tp2ep4"
    with pytest.raises(ValueError, match="look like"):
        parse_layout("ep4tp2")
    assert [lay.id for lay in matrix_layouts(2)] == ["tp1ep1", "tp1ep2", "tp2ep1"]
    assert len(matrix_layouts(8)) == 7


def test_local_weights_are_slices_of_the_global_experts():
    """fc1 split on out, fc2 on in; EP rank 3 of 4 holds experts 6 and 7."""
    cfg, seed, lay = MoEConfig(), 7, Layout(2, 4)
    for fc, dim in (("fc1", 1), ("fc2", 2)):
        full = full_weights(cfg, seed, fc)
        local = local_weights(cfg, seed, lay, Coords(ep=3, tp=1), fc)
        half = full.shape[dim] // 2
        expect = full[6:8].narrow(dim, half, half)
        assert local.shape == expect.shape and bool(bits_equal(local, expect).all())


def test_experts_differ_and_depend_on_seed():
    cfg = MoEConfig()
    amax = [float(expert_weight(cfg, 1, "fc1", g).float().abs().max()) for g in range(cfg.num_experts)]
    assert len(set(amax)) == cfg.num_experts
    assert not bool(bits_equal(expert_weight(cfg, 1, "fc1", 0), expert_weight(cfg, 2, "fc1", 0)).all())
