"""Checkpoint keys and shard placement (no processes)."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.sections.checkpoint.layout import Coords, Layout
from moe_fq_parity.harness.sections.checkpoint.model import MoEConfig
from moe_fq_parity.harness.sections.checkpoint.quant import QUANT_FORMATS, quant_format
from moe_fq_parity.harness.sections.checkpoint.shards import LocalState, expected_entries, field_dtypes, from_loaded, key_plan, template_specs, to_specs

CFG = MoEConfig()
NVFP4 = quant_format("nvfp4/static")


@pytest.mark.parametrize("qlayout", ["n_quantizer", "one_vector"])
@pytest.mark.parametrize("qf_id", sorted(QUANT_FORMATS))
def test_global_keys_do_not_depend_on_the_layout(qlayout, qf_id):
    qf = quant_format(qf_id)
    ref = expected_entries(CFG, Layout(1, 1), qlayout, qf)
    for lay in (Layout(1, 2), Layout(2, 2), Layout(1, 8), Layout(2, 4)):
        assert expected_entries(CFG, lay, qlayout, qf) == ref


def test_local_index_keys_collide_across_ep_ranks():
    """The known bug, statically: with local indices EP ranks 0 and 1 write the same amax keys."""
    lay = Layout(1, 2)
    keys = [{e.key for e in key_plan(CFG, lay, Coords(r, 0), "n_quantizer", NVFP4, "local") if "quantizer" in e.key} for r in range(2)]
    assert keys[0] == keys[1] and "decoder.experts.linear_fc1.weight_quantizer_0._amax" in keys[0]
    good = [{e.key for e in key_plan(CFG, lay, Coords(r, 0), "n_quantizer", NVFP4) if "quantizer" in e.key} for r in range(2)]
    assert not good[0] & good[1] and "decoder.experts.linear_fc1.weight_quantizer_4._amax" in good[1]


def test_one_vector_placements():
    plan = {e.key: e for e in key_plan(CFG, Layout(2, 4), Coords(1, 1), "one_vector", NVFP4)}
    p = "decoder.experts.linear_"
    assert plan[p + "fc1.weight"].global_shape == (8, 64, 48) and plan[p + "fc1.weight"].placements == (("ep", 0), ("tp", 1))
    assert plan[p + "fc2.weight"].placements == (("ep", 0), ("tp", 2))
    assert plan[p + "fc1.weight_quantizer._amax"].global_shape == (8, 64, 3) and plan[p + "fc1.weight_quantizer._amax"].placements == (("ep", 0), ("tp", 1))
    assert plan[p + "fc2.weight_quantizer._amax"].global_shape == (8, 48, 4) and plan[p + "fc2.weight_quantizer._amax"].placements == (("ep", 0), ("tp", 2))
    assert plan[p + "fc2.weight_quantizer._global_amax"].placements == (("ep", 0),)


def test_specs_roundtrip_and_offsets():
    lay, c = Layout(2, 2), Coords(1, 1)
    plan = key_plan(CFG, lay, c, "n_quantizer", NVFP4)
    dtypes = field_dtypes(CFG, NVFP4)
    templates = template_specs(plan, lay, dtypes, torch.device("cpu"))
    loaded = {s.key: torch.arange(s.local.numel(), dtype=s.local.dtype).reshape(s.local.shape) + i for i, s in enumerate(templates)}
    state = from_loaded(loaded, plan)
    assert state.weights["fc1"].shape == (4, 32, 48) and state.quant["fc2"]["_amax"].shape == (4, 48, 2)
    again = {s.key: s.local for s in to_specs(LocalState(state.weights, state.quant), plan)}
    assert all(torch.equal(again[k], loaded[k]) for k in loaded)
    fc1_w5 = next(s for s in templates if s.key == "decoder.experts.linear_fc1.weight5")
    assert fc1_w5.offsets(c) == (32, 0)
