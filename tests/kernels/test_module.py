"""Module adapter: cached amax vector that cannot go stale, soft gate with identical bits, calibration;
every test for both weight layouts (N parameters, or one stacked ``[N, out, in]``), and the two
layouts give the same bits and load each other's state dicts."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from moe_fq_parity import kernels
from moe_fq_parity import reference

from .bitcheck import assert_same_bits

N, IN, OUT = 3, 40, 6


@pytest.fixture(params=[False, True], ids=["list", "stacked"])
def stacked(request: pytest.FixtureRequest) -> bool:
    return request.param


def _layer(device: str, fmt: str = "int8", stacked: bool = False, **kw) -> kernels.QuantGroupedLinear:
    torch.manual_seed(0)
    layer = kernels.QuantGroupedLinear(N, IN, OUT, fmt, device=device, stacked=stacked, **kw)
    with torch.no_grad():
        for i, q in enumerate(layer.weight_quantizer):
            q._amax.fill_(0.02 * (i + 1))
    return layer


def _want(layer: kernels.QuantGroupedLinear, amax: torch.Tensor) -> list[torch.Tensor]:
    return reference.fake_quant_experts([w.detach() for w in layer.weights()], amax, layer.fmt, **layer.options)


def test_forward_is_grouped_linear_of_reference_weights(device: str, stacked: bool) -> None:
    layer = _layer(device, bias=True, stacked=stacked)
    x = torch.randn(7, IN).to(torch.bfloat16).to(device)
    splits = [3, 0, 4]
    wq = _want(layer, layer.amax_vector())
    want = torch.cat([F.linear(xi, w, b) for xi, w, b in zip(x.split(splits), wq, layer.biases())])
    assert_same_bits([layer(x, splits).detach()], [want.detach()], case="grouped_linear")
    with pytest.raises(ValueError, match="m_splits"):
        layer(x, [3, 3])


@pytest.mark.parametrize("fmt,per_channel", [("fp8_e4m3", False), ("int4", True), ("nvfp4", False)])
def test_soft_gate_gives_the_same_bits(fmt: str, per_channel: bool, device: str, stacked: bool) -> None:
    layer = _layer(device, fmt, per_channel=per_channel, stacked=stacked)
    assert layer.use_kernel()
    k = layer.quantized_weights()
    layer.backend = "reference"
    assert not layer.use_kernel()
    r = layer.quantized_weights()
    assert_same_bits(k, r, case=f"{fmt}/soft_gate")
    assert_same_bits(k, _want(layer, layer.amax_vector()), case=fmt)


def test_amax_vector_is_cached_and_aliased_by_the_buffers(device: str, stacked: bool) -> None:
    layer = _layer(device, stacked=stacked)
    vec = layer.amax_vector()
    assert layer.amax_vector() is vec
    assert all(b.data_ptr() == vec[i].data_ptr() for i, b in enumerate(layer.amax_buffers()))
    assert layer.state_dict()["weight_quantizer.1._amax"].item() == pytest.approx(0.04)


@pytest.mark.parametrize("how", ["load_state_dict", "copy_", "data_copy_", "replace_buffer", "half"])
def test_a_stale_amax_cannot_survive(how: str, device: str, stacked: bool) -> None:
    layer = _layer(device, stacked=stacked)
    before = layer.quantized_weights()  # builds and uses the cache
    new = torch.tensor([0.5, 0.003, 0.07], device=device)
    if how == "load_state_dict":
        other = _layer(device, stacked=stacked)
        with torch.no_grad():
            for q, v in zip(other.weight_quantizer, new):
                q._amax.fill_(v)
        layer.load_state_dict(other.state_dict())
    elif how == "copy_":
        with torch.no_grad():
            layer.weight_quantizer[0]._amax.copy_(new[0])
            layer.weight_quantizer[1]._amax.copy_(new[1])
            layer.weight_quantizer[2]._amax.copy_(new[2])
    elif how == "data_copy_":  # bypasses version counters (Model-Optimizer's amax setter writes this way)
        for q, v in zip(layer.weight_quantizer, new):
            q._amax.data.copy_(v)
    elif how == "replace_buffer":
        for q, v in zip(layer.weight_quantizer, new):
            q._amax = v.clone()
    else:  # buffers replaced by fp16 copies (weights too), then written in place
        layer.half()
        with torch.no_grad():
            for q, v in zip(layer.weight_quantizer, new):
                q._amax.fill_(v)
        new = new.half().float()
    after = layer.quantized_weights()
    assert_same_bits(after, _want(layer, new), case=how)
    changed = any(not torch.equal(a.float(), b.float()) for a, b in zip(before, after))
    assert changed, "the new amax must change the quantized weights (else the test proves nothing)"


def test_a_bad_amax_written_later_is_caught(device: str, stacked: bool) -> None:
    layer = _layer(device, stacked=stacked)
    layer.quantized_weights()
    with torch.no_grad():
        layer.weight_quantizer[2]._amax.fill_(float("nan"))
    with pytest.raises(ValueError, match="amax is NaN"):
        layer.quantized_weights()
        kernels.raise_pending_errors()  # on a GPU the default checks do not block the forward
    layer.check_values = "sync"
    with pytest.raises(ValueError, match="amax is NaN"):
        layer.quantized_weights()


def test_calibration_uses_the_reference_then_the_kernel_agrees(device: str, stacked: bool) -> None:
    layer = _layer(device, stacked=stacked)
    with torch.no_grad():
        for q in layer.weight_quantizer:
            q._amax.zero_()
    x = torch.randn(5, IN).to(torch.bfloat16).to(device)
    with layer.calibrate():
        assert not layer.use_kernel()
        during = layer.quantized_weights()
        layer(x, [2, 2, 1])
    want_amax = torch.stack([w.detach().float().abs().amax() for w in layer.weights()])
    assert torch.equal(layer.amax_vector(), want_amax)
    assert layer.use_kernel()
    assert_same_bits(layer.quantized_weights(), during, case="after_calibration")


def test_layer_validation_and_empty_layer(device: str) -> None:
    with pytest.raises(ValueError, match="per-channel"):
        kernels.QuantGroupedLinear(2, 16, 4, "nvfp4", per_channel=True, device=device)
    with pytest.raises(ValueError, match="backend"):
        kernels.QuantGroupedLinear(2, 16, 4, "int8", backend="cuda", device=device)
    empty = kernels.QuantGroupedLinear(0, 16, 4, "int8", device=device)
    assert empty(torch.zeros(0, 16, dtype=torch.bfloat16, device=device), []).shape == (0, 4)


@pytest.mark.parametrize("fmt,per_channel,ste_mode", [("int8", False, "clipped"), ("fp8_e4m3", True, "clipped"), ("nvfp4", False, "pass_through")])
def test_stacked_layer_gives_the_list_layers_bits_forward_and_backward(fmt: str, per_channel: bool, ste_mode: str, device: str) -> None:
    lst = _layer(device, fmt, per_channel=per_channel, ste_mode=ste_mode, bias=True)
    stk = _layer(device, fmt, per_channel=per_channel, ste_mode=ste_mode, bias=True, stacked=True)
    assert stk.load_state_dict(lst.state_dict()) is not None
    x = torch.randn(9, IN, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16).to(device)
    gy = torch.randn(9, OUT, generator=torch.Generator().manual_seed(4)).to(torch.bfloat16).to(device)
    splits = [4, 0, 5]
    ys = [layer(x, splits) for layer in (lst, stk)]
    assert_same_bits([ys[0].detach()], [ys[1].detach()], case=f"{fmt}/stacked_forward")
    for y in ys:
        y.backward(gy)
    assert_same_bits([w.grad for w in lst.weights()], list(stk.weight.grad.unbind(0)), case=f"{fmt}/stacked_weight_grad")
    assert_same_bits([b.grad for b in lst.biases()], list(stk.bias.grad.unbind(0)), case=f"{fmt}/stacked_bias_grad")
    if ste_mode == "clipped":  # the clipping must change the gradient here, else the comparison proved little
        free = _layer(device, fmt, per_channel=per_channel, ste_mode="pass_through", bias=True, stacked=True)
        free.load_state_dict(lst.state_dict())
        free(x, splits).backward(gy)
        assert not torch.equal(free.weight.grad[0], stk.weight.grad[0])


def test_stacked_state_dict_keeps_the_per_expert_keys_both_ways(device: str) -> None:
    lst, stk = _layer(device, bias=True), _layer(device, bias=True, stacked=True)
    assert sorted(stk.state_dict()) == sorted(lst.state_dict())
    with torch.no_grad():
        stk.weight.mul_(2)
        stk.weight_quantizer[1]._amax.fill_(0.5)
    before = lst.quantized_weights()
    lst.load_state_dict(stk.state_dict())
    assert_same_bits(lst.weights(), list(stk.weight.unbind(0)), case="stacked->list")
    assert_same_bits(lst.quantized_weights(), stk.quantized_weights(), case="stacked->list/fq")
    assert any(not torch.equal(a, b) for a, b in zip(before, lst.quantized_weights()))
    back = _layer(device, bias=True, stacked=True)
    back.load_state_dict(lst.state_dict())
    assert_same_bits([back.weight.detach()], [stk.weight.detach()], case="list->stacked")


def test_stacked_partial_load_reports_the_missing_expert(device: str) -> None:
    stk = _layer(device, stacked=True)
    sd = _layer(device).state_dict()
    sd["weight0"] = torch.full_like(sd["weight0"], 0.25)
    del sd["weight2"]
    kept = stk.weight[2].detach().clone()
    with pytest.raises(RuntimeError, match="Missing key.*weight2"):
        stk.load_state_dict(sd)
    result = stk.load_state_dict(sd, strict=False)
    assert result.missing_keys == ["weight2"] and not result.unexpected_keys
    assert bool((stk.weight[0] == 0.25).all()) and torch.equal(stk.weight[2], kept)
    bad = dict(sd, weight1=torch.zeros(OUT + 1, IN), weight2=torch.zeros(OUT, IN))
    with pytest.raises(RuntimeError, match="do not stack into weight"):
        stk.load_state_dict(bad)


def test_quantized_weight_is_the_stacked_layers(device: str) -> None:
    stk = _layer(device, stacked=True)
    wq = stk.quantized_weight()
    assert wq.shape == (N, OUT, IN)
    assert_same_bits(list(wq.unbind(0)), _want(stk, stk.amax_vector()), case="quantized_weight")
    with pytest.raises(AttributeError, match="quantized_weights"):
        _layer(device).quantized_weight()


NO_AMAX = [f for f in kernels.FORMATS if not reference.format_spec(f).takes_amax]
"""The kernel's formats whose scales come from the data (MX, FP8 block-wise, INT4 group-wise)."""


@pytest.mark.parametrize("fmt", NO_AMAX)
def test_a_format_without_amax_holds_none_and_runs(fmt: str, device: str, stacked: bool) -> None:
    """A layer of a format without amax holds no amax (no ``weight_quantizer`` keys in its state
    dict, ``amax_vector()`` ``None``); its forward is the grouped linear of the reference's weights
    for ``amax=None``, the soft gate and calibration give the same bits, and the clipped backward is
    the reference's (a 2D-tile option where the format has one)."""
    opts = {"tile_2d": True} if reference.format_spec(fmt).option("tile_2d") is not None else {}
    torch.manual_seed(0)
    layer = kernels.QuantGroupedLinear(N, IN, OUT, fmt, bias=True, device=device, stacked=stacked, ste_mode="clipped", **opts)
    assert layer.amax_vector() is None and len(layer.weight_quantizer) == 0
    assert sorted(layer.state_dict()) == sorted([f"weight{i}" for i in range(N)] + [f"bias{i}" for i in range(N)])
    x = torch.randn(7, IN, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16).to(device)
    splits = [3, 0, 4]
    wq = reference.fake_quant_experts([w.detach() for w in layer.weights()], None, fmt, **opts)
    want = torch.cat([F.linear(xi, w, b) for xi, w, b in zip(x.split(splits), wq, layer.biases())])
    assert layer.use_kernel()
    y = layer(x, splits)
    assert_same_bits([y.detach()], [want], case=f"{fmt}/forward")
    y.float().sum().backward()
    grads = [w.grad.clone() for w in layer.weights()] if not stacked else list(layer.weight.grad.clone().unbind(0))
    layer.zero_grad()
    layer.backend = "reference"
    layer(x, splits).float().sum().backward()
    assert_same_bits(grads, [w.grad for w in layer.weights()] if not stacked else list(layer.weight.grad.unbind(0)), case=f"{fmt}/clipped_grad")
    layer.backend = "auto"
    with layer.calibrate():
        during = layer.quantized_weights()
    assert_same_bits(during, wq, case=f"{fmt}/calibrate")
