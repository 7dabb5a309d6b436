"""The grouped fake-quant forward kernel: one launch for all N experts, every format.

Per format the fp32 op sequence is the reference default variant's (see the module docstrings of
``reference/int_quant.py`` ("cuda"), ``reference/fp8_e4m3.py`` ("cuda"), ``reference/nvfp4.py``
("te")); scale divisions are correctly rounded (``tl_rounding.div_rn_pos``, integer only, or
``tl.math.div_rn`` where operands and quotient are provably normal), element rounding uses
``tl_rounding``.  Per-expert scalars are recomputed by each program (a few dozen
instructions): that keeps the whole operation in one launch.

Check flags (``CHECK``): ``flag[0]`` <- 1 if unsigned INT sees a negative input; ``flag[1]`` <- 1
if NVFP4 sees a NaN input.  The host raises ``ValueError`` for them (and for bad amax values, which
it checks itself), as the reference does.  With checks off the defined results are:
unsigned negative input -> quantized with ``lo = 0``; NVFP4 block holding a NaN -> the whole block
is the canonical NaN.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .formats import E4M3_MAX, FMT_FP8, FMT_INT, FMT_NVFP4, FP32_MAX, NVFP4_BLOCK, NVFP4_GLOBAL_SCALE_NUM, TINY_AMAX
from .tiles import expert_base, expert_out_base, program_tile, tile_2d
from .tl_rounding import (
    bits_to_f32,
    div_rn_normal,
    div_rn_pos,
    f32_to_bits,
    int_dequant_magnitude,
    rne_integer_magnitude,
    round_to_e2m1,
    round_to_e4m3,
    sign_bits,
    with_sign,
)

_FMT_INT = tl.constexpr(FMT_INT)
_FMT_FP8 = tl.constexpr(FMT_FP8)
_FMT_NVFP4 = tl.constexpr(FMT_NVFP4)
_TINY = tl.constexpr(TINY_AMAX)
_E4M3_MAX = tl.constexpr(E4M3_MAX)
_GSCALE = tl.constexpr(NVFP4_GLOBAL_SCALE_NUM)
_FMAX = tl.constexpr(FP32_MAX)
_SIXTH = tl.constexpr(0.1666666716337204)  # RN_fp32(1/6) = 0x3E2AAAAB, what torch.reciprocal(6.0) gives
_NVB = tl.constexpr(NVFP4_BLOCK)


@triton.jit
def _flag_if(flag_ptr, slot, bad):
    """Store 1 into ``flag[slot]`` if any element of ``bad`` is true (plain store, idempotent)."""
    tl.store(flag_ptr + slot, 1, mask=tl.max(bad.to(tl.int32)) > 0)


@triton.jit
def _int_tile(x, a, LO: tl.constexpr, QMAX: tl.constexpr, EXACT_FMA: tl.constexpr, INT_DIV: tl.constexpr):
    """INT "cuda": s = RN(qmax/amax); q = clamp(rint(RN(x*s)), lo, qmax); y = RN(q/s); amax < 2**-24 -> +0.

    ``q/s`` is evaluated as ``RN(|q| / (256 s)) * 256`` with the sign put back: the quotient by
    ``s2 = 256 s`` is exact in the same way (power-of-two scaling) but keeps ``|q| * RN(1/s2)``
    finite for every finite amax; multiplying by 256 overflows exactly when ``RN(q/s)`` does.
    """
    zero = a < _TINY
    a1 = tl.where(zero, 1.0, a)
    s = div_rn_normal(tl.zeros_like(a1) + QMAX, a1, INT_DIV)  # a1 in [2**-24, FP32_MAX]: s normal
    s2 = s * 256.0
    r2 = div_rn_normal(tl.zeros_like(s2) + 1.0, s2, INT_DIV)
    v = x * s
    w = tl.minimum(tl.maximum(v, LO), QMAX)  # NaN: overwritten by the caller's NaN mask
    m = rne_integer_magnitude(w)
    y = int_dequant_magnitude(m, s2, r2, EXACT_FMA) * 256.0
    y = with_sign(y, sign_bits(w))
    return tl.where(zero, 0.0, y), zero


@triton.jit
def _fp8_tile(x, a, INT_DIV: tl.constexpr):
    """FP8 "cuda": a = 1 if amax <= 2**-24; s = RN(448/a); inv = RN(1/s); y = RN(e4m3(RN(x*s)) * inv)."""
    a1 = tl.where(a <= _TINY, 1.0, a)
    s = div_rn_normal(tl.zeros_like(a1) + _E4M3_MAX, a1, INT_DIV)  # a1 in (2**-24, FP32_MAX]
    inv = div_rn_normal(tl.zeros_like(s) + 1.0, s, INT_DIV)
    v = x * s
    c = tl.minimum(tl.maximum(v, -_E4M3_MAX), _E4M3_MAX)
    return round_to_e4m3(c) * inv


@triton.jit
def _nvfp4_tile(x, g, BLOCK_RECIP_INT: tl.constexpr, INT_DIV: tl.constexpr):
    """NVFP4 "te" on a ``[BR, NB, 16]`` tile (zero-padded short blocks): see ``reference/nvfp4.py``.

    1. ge = min(RN(2688/g), FP32_MAX), 1 if 0   2. gd = RN(1/ge)   3. mult = RN(ge * RN(1/6))
    4. vmax = max|x| per block   5. ds8 = e4m3(RN(vmax*mult))   6. es = min(RN(1/RN(ds8*gd)), FP32_MAX)
    7. v = RN(x*es)   8. q = e2m1(v)   9. y = RN(RN(q*ds8)*gd)
    """
    ge = div_rn_normal(tl.zeros_like(g) + _GSCALE, g, INT_DIV)  # g = 0 or subnormal: +inf either way
    ge = tl.where(ge > _FMAX, _FMAX, ge)
    ge = tl.where(ge == 0.0, 1.0, ge)
    gd = div_rn_pos(tl.zeros_like(ge) + 1.0, ge)  # subnormal when ge > 2**126: integer division
    mult = ge * _SIXTH
    vmax = tl.max(tl.abs(x), axis=2, keep_dims=True)
    p = vmax * mult
    ds8 = round_to_e4m3(tl.where(p > _E4M3_MAX, _E4M3_MAX, p))
    d = ds8 * gd
    if BLOCK_RECIP_INT:
        inv_d = div_rn_pos(tl.zeros_like(d) + 1.0, d)
    else:
        # d subnormal: 1/d = RN(1/(d*2**24)) * 2**24 with d*2**24 built exactly from the bits
        # (bits * 2**-125), so a flush-to-zero division never sees a subnormal operand.
        db = d.to(tl.int32, bitcast=True)
        tiny = db < 0x00800000
        dn = tl.where(tiny, db.to(tl.float32) * 2.350988701644575e-38, d)  # 2**-125
        inv_d = tl.math.div_rn(tl.zeros_like(dn) + 1.0, dn)
        inv_d = tl.where(tiny, inv_d * 16777216.0, inv_d)  # 2**24
    es = tl.where(inv_d > _FMAX, _FMAX, inv_d)
    v = x * es
    q = round_to_e2m1(tl.minimum(tl.maximum(v, -6.0), 6.0))
    return (q * ds8) * gd


@triton.jit
def fake_quant_fwd_kernel(
    x_ptr,  # stacked: input bits [N, rows, cols]; list: placeholder of the bits dtype
    y_ptr,  # output bits: stacked [N, rows, cols]; list: one buffer, expert e at meta[1, e]
    meta_ptr,  # list: int64 [5, N] (see tiles.expert_geometry)
    amax_ptr,  # fp32; element (e, r) at e*amax_se + r*amax_sr
    amax_se,
    amax_sr,
    flag_ptr,  # int32 [2]
    n_experts,
    rows_u,
    cols_u,
    FMT: tl.constexpr,
    LO: tl.constexpr,
    QMAX: tl.constexpr,
    IO: tl.constexpr,
    LIST: tl.constexpr,
    PER_CHANNEL: tl.constexpr,
    CHECK: tl.constexpr,
    UNSIGNED: tl.constexpr,
    ALIGNED: tl.constexpr,
    EXACT_FMA: tl.constexpr,
    BLOCK_RECIP_INT: tl.constexpr,
    INT_DIV: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
):
    """Fake-quantize tile ``program_id(0)`` of expert ``program_id(1)``; see the module docstring."""
    e, rows, cols, r0, c0, valid = program_tile(meta_ptr, n_experts, rows_u, cols_u, LIST, ALIGNED, BR, BC)
    if valid:
        xb = expert_base(x_ptr, meta_ptr, 0, n_experts, e, rows, cols, LIST, ALIGNED)
        yb = expert_out_base(y_ptr, meta_ptr, n_experts, e, rows, cols, LIST, ALIGNED)
        if FMT == _FMT_NVFP4:
            NB: tl.constexpr = BC // _NVB
            rl = tl.arange(0, BR)[:, None, None]
            cl = tl.arange(0, NB)[None, :, None] * _NVB + tl.arange(0, _NVB)[None, None, :]
            tile0 = r0.to(tl.int64) * cols + c0
            offs = rl * cols + cl
            mask = ((r0 + rl) < rows) & ((c0 + cl) < cols)
            g = tl.load(amax_ptr + e * amax_se)
            bits = tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
            x = bits_to_f32(bits, IO)
            y = _nvfp4_tile(x, g, BLOCK_RECIP_INT, INT_DIV)
            nan = x != x
            block_nan = tl.max(nan.to(tl.int32), axis=2, keep_dims=True) > 0
            out = f32_to_bits(y, nan | block_nan, IO)
            if CHECK:
                _flag_if(flag_ptr, 1, nan & mask)
        else:
            tile0, offs, rl, rmask, mask = tile_2d(r0, c0, rows, cols, BR, BC)
            if PER_CHANNEL:
                a = tl.load(amax_ptr + e * amax_se + (r0 + rl) * amax_sr, mask=rmask, other=1.0)
            else:
                a = tl.load(amax_ptr + e * amax_se)
            bits = tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
            x = bits_to_f32(bits, IO)
            nan = x != x
            if FMT == _FMT_INT:
                y, zero = _int_tile(x, a, LO, QMAX, EXACT_FMA, INT_DIV)
                nan = nan & (zero == 0)
            else:
                y = _fp8_tile(x, a, INT_DIV)
            out = f32_to_bits(y, nan, IO)
            if CHECK and UNSIGNED:
                _flag_if(flag_ptr, 0, (x < 0.0) & mask)
        tl.store(yb + tile0 + offs, out, mask=mask)
