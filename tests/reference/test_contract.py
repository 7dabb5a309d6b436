"""Input handling, granularity, dtypes, NVFP4 partial blocks, STE and calibration contracts."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference as R
from moe_fq_parity.reference.nvfp4 import to_blocks

G = torch.Generator().manual_seed(7)


def _w(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=G).to(dtype)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -1.0])
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "nvfp4"])
def test_bad_amax_values_raise(fmt, bad):
    with pytest.raises(ValueError, match="amax is"):
        R.fake_quant(_w(4, 32), torch.tensor(bad), fmt)


def test_bad_amax_shape_device_dtype():
    x = _w(3, 4, 32)
    with pytest.raises(ValueError, match="does not fit"):
        R.fake_quant(x, torch.ones(4), "int8")
    with pytest.raises(ValueError, match="is on meta"):
        R.fake_quant(x, torch.ones(3, device="meta"), "int8")
    with pytest.raises(TypeError, match="float tensor"):
        R.fake_quant(x, torch.ones(3, dtype=torch.int32), "int8")
    with pytest.raises(TypeError, match="input dtype"):
        R.fake_quant(x.to(torch.int8), torch.ones(3), "int8")


def test_unknown_format_variant_option():
    x = _w(4, 32)
    with pytest.raises(ValueError, match="unknown format"):
        R.fake_quant(x, torch.tensor(1.0), "int3")
    with pytest.raises(ValueError, match="unknown variant"):
        R.fake_quant(x, torch.tensor(1.0), "int8", variant="fancy")
    with pytest.raises(TypeError, match="does not take"):
        R.fake_quant(x, torch.tensor(1.0), "fp8_e4m3", narrow_range=True)
    with pytest.raises(TypeError, match="modelopt_static"):
        R.fake_quant(x, torch.tensor(1.0), "nvfp4", block_amax=torch.ones(4, 2))


def test_unsigned_rejects_negative_and_quantizes_positive():
    with pytest.raises(ValueError, match="negative"):
        R.fake_quant(_w(4, 32), torch.tensor(3.0), "int8", unsigned=True)
    x = _w(4, 32, dtype=torch.float32).abs()  # fp32 output keeps q/s unrounded
    y = R.fake_quant(x, torch.tensor(3.0), "int8", unsigned=True)
    q = y * (255.0 / 3.0)
    assert torch.all((q - q.round()).abs() < 1e-3) and q.min() >= 0 and q.max() <= 255 + 1e-3
    assert q.round().max() > 127  # the unsigned range is really used


def test_nvfp4_nan_per_variant_and_per_channel_rejected():
    """``modelopt_static`` rejects NaN input; ``te`` and ``torchao`` take it: the NaN's block is NaN."""
    x = _w(4, 32)
    x[1, 3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        R.fake_quant(x, torch.tensor(1.0), "nvfp4", "modelopt_static")
    for variant in ("te", "torchao"):
        y = R.fake_quant(x, torch.tensor(1.0), "nvfp4", variant)
        assert torch.isnan(y[1, :16]).all() and not torch.isnan(y[1, 16:]).any() and not torch.isnan(y[0]).any(), variant
    with pytest.raises(ValueError, match="per-channel"):
        R.fake_quant(_w(4, 32), torch.ones(4), "nvfp4")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3", "nvfp4"])
def test_output_dtype_is_input_dtype(fmt, dtype):
    x = _w(2, 3, 48, dtype=dtype)
    y = R.fake_quant(x, x.abs().float().amax(dim=(1, 2)), fmt)
    assert y.dtype == dtype and y.shape == x.shape


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "nvfp4"])
def test_stacked_per_expert_equals_expert_loop(fmt):
    x = _w(5, 6, 40)
    x[2] *= 1e-3  # per-expert scale spread
    amax = x.float().abs().amax(dim=(1, 2))
    stacked = R.fake_quant(x, amax, fmt)
    loop = R.fake_quant_experts(list(x), amax, fmt)
    for i in range(5):
        assert torch.equal(stacked[i].view(torch.int16), loop[i].view(torch.int16)), f"expert {i}"


def test_per_channel_amax_applies_per_row():
    x = _w(2, 3, 16)
    amax = x.float().abs().amax(dim=-1)
    y = R.fake_quant(x, amax, "int8")
    for e in range(2):
        for r in range(3):
            want = R.fake_quant(x[e, r : r + 1], amax[e, r], "int8")
            assert torch.equal(y[e, r : r + 1].view(torch.int16), want.view(torch.int16)), (e, r)


@pytest.mark.parametrize("variant", ["te", "modelopt_static"])
def test_nvfp4_partial_last_block_is_zero_padded_short_block(variant):
    """Decision: a last dim that is not a multiple of 16 ends in a short block, quantized as if
    zero-padded to 16 (TE pads with zeros); equivalently, the block max is over the real elements."""
    x = _w(3, 40)  # blocks of 16, 16, 8
    amax = x.float().abs().amax()
    y = R.fake_quant(x, amax, "nvfp4", variant)
    padded = torch.nn.functional.pad(x, (0, 8))
    y_pad = R.fake_quant(padded, amax, "nvfp4", variant)[:, :40]
    assert torch.equal(y.view(torch.int16), y_pad.view(torch.int16))
    # the short block is independent of the full blocks: quantize it alone
    tail = R.fake_quant(x[:, 32:].contiguous(), amax, "nvfp4", variant)
    assert torch.equal(y[:, 32:].view(torch.int16), tail.view(torch.int16))
    assert to_blocks(x.float(), 16).shape == (3, 3, 16)


def test_nvfp4_static_block_amax_option():
    x = _w(2, 32)
    g = x.float().abs().amax()
    from moe_fq_parity.reference.nvfp4 import block_amax

    bam = block_amax(x)
    y_default = R.fake_quant(x, g, "nvfp4", "modelopt_static")
    y_explicit = R.fake_quant(x, g, "nvfp4", "modelopt_static", block_amax=bam)
    assert torch.equal(y_default.view(torch.int16), y_explicit.view(torch.int16))
    y_half = R.fake_quant(x, g, "nvfp4", "modelopt_static", block_amax=bam * 0.5)
    assert not torch.equal(y_default.view(torch.int16), y_half.view(torch.int16))
    with pytest.raises(ValueError, match="block_amax shape"):
        R.fake_quant(x, g, "nvfp4", "modelopt_static", block_amax=bam[:, :1])


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_zero_and_tiny_amax(fmt):
    x = _w(4, 32)
    for a in (0.0, 2.0**-25):
        y = R.fake_quant(x, torch.tensor(a), fmt)
        if fmt == "int8":
            assert torch.equal(y.view(torch.int16), torch.zeros_like(y).view(torch.int16)), a  # +0 everywhere
        else:
            assert torch.equal(y.view(torch.int16), R.fake_quant(x, torch.tensor(1.0), fmt).view(torch.int16)), a


def test_empty_experts_and_ragged():
    ws = [_w(4, 32), torch.empty(0, 32, dtype=torch.bfloat16), _w(7, 20)]
    amax = R.max_calibrate_experts(ws)
    assert amax.tolist()[1] == 0.0
    out = R.fake_quant_experts(ws, amax, "nvfp4")
    assert [o.shape for o in out] == [w.shape for w in ws]


def test_ste_pass_through_is_identity_object_and_clipped_inclusive():
    x = torch.tensor([[-2.0, -1.0, 0.5, 1.0, 1.0078125, float("nan")]], dtype=torch.bfloat16)
    g = torch.tensor([[3.0, -5.0, 7.0, 11.0, 13.0, 17.0]], dtype=torch.bfloat16)
    assert R.ste_backward(x, torch.tensor(1.0), g, "pass_through") is g
    got = R.ste_backward(x, torch.tensor(1.0), g, "clipped")
    assert got.tolist() == [[0.0, -5.0, 7.0, 11.0, 0.0, 0.0]]  # |x| == amax keeps; NaN x gives 0
    assert not torch.signbit(got[0, 0])  # zeros are +0
    with pytest.raises(ValueError, match="mode"):
        R.ste_backward(x, torch.tensor(1.0), g, "straight")


def test_calibration_granularities_and_running_max():
    x = _w(3, 4, 32)
    assert R.max_calibrate(x).item() == x.float().abs().max().item()
    assert torch.equal(R.max_calibrate(x, "per_expert"), x.float().abs().amax(dim=(1, 2)))
    assert torch.equal(R.max_calibrate(x, "per_channel"), x.float().abs().amax(dim=-1))
    assert R.max_calibrate(x, "per_block").shape == (3, 4, 2)
    r = R.update_running_amax(None, torch.tensor([1.0, 5.0]))
    r = R.update_running_amax(r, torch.tensor([3.0, 2.0]))
    assert r.tolist() == [3.0, 5.0]
    nan = R.update_running_amax(r, torch.tensor([float("nan"), 0.0]))
    assert torch.isnan(nan[0])  # NaN propagates, then fake quant rejects it
    with pytest.raises(ValueError, match="NaN"):
        R.fake_quant(_w(2, 4, 8), nan, "int8")
    with pytest.raises(ValueError, match="granularity"):
        R.max_calibrate(x, "per_row")
