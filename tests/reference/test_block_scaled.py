"""The block-scaled formats' contracts on hand-built inputs: E8M0 encode/decode, each variant's rule at
its boundary, the non-finite and tiny blocks, partial tiles, zero-size experts, the no-amax API and
the straight-through backward."""

from __future__ import annotations

import math

import pytest
import torch

from moe_fq_parity import reference as R
from moe_fq_parity.reference import mx as MX
from moe_fq_parity.reference.fp8_block import pow2_floor, ue8m0_ceil
from moe_fq_parity.reference.rounding import round_to_e4m3


def _f32(*v: float) -> torch.Tensor:
    return torch.tensor(v, dtype=torch.float32)


def test_e8m0_decode_and_inverse_are_exact_powers_of_two_with_code_0_and_255():
    codes = torch.arange(256)
    dec = MX.e8m0_decode(codes)
    assert float(dec[0]) == 2.0**-127 and dec[0].view(torch.int32) == 0x00400000  # not zero
    assert all(float(dec[c]) == 2.0 ** (c - 127) for c in range(255)) and math.isnan(float(dec[255]))
    inv = MX.e8m0_inverse(codes)
    assert all(float(inv[c]) == 2.0 ** (127 - c) for c in range(255)) and math.isnan(float(inv[255]))


@pytest.mark.parametrize("variant, a, code", [
    ("floor", 448.0, 127), ("floor", 511.99, 127), ("floor", 512.0, 128),        # 2**(floor(log2 a) - 8)
    ("ceil", 256.0, 127), ("ceil", float(torch.nextafter(_f32(256.0), _f32(512.0))), 128),
    ("even", 1.9375 * 256, 128), ("even", float(torch.nextafter(_f32(1.9375 * 256), _f32(0.0))), 127),
    ("rceil", 448.0, 127), ("rceil", float(torch.nextafter(_f32(448.0), _f32(1e9))), 128),
    ("te", 448.0, 127), ("te", float(torch.nextafter(_f32(448.0), _f32(1e9))), 128),
    ("modelopt", 448.0, 127), ("modelopt", float(torch.nextafter(_f32(448.0), _f32(1e9))), 128),
    ("floor", 0.0, 0), ("ceil", 0.0, 0), ("te", 0.0, 0), ("rceil", 0.0, 0), ("modelopt", 0.0, 0),
    ("floor", math.inf, 255), ("rceil", math.inf, 255), ("te", math.inf, 254), ("modelopt", math.inf, 254),
    ("floor", math.nan, 255), ("te", math.nan, 255), ("modelopt", math.nan, 0),
    ("te", 448.0 * 2.0**-127, 0), ("rceil", 448.0 * 2.0**-127, 0), ("floor", 2.0**-130, 0),
])
def test_mxfp8_code_rules_at_their_boundaries(variant, a, code):
    got = MX.CODE_RULES[variant](_f32(a), 8, 3, 448.0)
    assert int(got) == code, (variant, a, int(got))


def test_te_multiply_by_rounded_reciprocal_equals_the_division_on_every_boundary():
    """Why no mutant swaps TE's ``RN(A * RN(1/max))`` for a division: on fp32 amax the two give the
    same code (the ceil decision changes only where ``RN(A/max)`` is exactly a power of two, which
    needs ``A = max * 2**k``, where the product is exact too).  Checked on every fp32 within 64 ulps
    of ``max * 2**k`` for every k, both element formats."""
    for emx in (448.0, 6.0):
        base = emx * torch.pow(2.0, torch.arange(-140, 120, dtype=torch.float32))
        base = base[torch.isfinite(base) & (base > 0)]
        bits = base.view(torch.int32).unsqueeze(1) + torch.arange(-64, 65, dtype=torch.int32)
        a = bits.reshape(-1).view(torch.float32)
        a = a[torch.isfinite(a) & (a > 0)]
        div = MX.code_te(a / torch.tensor([emx]), 0, 0, 1.0)
        assert torch.equal(MX.code_te(a, 0, 0, emx), div)


def test_bf16_max_overflows_to_inf_under_a_ceil_rule_and_not_under_floor():
    x = torch.full((1, 32), torch.finfo(torch.bfloat16).max, dtype=torch.bfloat16)
    assert torch.isinf(R.fake_quant(x, None, "mxfp8", "ceil")).all()
    y = R.fake_quant(x, None, "mxfp8", "floor")
    assert torch.isfinite(y).all() and float(y[0, 0]) == 448.0 * 2.0**119


def test_nonfinite_and_tiny_blocks_per_variant():
    x = torch.linspace(-1, 1, 64).reshape(1, 64)
    x[0, 3] = math.inf
    x[0, 40] = math.nan
    floor = R.fake_quant(x, None, "mxfp8", "floor")
    assert torch.isnan(floor).all()  # code 255 in both blocks
    te = R.fake_quant(x, None, "mxfp8", "te")  # inf block: code 254; the NaN block's amax skips the NaN
    assert torch.isinf(te[0, 3]) and (te[0, :32][torch.arange(32) != 3] == 0).all()
    assert torch.isnan(te[0, 40]) and int(torch.isnan(te[0, 32:]).sum()) == 1 and float(te[0, 63]) == 1.0
    mo = R.fake_quant(x, None, "mxfp8", "modelopt")  # NaN block: code 0, finite elements saturate at 448 * 2**-127
    assert float(mo[0, 63]) == 448.0 * 2.0**-127 and torch.isnan(mo[0, 40])
    tiny = torch.full((1, 32), 2.0**-130)
    assert float(R.fake_quant(tiny, None, "mxfp8", "floor")[0, 0]) == 2.0**-130  # code 0 = 2**-127, not zero
    assert float(R.fake_quant(tiny, None, "mxfp8", "te")[0, 0]) == 2.0**-130  # TE's exp2f_rcp(0) = 2**127, exp2f(0) = 2**-127


def test_fp8_block_rules():
    zero = torch.zeros(1, 128)
    assert torch.equal(R.fake_quant(zero, None, "fp8_block"), zero)
    assert torch.equal(R.fake_quant(zero, None, "fp8_block", "deepseek"), zero)  # amax raised to 1e-4: s > 0
    assert torch.equal(R.fake_quant(zero, None, "fp8_block", "deepgemm"), zero)
    x = torch.linspace(-1, 1, 128).reshape(1, 128)
    x[0, 5] = math.nan
    te = R.fake_quant(x, None, "fp8_block")  # NaN tile: pow2 scale 2**-1 (frexp exponent 0), finite elements kept
    assert torch.isnan(te[0, 5]) and float(te[0, 127]) == 1.0
    assert torch.isnan(R.fake_quant(x, None, "fp8_block", fp32_scale=True)).all()
    assert float(R.fake_quant(x, None, "fp8_block", "deepseek")[0, 127]) == 1.0  # NaN ignored by the amax
    x[0, 5] = math.inf
    assert torch.isnan(R.fake_quant(x, None, "fp8_block")).all()  # inf tile: scale 0, inv inf
    assert float(pow2_floor(_f32(448.0 / 3.0))) == 128.0 and float(pow2_floor(_f32(math.nan))) == 0.5
    assert float(ue8m0_ceil(_f32(1.0))) == 1.0 and float(ue8m0_ceil(_f32(1.5))) == 2.0 and float(ue8m0_ceil(_f32(math.nan))) == 2.0**127
    small = torch.full((1, 128), 1e-6)  # DeepGEMM's amax floor 1e-4: sf = 2**-12, 1e-6 / sf rounds to 0.004 -> e4m3 0.00390625
    assert float(R.fake_quant(small, None, "fp8_block", "deepgemm")[0, 0]) == 0.00390625 * 2.0**-12
    assert float(R.fake_quant(small, None, "fp8_block", "deepseek")[0, 0]) == 0.00390625 * 2.0**-12  # the same floor, ue8m0
    s32 = torch.tensor(1e-4, dtype=torch.float32) / torch.tensor(448.0)  # fp32 scale: RN(1e-4 / 448), not a power of two
    assert float(round_to_e4m3(_f32(1e-6) / s32)) == 4.5  # 1e-6 / s = 4.48 -> e4m3 4.5
    for variant in ("deepseek", "deepgemm"):
        assert float(R.fake_quant(small, None, "fp8_block", variant, fp32_scale=True)[0, 0]) == float(torch.tensor(4.5) * s32)


@pytest.mark.parametrize("fmt, tile", [("mxfp8", (1, 32)), ("mxfp4", (32, 32)), ("fp8_block", (1, 128)), ("fp8_block", (128, 128))])
def test_partial_tiles_are_short_tiles(fmt, tile):
    """A partial tile equals the same values zero-padded to a full tile (padding cropped)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, tile[0] + 3, tile[1] + 5, generator=g).to(torch.bfloat16)
    pad = torch.nn.functional.pad(x, (0, tile[1] - 5, 0, tile[0] - 3 if tile[0] > 1 else 0))
    opts = {"tile_2d": True} if tile[0] > 1 else {}
    assert torch.equal(R.fake_quant(x, None, fmt, **opts), R.fake_quant(pad, None, fmt, **opts)[:, : x.shape[1], : x.shape[2]])


def test_2d_tiles_share_one_scale_and_1d_blocks_do_not():
    x = torch.ones(32, 32)
    x[0, 0] = 2.0**10  # one large element: its 32x32 tile flushes the ones, its 1x32 block only row 0
    y2 = R.fake_quant(x, None, "mxfp4", tile_2d=True)
    y1 = R.fake_quant(x, None, "mxfp4")
    assert (y2[1:] == 0).all() and (y1[1:] == 1).all()
    xn = torch.ones(1, 16, 16)
    xn[0, 0, 0] = 6.0 * 448
    assert (R.fake_quant(xn, torch.tensor(6.0 * 448), "nvfp4", tile_2d=True)[0, 1:] == 0).all()


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "fp8_block"])
def test_no_amax_api_zero_size_experts_and_backward(fmt):
    ws = [torch.randn(0, 40).bfloat16(), torch.randn(3, 40).bfloat16(), torch.randn(5, 0).bfloat16()]
    out = R.fake_quant_experts(ws, None, fmt)
    assert [tuple(o.shape) for o in out] == [(0, 40), (3, 40), (5, 0)]
    assert R.fake_quant(torch.randn(4, 0, 40), None, fmt).shape == (4, 0, 40)
    with pytest.raises(ValueError, match="takes no amax"):
        R.fake_quant_experts(ws, torch.ones(3), fmt)
    x = torch.tensor([[1.0, math.nan, math.inf, -3.0]])
    g = torch.tensor([[5.0, 6.0, 7.0, 8.0]])
    assert R.ste_backward(x, None, g, "pass_through") is g
    assert torch.equal(R.ste_backward(x, None, g, "clipped"), torch.tensor([[5.0, 0.0, 7.0, 8.0]]))
    assert torch.equal(R.ste_backward_experts(ws, None, [torch.ones_like(w) for w in ws], "clipped", fmt=fmt)[1], torch.ones(3, 40).bfloat16())
    with pytest.raises(TypeError, match="amax must be a torch.Tensor"):
        R.ste_backward_experts(ws, None, [torch.ones_like(w) for w in ws], "clipped")  # None needs a format without amax
    with pytest.raises(TypeError, match="amax must be a torch.Tensor"):
        R.ste_backward(x, 1.0, g, "clipped")  # type: ignore[arg-type]
