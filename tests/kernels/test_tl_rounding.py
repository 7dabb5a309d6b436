"""The Triton rounding primitives against IEEE (numpy fp32) and the reference, value by value.

Each primitive runs in a one-line test kernel over a tensor of inputs, so a failure names the
primitive rather than a whole fake-quant pipeline.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import triton
import triton.language as tl

from moe_fq_parity.kernels import env
from moe_fq_parity.kernels.tl_rounding import (
    div_rn_pos,
    f32_to_bits,
    int_dequant_magnitude,
    out_bits,
    recip_subnormal,
    round_mag_e2m1,
    round_sat_e4m3,
)
from moe_fq_parity.reference.rounding import round_to_e2m1 as ref_e2m1
from moe_fq_parity.reference.rounding import round_to_e4m3 as ref_e4m3
from moe_fq_parity.reference.rounding import to_output_dtype

from .bitcheck import assert_same_bits


@triton.jit
def _div_kernel(a_ptr, b_ptr, o_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o_ptr + i, div_rn_pos(tl.load(a_ptr + i, mask=m, other=1.0), tl.load(b_ptr + i, mask=m, other=1.0)), mask=m)


@triton.jit
def _dequant_kernel(m_ptr, s_ptr, o_ptr, n, EXACT_FMA: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    msk = i < n
    s = tl.load(s_ptr + i, mask=msk, other=1.0)
    r = div_rn_pos(tl.zeros_like(s) + 1.0, s)
    tl.store(o_ptr + i, int_dequant_magnitude(tl.load(m_ptr + i, mask=msk, other=0.0), s, r, EXACT_FMA), mask=msk)


@triton.jit
def _recip_sub_kernel(s_ptr, o_ptr, n, EXACT_FMA: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    tl.store(o_ptr + i, recip_subnormal(tl.load(s_ptr + i, mask=m, other=2.0**127), EXACT_FMA), mask=m)


@triton.jit
def _grid_kernel(x_ptr, o_ptr, n, WHICH: tl.constexpr, HW_E4M3: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    x = tl.load(x_ptr + i, mask=m, other=0.0)
    if WHICH == 0:
        y = round_sat_e4m3(x, HW_E4M3)
    else:
        y = round_mag_e2m1(tl.minimum(x, 6.0))
    tl.store(o_ptr + i, y, mask=m)


@triton.jit
def _out_kernel(x_ptr, s_ptr, o_ptr, n, IO: tl.constexpr, HW_BF16: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    y = tl.load(x_ptr + i, mask=m, other=0.0)
    sign = tl.load(s_ptr + i, mask=m, other=0)
    if IO == 2:
        nan_bits = tl.full([], 0x7FFFFFFF, tl.int32)
    else:
        nan_bits = tl.full([], 0x7FFF, tl.int16)
    tl.store(o_ptr + i, f32_to_bits(tl.abs(y), sign, y != y, nan_bits, IO, HW_BF16), mask=m)


@triton.jit
def _out_bits_kernel(y_ptr, x_ptr, o_ptr, n, HW_BF16: tl.constexpr, NAN_IN_Y: tl.constexpr, WORDS: tl.constexpr, BLOCK: tl.constexpr):
    """``out_bits`` for bf16 output: magnitude ``|y|`` (a NaN ``y`` as it is, sign bit included), sign
    from the bf16 input ``x``, NaN where ``y`` is; ``WORDS``: the elements as pairs ``[BLOCK // 2, 2]``
    written as int32 words (``n`` even)."""
    if WORDS:
        w = tl.program_id(0) * (BLOCK // 2) + tl.arange(0, BLOCK // 2)
        i = w[:, None] * 2 + tl.arange(0, 2)[None, :]
    else:
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n
    y = tl.load(y_ptr + i, mask=m, other=0.0)
    bits = tl.load(x_ptr + i, mask=m, other=0)
    x = (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    ymag = tl.where(y != y, y, tl.abs(y))
    out = out_bits(ymag, x, bits, tl.full([], -32768, tl.int16), y != y, tl.full([], 0x7FFF, tl.int16), 0, HW_BF16, NAN_IN_Y, WORDS)
    if WORDS:
        tl.store(o_ptr.to(tl.pointer_type(tl.int32)) + w, out, mask=w < n // 2)
    else:
        tl.store(o_ptr + i, out, mask=m)


def _run(kernel, device: str, *tensors, **kw) -> None:
    """One launch over all inputs: a single program on the interpreter (programs cost Python time
    there), 1024-element programs on the GPU (a huge single tile would take minutes to compile)."""
    n = tensors[0].numel()
    block = 1024 if device == "cuda" else triton.next_power_of_2(n)
    with np.errstate(all="ignore"):
        kernel[(triton.cdiv(n, block),)](*tensors, n, BLOCK=block, enable_fp_fusion=False, **kw)


def _bits_to_f32(bits: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(bits.astype(np.uint32).view(np.float32).copy())


def test_div_rn_pos_is_ieee_division(gen: torch.Generator, device: str) -> None:
    """Random positive normals and subnormals, zero, inf, overflowing and underflowing quotients."""
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (), generator=gen)))
    # 200k pairs: the truncated quotient bits are exactly "100..0" (round up only via the sticky
    # remainder) about once in 2**14 pairs, so a broken sticky bit shows up several times
    a = rng.integers(1, 0x7F800000, 200_000).astype(np.uint32)
    b = rng.integers(1, 0x7F800000, 200_000).astype(np.uint32)
    a[:200] = rng.integers(1, 0x00800000, 200)  # subnormal dividends
    b[200:400] = rng.integers(1, 0x00800000, 200)  # subnormal divisors
    b[400:410] = 0  # zero divisor -> inf
    b[410:420] = 0x7F800000  # inf divisor -> 0
    a[420:440] = 0x3F800000  # 1 / b: the reciprocals the kernel takes
    a[440:460] = np.float32(2688.0).view(np.uint32)
    b[460:470] = np.float32(3.4028235e38).view(np.uint32)
    a, b = _bits_to_f32(a), _bits_to_f32(b)
    with np.errstate(all="ignore"):
        want = torch.from_numpy(a.numpy() / b.numpy())
    out = torch.empty_like(a, device=device)
    _run(_div_kernel, device, a.to(device), b.to(device), out)
    assert_same_bits([out], [want], [a], case="div_rn_pos")


@pytest.mark.parametrize("exact_fma", [True, False], ids=["markstein", "fp64"])
def test_int_dequant_is_correctly_rounded(exact_fma: bool, gen: torch.Generator, device: str) -> None:
    """RN(m/s) for every integer 0..128 against 64 random scales across the exponent range."""
    if exact_fma and not env.exact_fma(torch.device(device).type):
        pytest.skip("this Triton interpreter rounds tl.fma twice; the kernel uses the fp64 path here")
    s = (torch.rand(64, generator=gen) + 1.0) * torch.exp2(torch.randint(-110, 38, (64,), generator=gen).float())
    m = torch.arange(129, dtype=torch.float32)
    mm, ss = torch.meshgrid(m, s, indexing="ij")
    mm, ss = mm.reshape(-1).contiguous(), ss.reshape(-1).contiguous()
    want = torch.from_numpy(mm.numpy() / ss.numpy())
    out = torch.empty_like(mm, device=device)
    _run(_dequant_kernel, device, mm.to(device), ss.to(device), out, EXACT_FMA=exact_fma)
    assert_same_bits([out], [want], [ss], case="int_dequant")


_HW_E4M3 = [False] + ([True] if torch.cuda.is_available() and env.hw_e4m3_rne(torch.device("cuda")) else [])


@pytest.mark.parametrize("hw_e4m3", _HW_E4M3, ids=["integer", "hardware"][: len(_HW_E4M3)])
@pytest.mark.parametrize("which", ["e4m3", "e2m1"])
def test_minifloat_rounding_matches_reference(which: str, hw_e4m3: bool, device: str) -> None:
    """Every non-negative bf16 value (as fp32, 448 to inf included: E4M3 saturates), fp32
    subnormals, and the fp32 neighbours of every grid midpoint (the kernels round magnitudes and put
    the sign back from the input bits).  E4M3 both ways where the device converts in hardware
    (``env.hw_e4m3_rne``: the kernels take it there)."""
    if which == "e2m1" and hw_e4m3:
        pytest.skip("E2M1 has no hardware rounding path")
    x = torch.arange(0, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).float()
    x = torch.cat([x, torch.tensor([1e-45, 1e-40, 5.8e-39]), torch.tensor([3.0e38, float("inf")])])
    grid = ref_e4m3(torch.linspace(-448, 448, 20001)) if which == "e4m3" else ref_e2m1(torch.linspace(-6, 6, 1001))
    g = torch.unique(grid)
    mid = (g[1:] + g[:-1]) / 2
    near = torch.cat([mid, torch.nextafter(mid, mid + 1), torch.nextafter(mid, mid - 1)])
    x = torch.cat([x[~torch.isnan(x)], near[near >= 0]]).contiguous()
    lim = 448.0 if which == "e4m3" else 6.0
    want = (ref_e4m3 if which == "e4m3" else ref_e2m1)(torch.clamp(x, -lim, lim))
    out = torch.empty_like(x, device=device)
    _run(_grid_kernel, device, x.to(device), out, WHICH=0 if which == "e4m3" else 1, HW_E4M3=hw_e4m3)
    assert_same_bits([out], [want], [x], case=which)


_HW_BF16 = [False] + ([True] if torch.cuda.is_available() and env.hw_bf16_rne(torch.device("cuda")) else [])


@pytest.mark.parametrize("hw_bf16", _HW_BF16, ids=["integer", "hardware"][: len(_HW_BF16)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_output_conversion_matches_reference(dtype: torch.dtype, hw_bf16: bool, gen: torch.Generator, device: str) -> None:
    """Random fp32 bit patterns (NaN, inf, subnormal, overflow included) -> output dtype, RNE; the
    magnitude is rounded and the sign OR-ed in, as the kernels do.  bf16 both ways where the device
    has the hardware conversion (the kernels take it there), else the integer rounding."""
    bits = torch.randint(-(2**31), 2**31 - 1, (20000,), generator=gen, dtype=torch.int64).to(torch.int32)
    y = torch.cat([bits.view(torch.float32), torch.tensor([65520.0, 65519.99, 3.3961776e38, 3.3961775e38, -0.0, 5.9e-8])])
    want = to_output_dtype(y, dtype)
    io = {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}[dtype]
    idt = torch.int16 if dtype != torch.float32 else torch.int32
    sign = torch.where(torch.signbit(y), torch.tensor(torch.iinfo(idt).min, dtype=idt), torch.tensor(0, dtype=idt))
    out = torch.empty(y.shape, dtype=idt, device=device)
    _run(_out_kernel, device, y.to(device), sign.to(device), out, IO=io, HW_BF16=hw_bf16)
    assert_same_bits([out.view(dtype)], [want], [y], case=f"to_{dtype}")


@pytest.mark.parametrize("words", [False, True], ids=["int16", "words"])
@pytest.mark.parametrize("nan_in_y", [False, True], ids=["nan_select", "nan_in_y"])
@pytest.mark.parametrize("hw_bf16", _HW_BF16, ids=["integer", "hardware"][: len(_HW_BF16)])
def test_out_bits_matches_reference(hw_bf16: bool, nan_in_y: bool, words: bool, gen: torch.Generator, device: str) -> None:
    """``out_bits`` (bf16 output, the kernels' path): random fp32 magnitudes (NaN, inf, subnormal,
    overflow, ties included) with the sign of a random bf16 input, NaN inputs of either sign
    giving the canonical ``0x7FFF``.  On a GPU with the hardware conversion the sign and NaN are
    applied in fp32 before it (``nan_in_y``: no select, the magnitude's own NaN, here with either
    sign bit and any payload, left to the paired conversion; NaNs sit beside NaNs, beside
    finite values and beside infinities, at even and odd positions of the pairs); the integer path
    applies them to the 16-bit result.  ``words``: the elements as pairs written as int32 words
    (the square-block kernels' stores; on a GPU one ``cvt.rn.bf16x2.f32`` a word)."""
    bits = torch.randint(-(2**31), 2**31 - 1, (20000,), generator=gen, dtype=torch.int64).to(torch.int32)
    y = torch.cat([bits.view(torch.float32), torch.tensor([65520.0, 3.3961776e38, 3.3961775e38, 0.0, 5.9e-8, 1.00390625, 1.01171875, 1.0])])
    y = y.abs()
    xb = torch.randint(-(2**15), 2**15, y.shape, generator=gen, dtype=torch.int32).to(torch.int16)
    xb[:64] = torch.tensor([0x7FC0, -0x0040, 0x7F81, -0x007F] * 16, dtype=torch.int16)  # NaN inputs, both signs
    nans = torch.tensor([0x7FC00000, -0x00400000, 0x7F800001, -1] * 16, dtype=torch.int32)  # NaN magnitudes of either sign
    y[:64] = nans.view(torch.float32)
    y[64:128:2] = nans[:32].view(torch.float32)  # a NaN in the even half of a pair, a random value beside it
    y[129:193:2] = nans[:32].view(torch.float32)  # and in the odd half
    y[200:208] = torch.tensor([float("inf"), float("nan")] * 4)
    want = to_output_dtype(torch.where(torch.signbit(xb.view(torch.bfloat16).float()), -y.abs(), y.abs()), torch.bfloat16)
    out = torch.empty(y.shape, dtype=torch.int16, device=device)
    _run(_out_bits_kernel, device, y.to(device), xb.to(device), out, HW_BF16=hw_bf16, NAN_IN_Y=nan_in_y, WORDS=words)
    assert_same_bits([out.view(torch.bfloat16)], [want], [y], case="out_bits")


@pytest.mark.parametrize("exact_fma", [True, False], ids=["fma", "fp64"])
def test_recip_subnormal_is_ieee_division(exact_fma: bool, gen: torch.Generator, device: str) -> None:
    """``RN(1/s)`` for ``s`` in ``(2**126, FP32_MAX]`` (subnormal quotients, the FP8 block-wise fp32
    scale of a tiny block amax): 200k random ``s``, the range's ends, and every ``s`` whose exact
    quotient lies within 2**-10 of a subnormal-grid midpoint among 4M consecutive patterns."""
    if exact_fma and not env.exact_fma(torch.device(device).type):
        pytest.skip("this Triton interpreter rounds tl.fma twice; the kernel uses the fp64 residual here")
    rng = np.random.default_rng(int(torch.randint(0, 2**31, (), generator=gen)))
    lo, hi = np.float32(2.0**126).view(np.uint32) + 1, np.float32(3.4028235e38).view(np.uint32)
    b = rng.integers(lo, hi, 200_000, endpoint=True).astype(np.uint32)
    dense = np.arange(lo, lo + 4_000_000, dtype=np.uint32)
    k = 2.0**149 / dense.view(np.float32).astype(np.float64)  # the quotient in units of 2**-149 (fp64: 53 bits)
    dense = dense[np.abs(k - np.floor(k) - 0.5) < 2.0**-10]
    b = np.concatenate([b, dense, np.array([lo, hi, np.float32(2.0**127).view(np.uint32)], dtype=np.uint32)])
    s = _bits_to_f32(b)
    with np.errstate(all="ignore"):
        want = torch.from_numpy(np.float32(1.0) / s.numpy())
    out = torch.empty_like(s, device=device)
    _run(_recip_sub_kernel, device, s.to(device), out, EXACT_FMA=exact_fma)
    assert_same_bits([out], [want], [s], case="recip_subnormal")
