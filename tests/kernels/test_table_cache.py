"""The expert-table cache: a reused table is never served for experts whose address, shape, dtype or
contiguity changed, and amax is read afresh on every call (in-place writes included)."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity import reference
from moe_fq_parity.kernels import launch, tables

from .bitcheck import assert_same_bits

BF = torch.bfloat16


def _calls(ws, amax, fmt="int8", **opts):
    """Kernel call (checked) next to the reference, bit for bit."""
    got = kernels.fake_quant_experts(ws, amax, fmt, **opts)
    kernels.raise_pending_errors()
    assert_same_bits(got, reference.fake_quant_experts(ws, amax, fmt, **opts), ws, case=f"{fmt}/cache")
    return got


def test_repeated_call_reuses_the_table(gen: torch.Generator, device: str) -> None:
    ws = [torch.randn(4, 32, generator=gen).to(BF).to(device) for _ in range(3)]
    amax = torch.ones(3, device=device)
    tables.clear_table_cache()
    _calls(ws, amax)
    table = tables.table_for(ws, validate=lambda: pytest.fail("a repeated call must not validate again"))
    _calls(list(ws), amax)  # a new list object holding the same tensors
    assert tables.table_for(ws, validate=lambda: None) is table and len(tables._TABLES) == 1


def test_a_stale_table_is_never_served(gen: torch.Generator, device: str) -> None:
    """Same list length each time, so only the key can tell the calls apart."""
    tables.clear_table_cache()
    buf = torch.randn(4096, generator=gen).to(BF).to(device)
    a2 = torch.tensor([0.9, 2.0], device=device)
    base = [buf[:256].view(8, 32), buf[1024:1280].view(8, 32)]
    _calls(base, a2)
    # same addresses, other shapes (rows and columns swapped, then more rows)
    _calls([buf[:256].view(32, 8), buf[1024:1280].view(32, 8)], a2)
    _calls([buf[:512].view(16, 32), buf[1024:1280].view(8, 32)], a2)
    # same shapes, other addresses (the second expert moved)
    _calls([buf[:256].view(8, 32), buf[2048:2304].view(8, 32)], a2)
    # same address and shape, other dtype (bits reinterpreted as fp16)
    _calls([base[0].view(torch.float16), base[1].view(torch.float16)], a2, "fp8_e4m3")
    # same address and shape, not contiguous: rejected, never launched through the cached table
    sq = buf[:1024].view(32, 32)
    _calls([sq, base[1]], a2)
    with pytest.raises(ValueError, match="not contiguous"):
        kernels.fake_quant_experts([sq.t(), base[1]], a2, "int8")
    # backward: same weights, gradients elsewhere
    g1 = [torch.randn(8, 32, generator=gen).to(BF).to(device) for _ in range(2)]
    g2 = [torch.randn(8, 32, generator=gen).to(BF).to(device) for _ in range(2)]
    for g in (g1, g2, g1):
        got = kernels.ste_backward_experts(base, a2 * 0.5, g, "clipped")
        assert_same_bits(got, reference.ste_backward_experts(base, a2 * 0.5, g, "clipped"), case="bwd/cache")


def test_amax_changes_are_always_seen(gen: torch.Generator, device: str) -> None:
    """amax is not part of the table: in-place writes, a new tensor, another granularity."""
    tables.clear_table_cache()
    ws = [torch.randn(6, 48, generator=gen).to(BF).to(device) for _ in range(3)]
    amax = torch.tensor([1.0, 2.0, 3.0], device=device)
    first = _calls(ws, amax)
    amax.mul_(0.25)  # in place: same address, version moved
    second = _calls(ws, amax)
    assert any(not torch.equal(a, b) for a, b in zip(first, second)), "the new amax must change the outputs"
    amax.data.copy_(torch.tensor([0.1, 0.2, 0.3]))  # in place, version counter bypassed
    _calls(ws, amax)
    _calls(ws, torch.tensor([0.5, 0.5, 0.5], device=device))  # a new tensor
    _calls(ws, torch.rand(3, 6, generator=gen).to(device) + 0.1)  # per channel through the same table
    _calls(ws, torch.tensor([0.5, 0.5, 0.5], device=device, dtype=BF))  # bf16 amax, converted
    amax.fill_(float("nan"))  # a bad value written in place after the table was cached
    with pytest.raises(ValueError, match="amax is NaN"):
        kernels.fake_quant_experts(ws, amax, "int8")
        kernels.raise_pending_errors()


def test_cache_is_bounded() -> None:
    tables.clear_table_cache()
    ws = torch.zeros(tables.CACHE_SIZE + 8, 4, 16, dtype=BF)
    for i in range(tables.CACHE_SIZE + 8):
        tables.table_for([ws[i]], validate=lambda: None)
    assert len(tables._TABLES) == tables.CACHE_SIZE


def _stacked_call(x, amax, fmt="int8"):
    got = kernels.fake_quant(x, amax, fmt)
    kernels.raise_pending_errors()
    assert_same_bits([got], [reference.fake_quant(x, amax, fmt)], [x], case=f"{fmt}/stacked-plan {tuple(x.shape)} {x.dtype}")


def test_stacked_plans_follow_shape_and_dtype_never_the_address(gen: torch.Generator, device: str) -> None:
    """The stacked calls cache their launch plan (tile, grid, constants) on shape, dtype, device and
    options: one buffer seen under other shapes or another dtype gets its own plan, new tensors of a
    seen shape reuse one."""
    launch._STACKED.clear()
    buf = torch.randn(2048, generator=gen).to(BF).to(device)
    a2, a4 = torch.tensor([0.5, 2.0], device=device), torch.tensor([0.3, 0.6, 1.2, 2.4], device=device)
    _stacked_call(buf[:512].view(2, 8, 32), a2)
    assert len(launch._STACKED) == 1
    _stacked_call(torch.randn(2, 8, 32, generator=gen).to(BF).to(device), a2)  # other tensor, same shape
    _stacked_call(buf[:512].view(2, 8, 32), torch.tensor(1.5, device=device))  # per tensor: amax strides are arguments
    assert len(launch._STACKED) == 1
    _stacked_call(buf[:512].view(2, 32, 8), a2)  # same address, rows and columns swapped
    _stacked_call(buf[:512].view(4, 8, 16), a4)  # same address, more experts
    _stacked_call(buf[:512].view(2, 8, 32).view(torch.float16), a2, "fp8_e4m3")  # same bytes as fp16
    assert len(launch._STACKED) == 4
    x, g = buf[:512].view(2, 8, 32), buf[512:1024].view(2, 8, 32)
    for a in (torch.tensor([0.5, 2.0], device=device), torch.tensor([2.0, 0.5], device=device)):  # one plan, new amax
        got = kernels.ste_backward(x, a, g, "clipped")
        assert_same_bits([got], [reference.ste_backward(x, a, g, "clipped")], case="bwd/stacked-plan")
    got = kernels.ste_backward(x.reshape(2, 32, 8), a, g.reshape(2, 32, 8), "clipped")
    assert_same_bits([got], [reference.ste_backward(x.reshape(2, 32, 8), a, g.reshape(2, 32, 8), "clipped")], case="bwd/stacked-plan")
    assert len(launch._STACKED) == 6


def test_stacked_plans_are_bounded() -> None:
    launch._STACKED.clear()
    x = torch.zeros(launch.STACKED_PLANS + 4, 2, 16, dtype=BF)
    for n in range(1, launch.STACKED_PLANS + 5):
        launch._stacked_plan(("test", n), x[:n], lambda shapes: ((1, 1), {}, shapes))
    assert len(launch._STACKED) == launch.STACKED_PLANS and ("test", 1) not in launch._STACKED
