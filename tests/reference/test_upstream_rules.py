"""Rules read from upstream sources, each spelled out independently of the reference's code:
the clipped STE's clip rules, Model-Optimizer's static NVFP4 op order (block scales through the
FP8 ``cuda`` core, zero-scale blocks, the exact E2M1 tie probe) and TE's ``-0.0`` coding."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference as R
from moe_fq_parity.reference.nvfp4 import nvfp4_tie_probe, static_block_scales
from moe_fq_parity.reference.rounding import round_to_e2m1, round_to_e2m1_te, round_to_e4m3

BF16_X = 1.0078125
"""bf16 value; the fp32 amax ``1.006`` lies below it and rounds (RNE) up to it in bf16."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.int32)


# --- clipped STE: fp32 rule vs torch promotion -------------------------------------------------


def test_clip_rules_differ_exactly_where_amax_rounds_up_to_x():
    x = torch.tensor([[BF16_X, -BF16_X, 1.0, 1.015625, float("nan"), 0.0]], dtype=torch.bfloat16)
    g = torch.full_like(x, 2.0)
    a = torch.tensor(1.006)
    fp32 = R.ste_backward(x, a, g, "clipped")
    promo = R.ste_backward(x, a, g, "clipped", clip_rule="torch_promotion")
    assert fp32.tolist() == [[0.0, 0.0, 2.0, 0.0, 0.0, 2.0]]
    assert promo.tolist() == [[2.0, 2.0, 2.0, 0.0, 0.0, 2.0]]
    # what torch itself does with a 0-dim fp32 amax, and with a 1-element 1-D one
    assert torch.equal(promo, torch.where(x.abs() <= a, g, torch.zeros(1, dtype=g.dtype)))
    assert torch.equal(fp32, torch.where(x.abs() <= a.reshape(1), g, torch.zeros(1, dtype=g.dtype)))
    assert torch.equal(R.ste_backward(x, a.reshape(1), g, "clipped", clip_rule="torch_promotion"), fp32)


def test_torch_promotion_per_expert_in_dtype_per_channel_in_fp32():
    x = torch.tensor([[[BF16_X, 1.0]], [[BF16_X, 1.0]]], dtype=torch.bfloat16)  # [2, 1, 2]
    g = torch.ones_like(x)
    per_expert = torch.tensor([1.006, 1.006])
    per_channel = torch.tensor([[1.006], [1.006]])
    kept = R.ste_backward(x, per_expert, g, "clipped", clip_rule="torch_promotion")
    assert kept[:, 0, 0].tolist() == [1.0, 1.0]
    chan = R.ste_backward(x, per_channel, g, "clipped", clip_rule="torch_promotion")
    assert chan[:, 0, 0].tolist() == [0.0, 0.0]
    experts = R.ste_backward_experts([x[0], x[1]], per_expert, [g[0], g[1]], "clipped", clip_rule="torch_promotion")
    assert [float(e[0, 0]) for e in experts] == [1.0, 1.0]


def test_torch_promotion_fp16_amax_overflows_to_inf_and_fp32_input_agrees():
    x = torch.tensor([[float("inf"), 65504.0]], dtype=torch.float16)
    g = torch.ones_like(x)
    a = torch.tensor(70000.0)
    assert R.ste_backward(x, a, g, "clipped").tolist() == [[0.0, 1.0]]
    assert R.ste_backward(x, a, g, "clipped", clip_rule="torch_promotion").tolist() == [[1.0, 1.0]]
    xf = torch.tensor([[1.00600004, 1.0060001]], dtype=torch.float32)
    gf = torch.ones_like(xf)
    assert torch.equal(R.ste_backward(xf, torch.tensor(1.006), gf, "clipped"),
                       R.ste_backward(xf, torch.tensor(1.006), gf, "clipped", clip_rule="torch_promotion"))


def test_unknown_clip_rule_is_refused():
    x = torch.ones(1, 2, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="clip_rule"):
        R.ste_backward(x, torch.tensor(1.0), x, "clipped", clip_rule="bf16")


# --- Model-Optimizer static NVFP4 --------------------------------------------------------------


def _modelopt_block_scales(bamax: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """compute_fp4_scales -> scaled_e4m3_impl -> fake_e4m3fy, spelled out in fp32."""
    sixth = torch.tensor(1.0) / torch.tensor(6.0)
    bs = bamax * sixth
    ga6 = g * sixth
    a = torch.where(ga6 <= 2.0**-24, torch.ones(()), ga6)
    s = torch.tensor(448.0) / a
    inv = torch.tensor(1.0) / s
    return round_to_e4m3(bs * s) * inv


def _reciprocal_block_scales(bamax: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    sixth = torch.tensor(1.0) / torch.tensor(6.0)
    s = (torch.tensor(1.0) / (g * sixth)) * torch.tensor(448.0)
    return round_to_e4m3(bamax * sixth * s) / s


def test_static_block_scales_follow_the_fp8_cuda_core_not_reciprocal():
    gen = torch.Generator().manual_seed(11)
    g = torch.exp2(torch.randint(-6, 10, (64, 1), generator=gen).float()) * (1 + torch.rand(64, 1, generator=gen))
    bamax = g * (torch.rand(64, 32, generator=gen) * (1 - 2.0**-9) + 2.0**-9)
    got = static_block_scales(bamax, g)
    assert torch.equal(_bits(got), _bits(_modelopt_block_scales(bamax, g)))
    differ = (_bits(got) != _bits(_reciprocal_block_scales(bamax, g))).float().mean()
    assert 0.1 < float(differ) < 0.9  # the old core is wrong in a large share of random pairs
    tiny = static_block_scales(torch.tensor([2.0**-25]), torch.tensor(2.0**-23))  # ga6 <= 2**-24 -> 1
    assert torch.equal(tiny, _modelopt_block_scales(torch.tensor([2.0**-25]), torch.tensor(1.0 * 6)))


def test_static_fp32_output_shows_the_block_scale_bit():
    gen = torch.Generator().manual_seed(5)
    g = torch.tensor(1.1468)
    x = (torch.rand(64, 16, generator=gen) * 2 - 1) * g
    y = R.fake_quant(x, g, "nvfp4", "modelopt_static")
    bamax = x.abs().amax(dim=-1)
    sc = _modelopt_block_scales(bamax, g)[:, None]
    q = R.fake_quant_traced(x, g, "nvfp4", "modelopt_static").grid_round((x.abs() / sc))
    want = torch.where(x >= 0, q * sc, 0.0 - q * sc)
    assert torch.equal(_bits(y), _bits(want))
    old = _reciprocal_block_scales(bamax, g)[:, None]
    assert not torch.equal(_bits(y), _bits(torch.where(x >= 0, q * old, 0.0 - q * old)))


def test_zero_scale_blocks_are_plus_zero_for_the_whole_block():
    x = torch.tensor([[0.5, -0.5, 1.5, -3.0] + [0.0] * 12, [-1.0] * 16])
    stale = torch.zeros(2, 1)
    y = R.fake_quant(x, torch.tensor(1.0), "nvfp4", "modelopt_static", block_amax=stale)
    assert _bits(y).eq(0).all()  # +0.0 everywhere, no -0.0 and no unscaled values
    # a block whose E4M3 scale underflows to 0: negative elements give +0 too
    x = torch.tensor([[-1e-6] * 8 + [1e-6] * 8])
    y = R.fake_quant(x, torch.tensor(448.0 * 6 * 64), "nvfp4", "modelopt_static")
    assert float(static_block_scales(torch.tensor([1e-6]), torch.tensor(448.0 * 6 * 64))) == 0.0
    assert _bits(y).eq(0).all()
    # non-zero scale: -0.0 input and a negative value rounding to 0 give +0.0 (Triton 3.6's -x is 0 - x)
    x = torch.tensor([[6.0, -0.0, -0.1, -1.0] + [0.0] * 12])
    y = R.fake_quant(x, torch.tensor(6.0), "nvfp4", "modelopt_static")
    assert _bits(y)[0, 1] == 0 and _bits(y)[0, 2] == 0 and float(y[0, 3]) == -1.0


def test_tie_probe_rounds_to_even_in_ieee():
    p = nvfp4_tie_probe()
    x = torch.zeros(1, 16)
    x[0, 0], x[0, 1] = p["block_amax"], p["x"]
    g = torch.tensor(p["global_amax"])
    assert float(static_block_scales(torch.tensor([p["block_amax"]]), g)) == p["block_scale"]
    tr = R.fake_quant_traced(x, g, "nvfp4", "modelopt_static")
    assert float(tr.pre_round[0, 1]) == p["ieee_quotient"] == 5.0
    assert float(tr.out[0, 1]) == p["y_ieee"] == 3.75
    assert p["y_quotient_above"] == 6 * p["block_scale"]


# --- Transformer Engine NVFP4: -0.0 ------------------------------------------------------------


def _te_cast_to_fp4_code(v: torch.Tensor) -> torch.Tensor:
    """TE ``custom_recipes`` ``cast_to_fp4x2``'s comparison chain (codes 0..15), spelled out."""
    code = torch.zeros_like(v, dtype=torch.int64)
    pos_edges = [(0.25, 1, False), (0.75, 2, True), (1.25, 3, False), (1.75, 4, True), (2.5, 5, False), (3.5, 6, True), (5.0, 7, False)]
    for edge, c, inclusive in pos_edges:
        code = torch.where((v >= edge) if inclusive else (v > edge), torch.full_like(code, c), code)
    neg = v < -0.0
    ncode = torch.full_like(code, 8)
    for edge, c, inclusive in pos_edges:
        ncode = torch.where((v <= -edge) if inclusive else (v < -edge), torch.full_like(code, c + 8), ncode)
    return torch.where(neg, ncode, code)


def test_te_coding_of_zero_and_nan_is_te_references():
    """``round_to_e2m1_te`` is TE's ``cast_to_fp4x2`` chain: ``v = -0.0`` and NaN code ``+0``, ``(-0.25, 0)`` codes ``-0``;
    the plain sign-keeping ``round_to_e2m1`` differs from it exactly at ``v == -0.0`` (and NaN)."""
    v = torch.tensor([-0.0, 0.0, -0.1, 0.1, -0.25, -0.3, -5.0, 5.0, float("nan")])
    codes = _te_cast_to_fp4_code(v)
    assert codes.tolist() == [0, 0, 8, 0, 8, 9, 14, 6, 0]
    te_vals = torch.tensor([0.0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])[codes]
    assert torch.equal(_bits(round_to_e2m1_te(v)), _bits(te_vals))
    differ = _bits(round_to_e2m1(v[:8])) != _bits(te_vals[:8])
    assert differ.tolist() == [True] + [False] * 7
    x = torch.tensor([[6.0, -0.0, -0.01, 0.0] + [1.0] * 12], dtype=torch.bfloat16)
    y = R.fake_quant(x, torch.tensor(6.0), "nvfp4", "te")
    assert _bits(y)[0, :4].tolist() == [int(_bits(torch.tensor(6.0, dtype=torch.bfloat16))), 0, int(_bits(torch.tensor(-0.0, dtype=torch.bfloat16))), 0]
