"""amax at the ends of the valid range, kernel against reference, and tensors with the negative bit.

The values are the ``limits`` amax policy's (``cases.amax.LIMIT_AMAX``): ``+0``, ``-0``, an fp32
subnormal, the smallest normal and ``FP32_MAX``.  ``-0.0`` is valid (``-0.0 >= 0``) and is amax 0:
every format and variant gives for it exactly the bits of ``+0.0`` (``reference/granularity.py``).
Every kernel format that takes an amax, per tensor, per expert (list and stacked) and per channel
(list and stacked), checks on and off.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels, reference
from moe_fq_parity.cases.amax import LIMIT_AMAX
from moe_fq_parity.reference.formats import format_spec

from .bitcheck import assert_same_bits, expert_weights

BF = torch.bfloat16
ROWS, COLS = len(LIMIT_AMAX), 40  # 40: two NVFP4 blocks and a short one of 8


def _limits(count: int, start: int = 0) -> torch.Tensor:
    """``count`` values of ``LIMIT_AMAX`` cycled from ``start`` (fp32; ``-0.0`` keeps its sign)."""
    vals = torch.tensor(LIMIT_AMAX, dtype=torch.float32)
    return vals[(torch.arange(count) + start) % len(vals)]


def test_the_values_are_what_they_claim() -> None:
    a = torch.tensor(LIMIT_AMAX, dtype=torch.float32)
    assert torch.signbit(a).tolist() == [False, True, False, False, False] and bool((a[:2] == 0).all())
    assert 0 < float(a[2]) < torch.finfo(torch.float32).tiny == float(a[3]) and float(a[4]) == torch.finfo(torch.float32).max


@pytest.mark.parametrize("fmt", [f for f in reference.FORMATS if format_spec(f).takes_amax])
def test_reference_negative_zero_amax_is_zero_amax(fmt: str) -> None:
    """The spec: amax ``-0.0`` gives the bits of amax ``+0.0``, every variant and granularity."""
    x = torch.stack(expert_weights(torch.Generator().manual_seed(0), [(4, COLS)] * 2, BF, specials=False))
    x[0, 0, :3] = torch.tensor([0.0, -0.0, 6.0])
    for variant in reference.variants(fmt):
        grans = [("per_tensor", ()), ("per_expert", (2,))]
        if "per_channel" in format_spec(fmt).amax_granularities:
            grans.append(("per_channel", (2, 4)))
        for gran, shape in grans:
            neg = reference.fake_quant(x, torch.full(shape, -0.0), fmt, variant)
            pos = reference.fake_quant(x, torch.full(shape, 0.0), fmt, variant)
            assert_same_bits([neg], [pos], [x], case=f"{fmt}.{variant}/{gran}: amax -0.0 vs +0.0")


def _data(fmt: str, shapes, gen: torch.Generator, device: str) -> list[torch.Tensor]:
    ws = expert_weights(gen, shapes, BF, specials=True)
    if fmt == "nvfp4":  # the spec rejects NaN input to NVFP4
        ws = [torch.where(torch.isnan(w), torch.zeros((), dtype=w.dtype), w) for w in ws]
    return [w.to(device) for w in ws]


@pytest.mark.parametrize("check", [True, False], ids=["checked", "unchecked"])
@pytest.mark.parametrize("fmt", [f for f in kernels.FORMATS if format_spec(f).takes_amax])
def test_limit_amax_matches_reference(fmt: str, check: bool, gen: torch.Generator, device: str) -> None:
    """Each limit value per tensor (one stacked call each), per expert (one expert each, list and
    stacked) and per channel (one row each, shifted per expert), bit for bit with the reference."""
    n = len(LIMIT_AMAX)
    ws = _data(fmt, [(ROWS, COLS)] * n, gen, device)
    x = torch.stack(ws)
    for v in LIMIT_AMAX:
        a = torch.tensor(v, dtype=torch.float32, device=device)
        assert_same_bits([kernels.fake_quant(x, a, fmt, check_values=check)], [reference.fake_quant(x, a, fmt)], [x],
                         case=f"{fmt}/per_tensor/amax={v!r}")  # fmt: skip
    per_expert = _limits(n).to(device)
    want = reference.fake_quant_experts(ws, per_expert, fmt)
    assert_same_bits(kernels.fake_quant_experts(ws, per_expert, fmt, check_values=check), want, ws, case=f"{fmt}/per_expert/list")
    assert_same_bits(list(kernels.fake_quant(x, per_expert, fmt, check_values=check).unbind(0)), want, ws, case=f"{fmt}/per_expert/stacked")
    if "per_channel" not in format_spec(fmt).amax_granularities:
        return
    per_channel = torch.stack([_limits(ROWS, i) for i in range(n)]).to(device)
    want = reference.fake_quant_experts(ws, per_channel, fmt)
    assert_same_bits(kernels.fake_quant_experts(ws, per_channel, fmt, check_values=check), want, ws, case=f"{fmt}/per_channel/list")
    assert_same_bits(list(kernels.fake_quant(x, per_channel, fmt, check_values=check).unbind(0)), want, ws, case=f"{fmt}/per_channel/stacked")


def test_limit_amax_clipped_backward_matches_reference(gen: torch.Generator, device: str) -> None:
    ws = _data("int8", [(ROWS, COLS)] * len(LIMIT_AMAX), gen, device)
    grads = [torch.randn(w.shape, generator=gen).to(BF).to(device) for w in ws]
    for amax in (_limits(len(ws)), torch.stack([_limits(ROWS, i) for i in range(len(ws))])):
        amax = amax.to(device)
        assert_same_bits(kernels.ste_backward_experts(ws, amax, grads, "clipped"), reference.ste_backward_experts(ws, amax, grads, "clipped"),
                         ws, case=f"clipped/limits/{tuple(amax.shape)}")  # fmt: skip


NEG = "is a negated view"


@pytest.mark.parametrize("fmt", kernels.FORMATS)
def test_negated_weights_are_a_clear_error(fmt: str, device: str) -> None:
    """A negated view shares its base's memory, which holds the negated values: the kernel refuses
    it (even where the base's table is cached: same address), the reference computes by value."""
    w = torch.randn(4, 32).to(BF).to(device)
    neg = torch._neg_view(w)
    amax = torch.ones(1, device=device) if format_spec(fmt).takes_amax else None
    assert_same_bits(reference.fake_quant_experts([neg], amax, fmt), reference.fake_quant_experts([-w], amax, fmt), case="reference by value")
    kernels.fake_quant_experts([w], amax, fmt)  # caches the table of w's address
    with pytest.raises(ValueError, match=rf"weights\[0\] {NEG}.*resolve_neg"):
        kernels.fake_quant_experts([neg], amax, fmt)
    with pytest.raises(ValueError, match=rf"x {NEG}.*resolve_neg"):
        kernels.fake_quant(neg.unsqueeze(0), amax, fmt)


def test_negated_gradients_are_a_clear_error(device: str) -> None:
    w = torch.randn(4, 32).to(BF).to(device)
    g = torch.randn(4, 32).to(BF).to(device)
    amax = torch.ones(1, device=device)
    kernels.ste_backward_experts([w], amax, [g], "clipped")
    with pytest.raises(ValueError, match=rf"grads\[0\] {NEG}"):
        kernels.ste_backward_experts([w], amax, [torch._neg_view(g)], "clipped")
    with pytest.raises(ValueError, match=rf"x {NEG}"):
        kernels.ste_backward(torch._neg_view(w), amax[0], g, "clipped")
    with pytest.raises(ValueError, match=rf"grad_out {NEG}"):
        kernels.ste_backward(w, amax[0], torch._neg_view(g), "clipped")


@pytest.mark.parametrize("fmt", ["int8", "nvfp4"])
def test_negated_amax_is_read_by_value(fmt: str, device: str) -> None:
    """An amax with the negative bit is read by value, like the reference: a negated view of
    ``-a`` is ``a`` (valid), and of ``a`` is ``-a`` (an error)."""
    ws = [torch.randn(4, 32).to(BF).to(device) for _ in range(2)]
    a = torch.tensor([0.5, 2.0], device=device)
    want = reference.fake_quant_experts(ws, a, fmt)
    got = kernels.fake_quant_experts(ws, torch._neg_view(-a), fmt)
    assert_same_bits(got, want, ws, case="list")
    assert_same_bits(list(kernels.fake_quant(torch.stack(ws), torch._neg_view(-a), fmt).unbind(0)), want, ws, case="stacked")
    with pytest.raises(ValueError, match="amax is negative"):
        kernels.fake_quant_experts(ws, torch._neg_view(a), fmt, check_values="sync")
