"""Triton rounding primitives that give the same bits on a GPU and under ``TRITON_INTERPRET=1``.

Triton's CPU interpreter truncates fp32->bf16 casts, drops carries in fp8 casts and cannot run
libdevice (FINDINGS §1).  Every helper here is therefore built from operations whose result IEEE
754 fixes exactly and that both back ends implement the same way:

* fp32 ``+ - *`` (round to nearest even; the kernels are compiled with ``enable_fp_fusion=False``
  so that no ``a*b+c`` is contracted into an fma), ``tl.fma`` where a fused result is wanted;
* integer add / and / or / shift / compare / ``//`` (int64) and ``bitcast``;
* fp32<->fp16, fp32<->fp64 conversions (numpy's and the GPU's are both round-to-nearest-even).

Mirrors ``reference/rounding.py``: ``round_to_e4m3``, ``round_to_e2m1`` and the output conversion
(``to_output_dtype``) produce exactly what the reference functions do.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .formats import IO_BF16, IO_FP16

_IO_BF16 = tl.constexpr(IO_BF16)
_IO_FP16 = tl.constexpr(IO_FP16)


@triton.jit
def exact_pow2(k):
    """``2.0**k`` (fp32) for int32 ``k`` in [-126, 127], written into the exponent bits: exact."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def rne_integer_magnitude(w):
    """``round_half_even(|w|)`` as fp32 for ``|w| < 2**22``.

    ``(|w| + 1.5*2**23) - 1.5*2**23``: the sum lands in [2**23, 2**24) where the fp32 quantum is 1,
    so the add rounds to an integer, ties to even (1.5*2**23 is even); the subtraction is exact.
    """
    return (tl.abs(w) + 12582912.0) - 12582912.0


@triton.jit
def sign_bits(v):
    """The sign bit of fp32 ``v`` as an int32 (``0`` or ``0x80000000``)."""
    b = v.to(tl.int32, bitcast=True)
    return b ^ (b & 0x7FFFFFFF)


@triton.jit
def with_sign(mag, sign):
    """Put int32 ``sign`` bits onto a non-negative fp32 ``mag`` (keeps ``-0.0``)."""
    return (mag.to(tl.int32, bitcast=True) | sign).to(tl.float32, bitcast=True)


@triton.jit
def round_to_e4m3(c):
    """fp32 ``c`` in [-448, 448] -> nearest E4M3 value (fp32), ties to even; ``-0.0`` kept.

    Normal E4M3 range (|c| >= 2**-6): round the fp32 mantissa to 3 bits with an integer add of
    ``0x7FFFF + lsb`` and a mask (a carry moves into the exponent, which is the right result).
    Subnormal range (quantum 2**-9): ``(|c| + 1.5*2**14) - 1.5*2**14``.
    """
    b = c.to(tl.int32, bitcast=True)
    mag = b & 0x7FFFFFFF
    nrm = (mag + (0x7FFFF + ((mag >> 20) & 1))) & -1048576  # -1048576 = 0xFFF00000
    sub = ((tl.abs(c) + 24576.0) - 24576.0).to(tl.int32, bitcast=True)
    r = tl.where(mag >= 0x3C800000, nrm, sub)  # 0x3C800000 = 2**-6
    return (r | (b ^ mag)).to(tl.float32, bitcast=True)


@triton.jit
def round_to_e2m1(c):
    """fp32 ``c`` in [-6, 6] -> nearest E2M1 value {0,.5,1,1.5,2,3,4,6} (fp32), ties to even.

    |c| >= 1: round the mantissa to 1 bit (integer add of ``0x1FFFFF + lsb``, mask);
    |c| < 1: quantum 0.5, ``(|c| + 1.5*2**22) - 1.5*2**22``.
    """
    b = c.to(tl.int32, bitcast=True)
    mag = b & 0x7FFFFFFF
    nrm = (mag + (0x1FFFFF + ((mag >> 22) & 1))) & -4194304  # -4194304 = 0xFFC00000
    sub = ((tl.abs(c) + 6291456.0) - 6291456.0).to(tl.int32, bitcast=True)
    r = tl.where(mag >= 0x3F800000, nrm, sub)  # 0x3F800000 = 1.0
    return (r | (b ^ mag)).to(tl.float32, bitcast=True)


@triton.jit
def bits_to_f32(bits, IO: tl.constexpr):
    """Raw input bits (int16 for bf16/fp16, int32 for fp32) -> fp32, exactly."""
    if IO == _IO_BF16:
        return (bits.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    elif IO == _IO_FP16:
        return bits.to(tl.float16, bitcast=True).to(tl.float32)
    else:
        return bits.to(tl.float32, bitcast=True)


@triton.jit
def f32_to_bits(y, is_nan, IO: tl.constexpr):
    """fp32 ``y`` -> output bits of the IO dtype, round to nearest even; ``is_nan`` -> canonical NaN.

    bf16: ``(b + 0x7FFF + lsb) >> 16`` on the fp32 bits (overflow carries into inf, as RNE must);
    fp16: the fp32->fp16 conversion (RNE on both back ends); canonical NaN = ``0x7FFF`` (bf16, fp16)
    or ``0x7FFFFFFF`` (fp32), as ``reference.rounding.to_output_dtype`` writes it.
    """
    if IO == _IO_BF16:
        b = y.to(tl.int32, bitcast=True)
        r = (b + (0x7FFF + ((b >> 16) & 1))) >> 16
        return tl.where(is_nan, 0x7FFF, r).to(tl.int16)
    elif IO == _IO_FP16:
        r = y.to(tl.float16).to(tl.int16, bitcast=True).to(tl.int32)
        return tl.where(is_nan, 0x7FFF, r).to(tl.int16)
    else:
        return tl.where(is_nan, 0x7FFFFFFF, y.to(tl.int32, bitcast=True))


@triton.jit
def _normalize(bits):
    """Positive fp32 bits -> ``(M, e)`` with int32 ``M`` in [2**23, 2**24), value ``M * 2**(e-23)``.

    Subnormals are normalised with five binary shift steps (no count-leading-zeros needed).
    Zero gives ``M = 0`` (callers special-case it).
    """
    E = (bits >> 23) & 0xFF
    sub = E == 0
    M = tl.where(sub, bits & 0x7FFFFF, (bits & 0x7FFFFF) | 0x800000)
    e = tl.where(sub, -126, E - 127)
    for i in tl.static_range(5):
        sh = 16 >> i  # constexpr: 16, 8, 4, 2, 1
        need = (M < (1 << (24 - sh))) & (M != 0)
        M = tl.where(need, M << sh, M)
        e = tl.where(need, e - sh, e)
    return M, e


@triton.jit
def div_rn_pos(a, b):
    """``RN(a / b)`` in fp32, correctly rounded, from integer arithmetic only.

    For ``a > 0`` finite and ``b >= 0`` (normal, subnormal, zero or +inf); the result may be normal,
    subnormal, +inf (overflow or ``b == 0``) or 0 (``b == inf``).  NaN ``b`` gives NaN.
    With ``a = Ma*2**(ea-23)``, ``b = Mb*2**(eb-23)`` (24-bit mantissas): ``Q = (Ma << 38) // Mb``
    has 38 or 39 bits; it is cut to 24 bits (fewer for a subnormal result) and rounded half to
    even with the remainder as sticky bit.  Independent of how a back end implements division,
    flush-to-zero or libdevice, so the GPU and the interpreter agree bit for bit.
    """
    ab = a.to(tl.int32, bitcast=True)
    bb = b.to(tl.int32, bitcast=True)
    Ma, ea = _normalize(ab)
    Mb, eb = _normalize(bb)
    Mb = tl.where(Mb == 0, 1, Mb)  # b == 0 handled below; avoid an integer division by zero
    num = Ma.to(tl.int64) << 38
    Q = num // Mb.to(tl.int64)
    R = num - Q * Mb.to(tl.int64)
    L = tl.where(Ma >= Mb, 39, 38)
    er = L - 1 + ea - eb - 38  # exponent of the quotient's leading bit
    shift = (L - 24 + tl.maximum(-126 - er, 0)).to(tl.int64)
    shift = tl.minimum(shift, 62)
    mant = Q >> shift
    rem = Q & ((tl.full([], 1, tl.int64) << shift) - 1)
    half = tl.full([], 1, tl.int64) << (shift - 1)
    up = (rem > half) | ((rem == half) & ((R != 0) | ((mant & 1) == 1)))
    mant = mant + up.to(tl.int64)
    bits = tl.where(er < -126, mant, ((er + 126).to(tl.int64) << 23) + mant)
    bits = tl.minimum(bits, 0x7F800000).to(tl.int32)
    bits = tl.where(bb == 0, 0x7F800000, bits)
    bits = tl.where(bb == 0x7F800000, 0, bits)
    bits = tl.where(bb > 0x7F800000, 0x7FC00000, bits)
    bits = tl.where(ab == 0, 0, bits)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def div_rn_normal(a, b, INT_DIV: tl.constexpr):
    """``RN(a / b)`` where ``a``, ``b`` and the quotient are normal (or ``b`` = 0 / subnormal with an
    overflowing quotient): ``div_rn_pos`` or the back end's IEEE division ``tl.math.div_rn``, which
    agree there (a flush-to-zero division differs only on subnormal operands or results)."""
    if INT_DIV:
        return div_rn_pos(a, b)
    else:
        return tl.math.div_rn(a, b)


@triton.jit
def int_dequant_magnitude(m, s2, r2, EXACT_FMA: tl.constexpr):
    """``RN(m / s2)`` for integer-valued fp32 ``0 <= m <= 128``, ``s2`` normal, ``r2 = RN(1/s2)``.

    ``EXACT_FMA``: Markstein's correction ``y0 = RN(m*r2); rho = fma(-y0, s2, m);
    y = fma(rho, r2, y0)``: 3 instructions, checked equal to the correctly rounded quotient for every
    fp32 mantissa of ``s2`` and every ``m`` (``python -m kernels.divproof``).
    Otherwise (an interpreter whose ``tl.fma`` rounds twice): the fp64 quotient rounded to fp32,
    exact because ``m/s2`` lies at least ``2**-49`` (relative) away from every fp32 midpoint while
    the fp64 quotient is within ``2**-53`` of it (also checked by ``kernels.divproof``).
    """
    if EXACT_FMA:
        y0 = m * r2
        rho = tl.fma(-y0, s2, m)
        return tl.fma(rho, r2, y0)
    else:
        return (m.to(tl.float64) / s2.to(tl.float64)).to(tl.float32)
