"""NVFP4 ``te`` (Transformer Engine's reference quantize, then its C++ ``dequantize_nvfp4``) against an
independent numpy-fp32 evaluation of two dequantization orders (TE's and a GEMM's ``RN(RN(q*ds8)*gd)``),
on the ``te_dequant`` match case.

The numpy side shares nothing with ``reference/``: its E4M3/E2M1 roundings search the code grids,
its bf16 rounding works on bits.  Each numpy fp32 operation is one IEEE round-to-nearest-even.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.external.match_cases import nvfp4_te_dequant_case

F32 = np.float32

TE_DEQUANT_DIFFERENCES = {torch.bfloat16: 1062, torch.float32: 96083}
"""Outputs (of 327,712) where ``RN(RN(q*ds8)*gd)`` and ``RN(q*RN(RN(ds8*g)*RN(1/2688)))`` differ on
the ``te_dequant`` case at seed 0, counted by the numpy evaluation below."""


def _grid_round(v: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Nearest value of the sorted non-negative code grid (code = index), ties to the even code,
    saturating at the top; the sign of ``v`` (zeros included) is kept."""
    a = np.minimum(np.abs(v), grid[-1])
    hi = np.clip(np.searchsorted(grid, a, side="left"), 1, len(grid) - 1)
    lo = hi - 1
    dlo, dhi = a - grid[lo], grid[hi] - a
    pick = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return np.copysign(grid[pick], v).astype(F32)


def _e4m3_grid() -> np.ndarray:
    codes = np.arange(0, 0x7F)  # 0x7F is NaN in E4M3 (fn)
    e, m = codes >> 3, codes & 7
    return np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0 ** (e - 7)).astype(F32)


E4M3 = _e4m3_grid()
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=F32)


def _bf16_bits(y: np.ndarray) -> np.ndarray:
    """fp32 -> bf16 round to nearest even, as int16 bits (finite inputs)."""
    b = y.astype(F32).view(np.uint32).astype(np.uint64)
    return ((b + 0x7FFF + ((b >> 16) & 1)) >> 16).astype(np.uint16).view(np.int16)


def numpy_te(x: np.ndarray, g: float) -> tuple[np.ndarray, np.ndarray]:
    """fp32 outputs of one expert ``[rows, 16k]`` in the GEMM order and in TE's C++ order."""
    return numpy_te_blocks(x, g, 16)


def numpy_te_blocks(x: np.ndarray, g: float, block: int) -> tuple[np.ndarray, np.ndarray]:
    """``numpy_te`` with blocks of ``block`` along the last dim."""
    g = F32(g)
    fmax = F32(np.finfo(F32).max)
    with np.errstate(divide="ignore", over="ignore"):
        ge = min(F32(2688) / g, fmax)
        ge = F32(1) if ge == 0 else ge
        gd = F32(1) / ge
        mult = ge * (F32(1) / F32(6))
        xb = x.astype(F32).reshape(x.shape[0], -1, block)
        ds8 = _grid_round(np.abs(xb).max(axis=-1, keepdims=True) * mult, E4M3)
        es = np.minimum(F32(1) / (ds8 * gd), fmax)
    v = xb * es
    q = np.where(v == 0, F32(0), _grid_round(v, E2M1))  # TE's cast_to_fp4x2 codes a scaled -0.0 as +0
    old = (q * ds8) * gd
    new = q * ((ds8 * g) * (F32(1) / F32(2688)))
    return old.reshape(x.shape), new.reshape(x.shape)


@pytest.fixture(scope="module")
def case():
    return nvfp4_te_dequant_case(seed=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_te_is_te_quantize_then_cpp_dequantize(case, dtype):
    """``te`` equals the numpy C++ order bit for bit; the GEMM order ``RN(RN(q*ds8)*gd)`` differs from it on
    ``TE_DEQUANT_DIFFERENCES`` outputs.  Rerun: ``python -m pytest tests/external/test_te_nvfp4_qdq.py``."""
    it = torch.int16 if dtype == torch.bfloat16 else torch.int32
    counts = {"te": 0, "orders": 0}
    for i, (w, g) in enumerate(zip(case.weights, case.amax)):
        x = w.to(dtype)
        old, new = numpy_te(x.to(torch.float32).numpy(), float(g))
        if dtype == torch.bfloat16:
            old, new = _bf16_bits(old), _bf16_bits(new)
        else:
            old, new = old.view(np.int32), new.view(np.int32)
        counts["orders"] += int((old != new).sum())
        for v, want in (("te", new),):
            got = reference.fake_quant(x, g, "nvfp4", v).view(it).numpy()
            bad = np.nonzero(got.reshape(-1) != want.reshape(-1))[0]
            counts[v] += bad.size
            assert bad.size == 0, f"{v} {dtype} expert {i}: {bad.size} outputs differ, first at flat index {bad[0]}"
    assert counts["orders"] == TE_DEQUANT_DIFFERENCES[dtype], counts


def test_tie_block_rounds_to_even_in_te_order(case):
    """The expert ``[[2.625, 9.875, 0...], [18.375, 0...]]``: exact results 2.4609375 and 9.84375 are
    bf16 ties; TE's C++ order reaches them exactly (ties to even: 2.46875, 9.875), the GEMM order lands
    an fp32 ulp below and rounds down (2.453125, 9.8125)."""
    w, g = case.weights[-1], case.amax[-1]
    assert float(g) == 18.375
    assert reference.fake_quant(w.to(torch.float32), g, "nvfp4", "te")[0, :2].tolist() == [2.4609375, 9.84375]
    assert reference.fake_quant(w, g, "nvfp4", "te")[0, :2].tolist() == [2.46875, 9.875]
    old, _ = numpy_te(w.to(torch.float32).numpy(), float(g))
    assert [float(v) for v in torch.from_numpy(_bf16_bits(old)).view(torch.bfloat16)[0, :2]] == [2.453125, 9.8125]


def test_zero_global_amax_gives_zeros():
    """``g = 0``: TE's final scale ``RN(RN(ds8 * 0) * RN(1/2688))`` is 0, every output a zero of the
    code's sign."""
    x = torch.tensor([[0.5, -0.25] + [0.0] * 14], dtype=torch.bfloat16)
    y = reference.fake_quant(x, torch.tensor(0.0), "nvfp4", "te")
    assert torch.equal(y.view(torch.int16)[0, :2], torch.tensor([0, -32768], dtype=torch.int16))


def test_te_2d_tiles_dequantize_the_te_2d_quantize():
    """``tile_2d`` (TE's 16x16 weight tiles): the C++ dequantize of the 2D codes and scales."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 40, 48, generator=gen)
    g = x.abs().amax(dim=(1, 2))
    a = reference.fake_quant_traced(x, g, "nvfp4", "te", tile_2d=True)
    for e in range(2):
        old, new = numpy_te_2d(x[e].numpy(), float(g[e]))
        assert np.array_equal(a.out[e].numpy().view(np.int32), new.view(np.int32))
        assert not np.array_equal(old.view(np.int32), new.view(np.int32))  # the orders part on this input


def numpy_te_2d(x: np.ndarray, g: float) -> tuple[np.ndarray, np.ndarray]:
    """``numpy_te`` on 16x16 tiles (zero-padded), via the tiles' rows laid out as 1x256 blocks."""
    rows, cols = x.shape
    pr, pc = (-rows) % 16, (-cols) % 16
    xp = np.pad(x, ((0, pr), (0, pc)))
    tiles = xp.reshape((rows + pr) // 16, 16, (cols + pc) // 16, 16).transpose(0, 2, 1, 3).reshape(-1, 256)
    outs = []
    for order in numpy_te_blocks(tiles, g, 256):
        t = order.reshape((rows + pr) // 16, (cols + pc) // 16, 16, 16).transpose(0, 2, 1, 3).reshape(rows + pr, cols + pc)
        outs.append(np.ascontiguousarray(t[:rows, :cols]))
    return outs[0], outs[1]
