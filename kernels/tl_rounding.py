"""Triton rounding primitives that give the same bits on a GPU and under ``TRITON_INTERPRET=1``.

Triton's CPU interpreter truncates fp32->bf16 casts, drops carries in fp8 casts and cannot run
libdevice (docs/measured.md §1).  Every helper here is therefore built from operations whose result IEEE
754 fixes exactly and that both back ends implement the same way:

* fp32 ``+ - *`` (round to nearest even; the kernels are compiled with ``enable_fp_fusion=False``
  so that no ``a*b+c`` is contracted into an fma), ``tl.fma`` where a fused result is wanted;
* integer add / and / or / shift / compare / ``//`` (int64) and ``bitcast``;
* fp32<->fp16, fp32<->fp64 conversions (numpy's and the GPU's are both round-to-nearest-even).

Mirrors ``reference/rounding.py``: ``round_mag_e4m3``, ``round_mag_e2m1`` (on magnitudes) and the output conversion
(``to_output_dtype``) produce exactly what the reference functions do.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .formats import IO_BF16, IO_FP16, IO_FP32

_IO_BF16 = tl.constexpr(IO_BF16)
_IO_FP16 = tl.constexpr(IO_FP16)
_IO_FP32 = tl.constexpr(IO_FP32)


@triton.jit
def rne_integer_magnitude(w):
    """``round_half_even(|w|)`` as fp32 for ``|w| < 2**22``.

    ``(|w| + 1.5*2**23) - 1.5*2**23``: the sum lands in [2**23, 2**24) where the fp32 quantum is 1,
    so the add rounds to an integer, ties to even (1.5*2**23 is even); the subtraction is exact.
    """
    return (tl.abs(w) + 12582912.0) - 12582912.0


@triton.jit
def _round_mag_minifloat(c, EMIN_BITS: tl.constexpr, SHIFT_BITS: tl.constexpr):
    """Round ``c >= 0`` to a minifloat grid, ties to even: ``(c + C) - C`` with
    ``C = 1.5 * 2**(max(e, emin) + 23 - m)`` built from ``c``'s exponent bits (e = floor(log2 c)).

    The sum lies in ``C``'s binade, whose fp32 quantum is ``2**(max(e, emin) - m)``: exactly the
    grid's quantum at ``c`` (its subnormal quantum below ``2**emin``), so the one rounding of the add
    is the grid rounding (``C`` is an even multiple of the quantum: ties go to even); a carry to
    ``2**(e+1)`` is still exact.  ``EMIN_BITS = (emin + 127) << 23``, ``SHIFT_BITS = (23 - m) << 23``.
    """
    e = tl.maximum(c.to(tl.int32, bitcast=True) & 0x7F800000, EMIN_BITS)
    big = (e + (SHIFT_BITS + 0x400000)).to(tl.float32, bitcast=True)
    return (c + big) - big


@triton.jit
def round_mag_e4m3(c):
    """``c`` in [0, 448] -> nearest E4M3 magnitude (fp32), ties to even (m = 3, emin = -6)."""
    return _round_mag_minifloat(c, 121 << 23, 20 << 23)


@triton.jit
def round_sat_e4m3(c, HW_E4M3: tl.constexpr):
    """``c >= 0`` (or NaN) -> nearest E4M3 magnitude of ``min(c, 448)`` as fp32, ties to even.
    ``HW_E4M3`` (``env.hw_e4m3_rne``): the hardware's saturating conversion there and back
    (``cvt.rn.satfinite.e4m3x2.f32``, two elements per instruction; NaN stays NaN), else
    ``round_mag_e4m3`` (NaN gives 448).  Callers write their NaN pattern where ``c`` is NaN."""
    if HW_E4M3:
        return c.to(tl.float8e4nv, fp_downcast_rounding="rtne").to(tl.float32)
    else:
        return round_mag_e4m3(tl.minimum(c, 448.0))


@triton.jit
def round_mag_e2m1(c):
    """``c`` in [0, 6] -> nearest E2M1 magnitude {0,.5,1,1.5,2,3,4,6}, ties to even (m = 1, emin = 0)."""
    return _round_mag_minifloat(c, 127 << 23, 22 << 23)


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
def bf16_pairs(w):
    """int32 words each holding two bf16 values (the lower address in the low half, as both GPUs
    and x86 store them) -> their fp32 values ``[..., 2]`` (low half, high half), exactly: ``w <<
    16`` and ``w & 0xFFFF0000``, one instruction per element.  The same values ``bits_to_f32``
    gives from the int16 bits, which cost a byte permute and a shift each on the GPU."""
    return tl.join(w << 16, w & -65536).to(tl.float32, bitcast=True)


@triton.jit
def bf16_words(b):
    """int16 bits ``[..., 2]`` (low half, high half, as ``bf16_pairs`` gives them) -> the int32 words
    holding them, exactly."""
    lo, hi = tl.split(b)
    return (lo.to(tl.int32) & 0xFFFF) | (hi.to(tl.int32) << 16)


@triton.jit
def pair_magnitude_bits(w):
    """int32 words of two bf16 values -> the larger of their ``magnitude_bits`` (fp32 order, NaN
    above inf), exactly: ``max(w & 0x7FFF0000, (w & 0x7FFF) << 16)``, three integer instructions a
    word.  A block max taken on these keeps only the words live (no fp32 values, no unpacked int16)
    while it crosses warps."""
    return tl.maximum(w & 0x7FFF0000, (w & 0x7FFF) << 16)


@triton.jit
def bf16_bits(x):
    """fp32 ``x`` holding a bf16 value -> its int16 bits (exact: the low half is zero)."""
    return (x.to(tl.int32, bitcast=True) >> 16).to(tl.int16)


@triton.jit
def magnitude_bits(x):
    """``|x|`` of fp32 ``x`` as an int32 whose order is the float order: its bits with the sign
    cleared (bitcast back, they are ``|x|``).  NaN orders above +inf (``> INF_BITS``), so one integer
    max gives both a block's max|x| and whether the block holds a NaN, the same way on every back
    end (float max differs on NaN)."""
    return x.to(tl.int32, bitcast=True) & 0x7FFFFFFF


INF_BITS = tl.constexpr(0x7F800000)
"""``magnitude_bits(+inf)``: a larger value is a NaN."""


@triton.jit
def io_magnitude_bits(bits, IO: tl.constexpr):
    """``magnitude_bits`` of the input taken on the raw input ``bits`` (int16 for bf16/fp16):
    the same order, at the input's width (``io_magnitude_to_f32_bits`` maps it to
    ``magnitude_bits``).  For a block max that crosses warps: only the 16-bit input stays live
    across the reduction, the fp32 values are formed after it."""
    if IO == _IO_FP32:
        return bits & 0x7FFFFFFF
    else:
        return bits.to(tl.int32) & 0x7FFF


@triton.jit
def io_magnitude_to_f32_bits(m, IO: tl.constexpr):
    """``io_magnitude_bits`` -> ``magnitude_bits`` of the same value (exact)."""
    if IO == _IO_BF16:
        return m << 16
    elif IO == _IO_FP16:
        return m.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True)
    else:
        return m


@triton.jit
def f32_to_bits(ymag, sign, is_nan, nan_bits, IO: tl.constexpr, HW_BF16: tl.constexpr):
    """Non-negative fp32 ``ymag`` -> output bits (IO dtype), round to nearest even, ``| sign``;
    ``nan_bits`` where ``is_nan`` (``ymag`` is NaN only there).

    ``sign``: integer tensor of the output width holding only the sign bit (or 0); every format's
    output has its input's sign, so kernels pass ``input_bits & sign_mask``.  bf16: with
    ``HW_BF16`` (``env.hw_bf16_rne``: a GPU) the hardware conversion ``cvt.rn.bf16.f32``, else
    ``(b + 0x7FFF + lsb) >> 16`` on the fp32 bits; both round to nearest even and carry an overflow
    into inf.  The hardware conversion is one instruction against five (its speed:
    ``docs/kernels_performance.md`` section 7).  fp16: the fp32->fp16 conversion
    (RNE on both back ends).  The canonical NaN is ``0x7FFF`` (bf16, fp16) or ``0x7FFFFFFF``
    (fp32), as ``reference.rounding.to_output_dtype`` writes it.
    """
    if IO == _IO_BF16:
        if HW_BF16:
            r = ymag.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True) | sign
        else:
            b = ymag.to(tl.int32, bitcast=True)
            r = ((b + (0x7FFF + ((b >> 16) & 1))) >> 16).to(tl.int16) | sign
    elif IO == _IO_FP16:
        r = ymag.to(tl.float16).to(tl.int16, bitcast=True) | sign
    else:
        r = ymag.to(tl.int32, bitcast=True) | sign
    return tl.where(is_nan, nan_bits, r)


@triton.jit
def out_bits(ymag, x, bits, smask, is_nan, nan_bits, IO: tl.constexpr, HW_BF16: tl.constexpr, NAN_IN_Y: tl.constexpr = False,
             WORDS: tl.constexpr = False):
    """Output bits of a format's fp32 magnitude ``ymag`` (>= 0) for input ``bits`` (fp32 value
    ``x``): ``ymag`` rounded to the IO dtype with the input's sign where ``smask`` (the IO width's
    sign mask, or 0 where the format drops the sign) keeps it, ``nan_bits`` where ``is_nan``.

    bf16 on a GPU (``HW_BF16``; ``nan_bits`` is then the canonical ``0x7FFF``): all in fp32 before
    one paired ``cvt.rn.bf16x2.f32``: the sign OR-ed into the fp32 bits, ``0x7FFFFFFF`` where
    ``is_nan``.  The conversion writes ``0x7FFF`` for a NaN of either sign and any payload
    (``env.hw_bf16_rne``), so ``NAN_IN_Y`` (the caller's ``ymag`` is NaN exactly where ``is_nan``)
    skips the select: the NaN, sign bit OR-ed in or not, converts to the canonical NaN itself.  The
    same bits as ``f32_to_bits`` (a sign OR-ed before or after a round to nearest even of the
    magnitude gives the same bits), in about half the instructions: no 16-bit halves taken out of
    and put back into 32-bit registers.  Elsewhere ``f32_to_bits`` (``is_nan`` is read there).

    ``WORDS`` (bf16 pairs ``[..., 2]`` as ``bf16_pairs`` gives them): the int32 words holding the
    two outputs, ``[...]``; on a GPU one ``cvt.rn.bf16x2.f32`` a word writes it directly."""
    if IO == _IO_BF16 and HW_BF16:
        s32 = smask.to(tl.int32) << 16
        z = (ymag.to(tl.int32, bitcast=True) | (x.to(tl.int32, bitcast=True) & s32)).to(tl.float32, bitcast=True)
        if not NAN_IN_Y:
            z = tl.where(is_nan, tl.full([], 0x7FFFFFFF, tl.int32).to(tl.float32, bitcast=True), z)
        if WORDS:
            lo, hi = tl.split(z)
            out = tl.inline_asm_elementwise("cvt.rn.bf16x2.f32 $0, $2, $1;", "=r,f,f", [lo, hi], dtype=tl.int32, is_pure=True, pack=1)
        else:
            out = z.to(tl.bfloat16, fp_downcast_rounding="rtne").to(tl.int16, bitcast=True)
    elif WORDS:
        out = bf16_words(f32_to_bits(ymag, bits & smask, is_nan, nan_bits, IO, HW_BF16))
    else:
        out = f32_to_bits(ymag, bits & smask, is_nan, nan_bits, IO, HW_BF16)
    return out


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
def recip_subnormal(s, EXACT_FMA: tl.constexpr):
    """``RN(1/s)`` for ``s`` in ``(2**126, FP32_MAX]``, where the quotient is subnormal: the
    subnormal grid's spacing is ``2**-149``, so the result is ``k * 2**-149`` with ``k`` the integer
    nearest ``2**149 / s = 2**23 / t`` (``t = s * 2**-126`` in ``(1, 4]``, exact), ties to even,
    and ``k`` (at most ``2**23``) is the result's bit pattern.

    ``q = RN(2**23 / t)`` (normal operands and quotient: any IEEE division, flush-to-zero or not)
    lies in ``[2**21, 2**23)`` with at least one fractional bit, within half an ulp (<= 1/4) of the
    exact quotient, so only ``frac(q) = 1/2`` leaves the integer rounding open: the sign of the
    exact residual ``2**23 - q*t`` (an fma, or fp64 where the interpreter's fma rounds twice: the
    product has at most 48 bits) says on which side of ``q`` the quotient lies (a zero residual
    would be a tie, which no ``t`` in range produces).  A handful of operations per block, against
    the integer long division of ``div_rn_pos``."""
    t = s * 1.1754943508222875e-38  # * 2**-126
    q = tl.math.div_rn(tl.zeros_like(t) + 8388608.0, t)
    fl = tl.math.floor(q)
    frac = q - fl
    if EXACT_FMA:
        r = tl.fma(-q, t, tl.zeros_like(t) + 8388608.0)
    else:
        r = (8388608.0 - q.to(tl.float64) * t.to(tl.float64)).to(tl.float32)  # exact: 48-bit product
    k = fl.to(tl.int32)
    up = (frac > 0.5) | ((frac == 0.5) & ((r > 0.0) | ((r == 0.0) & ((k & 1) == 1))))
    return (k + up.to(tl.int32)).to(tl.float32, bitcast=True)


@triton.jit
def int_dequant_magnitude(m, s2, r2, EXACT_FMA: tl.constexpr):
    """``RN(m / s2)`` for integer-valued fp32 ``0 <= m <= 128``, ``s2`` normal, ``r2 = RN(1/s2)``.

    ``EXACT_FMA``: Markstein's correction ``y0 = RN(m*r2); rho = fma(-y0, s2, m);
    y = fma(rho, r2, y0)``: 3 instructions, checked equal to the correctly rounded quotient for every
    fp32 mantissa of ``s2`` and every ``m`` (``python -m moe_fq_parity.kernels.divproof``).
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
