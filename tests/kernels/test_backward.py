"""Straight-through backward: pass-through is the identity (same tensor, no launch); clipped equals
``reference.ste_backward`` bit for bit, ``|x| == amax`` kept, NaN ``x`` -> ``+0``."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity import reference

from .bitcheck import AMAX_MODES, amax_stack, assert_same_bits, expert_weights

SHAPES = [(5, 40), (0, 8), (3, 17), (6, 16)]


@pytest.mark.parametrize("per_channel", [False, True], ids=["per_expert", "per_channel"])
@pytest.mark.parametrize(
    "dtype,grad_dtype",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32), (torch.float32, torch.bfloat16)],
    ids=["bf16-bf16grad", "fp16-fp32grad", "fp32-bf16grad"],
)
def test_clipped_list_matches_reference(dtype, grad_dtype, per_channel: bool, gen: torch.Generator, device: str) -> None:
    shapes = [(6, c) for _, c in SHAPES] if per_channel else SHAPES
    ws = [w.to(device) for w in expert_weights(gen, shapes, dtype)]
    amax = amax_stack(ws, AMAX_MODES[: len(ws)], per_channel=per_channel).to(device)
    ws[0].view(-1)[3] = amax[0].reshape(-1)[0].to(dtype) if not per_channel else ws[0].view(-1)[3]  # |x| == amax kept
    grads = [torch.randn(w.shape, generator=gen).to(grad_dtype).to(device) for w in ws]
    got = kernels.ste_backward_experts(ws, amax, grads, "clipped")
    want = reference.ste_backward_experts(ws, amax, grads, "clipped")
    assert_same_bits(got, want, ws, case=f"clipped/{dtype}/{grad_dtype}")


def test_clipped_stacked_matches_reference(gen: torch.Generator, device: str) -> None:
    ws = expert_weights(gen, [(4, 24)] * 3, torch.bfloat16)
    x = torch.stack(ws).to(device)
    g = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
    per_expert = amax_stack(ws, ["below", "max", "odd"], per_channel=False).to(device)
    per_channel = amax_stack(ws, ["below", "max", "odd"], per_channel=True).to(device)
    for amax in (per_expert, per_channel, torch.tensor(0.3, device=device)):
        assert_same_bits([kernels.ste_backward(x, amax, g, "clipped")], [reference.ste_backward(x, amax, g, "clipped")], [x])


def test_clipped_with_many_small_tiles(gen: torch.Generator, device: str) -> None:
    from moe_fq_parity.kernels import launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list

    ws = [w.to(device) for w in expert_weights(gen, [(6, 50), (6, 17), (6, 0)], torch.bfloat16)]
    amax = amax_stack(ws, ["below", "odd", "max"], per_channel=True).to(device)
    grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16).to(device) for w in ws]
    table = tables.expert_table(ws, grads)
    flat, outs = tables.alloc_outputs(table, torch.bfloat16, ws[0].device)
    launch.bwd_list(table, ws, grads, flat, amax_for_list(amax, [6, 6, 6], ws[0].device, nvfp4=False),
                    config=launch.KernelConfig(32, 1, max_bc=16, tiles_per_program=3))  # fmt: skip
    assert_same_bits(outs, reference.ste_backward_experts(ws, amax, grads, "clipped"), ws, case="clipped/small_tiles")


def test_inclusive_boundary_and_nan(device: str) -> None:
    """|x| == amax keeps its gradient, |x| just above does not, NaN x gives +0 (named edge)."""
    a = 0.75
    x = torch.tensor([[a, -a, 0.7539, float("nan"), -0.0, float("inf")]], dtype=torch.bfloat16, device=device)
    g = torch.full(x.shape, -2.5, dtype=torch.bfloat16, device=device)
    out = kernels.ste_backward_experts([x], torch.tensor([a], device=device), [g], "clipped")[0]
    assert out.float().tolist() == [[-2.5, -2.5, 0.0, 0.0, -2.5, 0.0]]
    assert not torch.signbit(out[0, 2:4]).any(), "zeroed gradients must be +0"


def test_pass_through_returns_the_same_tensors(gen: torch.Generator, device: str) -> None:
    ws = [w.to(device) for w in expert_weights(gen, SHAPES, torch.bfloat16)]
    grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16).to(device) for w in ws]
    out = kernels.ste_backward_experts(ws, torch.ones(len(ws), device=device), grads, "pass_through")
    assert all(o is g for o, g in zip(out, grads))
    x, g = torch.stack(ws[:1] * 2), torch.stack(grads[:1] * 2)
    assert kernels.ste_backward(x, torch.ones(2, device=device), g, "pass_through") is g


def test_backward_rejects_bad_arguments(device: str) -> None:
    w = torch.ones(2, 3, dtype=torch.bfloat16, device=device)
    with pytest.raises(ValueError, match="mode"):
        kernels.ste_backward_experts([w], torch.ones(1, device=device), [w], "sometimes")
    with pytest.raises(ValueError, match="gradients for"):
        kernels.ste_backward_experts([w, w], torch.ones(2, device=device), [w], "clipped")
    with pytest.raises(ValueError, match="shape"):
        kernels.ste_backward_experts([w], torch.ones(1, device=device), [torch.ones(3, 2, dtype=torch.bfloat16, device=device)], "clipped")
    with pytest.raises(ValueError, match="not contiguous"):
        kernels.ste_backward_experts([w], torch.ones(1, device=device), [torch.ones(3, 2, dtype=torch.bfloat16, device=device).t()], "clipped")
