"""Which buffers need the TP sync, and the derived NVFP4 block scales (no processes)."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.sections.checkpoint.quant import block_scales, buffer_tp_axis, calibrate, needs_tp_sync, quant_format, sync_tp
from moe_fq_parity.reference.rounding import round_to_e4m3


@pytest.mark.parametrize(
    "fc,granularity,sync,axis",
    [
        ("fc1", "per_expert", True, None),
        ("fc2", "per_expert", True, None),
        ("fc1", "per_channel", False, 0),
        ("fc2", "per_channel", True, None),
        ("fc1", "per_block", False, 0),
        ("fc2", "per_block", False, 1),
        ("fc1", "global", True, None),
        ("fc2", "global", True, None),
    ],
)
def test_sync_table(fc, granularity, sync, axis):
    assert needs_tp_sync(fc, granularity) is sync
    assert buffer_tp_axis(fc, granularity) == axis


def test_sync_skip_must_name_a_buffer():
    qf = quant_format("fp8_e4m3/per_expert")
    with pytest.raises(ValueError, match="_global_amax"):
        sync_tp({}, "fc1", qf, None, skip=frozenset({"_global_amax"}))


def test_block_scales_follow_reference_static_steps():
    """Steps 1-6 of ``reference.nvfp4`` ``modelopt_static``, spelled out in fp32, incl. a zero expert."""
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(3, 8, 32, generator=g) * 3).bfloat16()
    w[2] = 0
    st = calibrate(w, quant_format("nvfp4/static"))
    got = block_scales(st["_amax"], st["_global_amax"])
    sixth = torch.reciprocal(torch.tensor(6.0))
    bs = st["_amax"] * sixth
    ga6 = st["_global_amax"] * sixth
    ga6 = torch.where(ga6 <= 2.0**-24, torch.ones(()), ga6).reshape(3, 1, 1)
    s = torch.tensor(448.0) / ga6
    expected = round_to_e4m3(bs * s) * (torch.tensor(1.0) / s)
    assert got.shape == (3, 8, 2) and got.dtype == torch.float32
    assert torch.equal(got.view(torch.int32), expected.view(torch.int32))
    assert not torch.equal(got, block_scales(st["_amax"], st["_global_amax"] * 3))


@pytest.mark.parametrize("which", ["ep", "tp"])
def test_a_sync_refuses_to_skip_a_buffer_the_format_does_not_have(which):
    """A typo in ``skip`` (the negative controls' knob) would silently sync everything: it raises,
    also where the sync has no group (EP or TP of 1)."""
    from moe_fq_parity.harness.sections.checkpoint.quant import sync_ep

    qf = quant_format("nvfp4/static")
    sync = (lambda **kw: sync_ep({}, qf, None, **kw)) if which == "ep" else (lambda **kw: sync_tp({}, "fc1", qf, None, **kw))
    sync(skip=frozenset({"_global_amax"}))  # a buffer it has: fine
    with pytest.raises(ValueError, match=r"\['_global_amx'\] that nvfp4/static does not have"):
        sync(skip=frozenset({"_global_amx"}))
