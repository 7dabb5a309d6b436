"""autograd wrapper: kernel and reference-loop forward give the same bits; STE gradients as specified."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity import reference

from .bitcheck import assert_same_bits, expert_weights

SHAPES = [(4, 24), (0, 24), (4, 24), (4, 24)]


def _leaves(gen, device, dtype=torch.bfloat16):
    return [w.to(device).requires_grad_() for w in expert_weights(gen, SHAPES, dtype, specials=False)]


@pytest.mark.parametrize("fmt", ["int4", "nvfp4"])
def test_kernel_and_reference_paths_give_the_same_bits(fmt: str, gen: torch.Generator, device: str) -> None:
    ws = _leaves(gen, device)
    amax = torch.stack([w.detach().float().abs().amax() if w.numel() else torch.zeros((), device=device) for w in ws]) * 0.9
    k = kernels.fake_quant_experts_ste(ws, amax, fmt, use_kernel=True)
    r = kernels.fake_quant_experts_ste(ws, amax, fmt, use_kernel=False)
    assert_same_bits(k, r, case=fmt)
    assert_same_bits(k, reference.fake_quant_experts([w.detach() for w in ws], amax, fmt), case=fmt)
    assert all(o.requires_grad for o in k)


def test_pass_through_gradient_is_the_incoming_gradient(gen: torch.Generator, device: str) -> None:
    ws = _leaves(gen, device)
    outs = kernels.fake_quant_experts_ste(ws, torch.ones(len(ws), device=device), "fp8_e4m3")
    seeds = [torch.randn(o.shape, generator=gen).to(o.dtype).to(device) for o in outs]
    torch.autograd.backward(outs, seeds)
    for w, s in zip(ws, seeds):
        assert torch.equal(w.grad.view(torch.int16), s.view(torch.int16))


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "reference"])
def test_clipped_gradient_and_unused_outputs(use_kernel: bool, gen: torch.Generator, device: str) -> None:
    ws = _leaves(gen, device)
    amax = torch.tensor([0.5, 0.0, 2.0, 1e-3], device=device) * torch.stack(
        [w.detach().float().abs().amax() if w.numel() else torch.ones((), device=device) for w in ws])
    outs = kernels.fake_quant_experts_ste(ws, amax, "int8", ste_mode="clipped", use_kernel=use_kernel)
    loss = (outs[0].float() * 3).sum() + outs[3].float().sum()  # experts 1 and 2 get no gradient
    loss.backward()
    assert ws[1].grad is None and ws[2].grad is None
    for i, scale in ((0, 3.0), (3, 1.0)):
        g = torch.full(ws[i].shape, scale, dtype=ws[i].dtype, device=device)
        want = reference.ste_backward(ws[i].detach(), amax[i], g, "clipped")
        assert_same_bits([ws[i].grad], [want], case=f"expert{i}")


def test_bad_ste_mode(device: str) -> None:
    with pytest.raises(ValueError, match="ste_mode"):
        kernels.fake_quant_experts_ste([torch.ones(2, 2, device=device)], torch.ones(1, device=device), "int8", ste_mode="soft")
    assert kernels.fake_quant_experts_ste([], torch.ones(0, device=device), "int8") == []
