"""The grouped fake-quant forward kernel: one launch for all N experts, every format.

Per format the fp32 op sequence is the reference default variant's (see the module docstrings of
``reference/int_quant.py`` ("cuda"), ``reference/fp8_e4m3.py`` ("cuda"), ``reference/nvfp4.py``
("te"), and for the formats whose scales come from the data, one per block along the row,
``reference/int_group.py`` ("cuda", 1x128), ``reference/fp8_block.py`` ("te", 1x128, pow2 scales or
``fp32_scale``), ``reference/mx.py`` ("floor", 1x32, E4M3 or E2M1 elements)).  Block formats load
``[BR, BC / block, block]`` tiles (``tiles.tile_3d``; a short last block of a row is zero-padded, as
the reference pads it) and take the block amax as one integer max of the magnitude bits; with
``tile_2d`` (``TILE_R = block`` rows per block: FP8 block-wise 128x128, MX 32x32, NVFP4 16x16) the
tiles are ``TILE_R`` rows of whole blocks (partial tiles zero-padded in both dims; bf16 pairs loaded
as rows, ``tiles.tile_rows``, and reshaped into blocks, other inputs in one of ``tiles.tile_4d``'s
layouts) and the max runs over the block's rows and columns (FP8 128x128 in bf16: one block a tile,
read twice in row chunks, ``CHUNK_R``, ``_two_pass_block``).  Tiles that are
whole (``ALIGNED``, the model shapes' launches: one-row tiles over rows that are multiples of the
tile, starting at ``t * BC``, ``tiles.tile_aligned``, a block's ``SPLIT`` parts in one thread;
square tiles where every expert's rows and columns are multiples of the tile's) are loaded and
stored without masks.  bf16 block tiles (aligned 1-D, square) are loaded as int32 words of two elements
(``PAIRS``, ``tl_rounding.bf16_pairs``: the elements as a last axis of 2; 1-D tiles are put back in
order before the store, square tiles take their block max on the words,
``tl_rounding.pair_magnitude_bits``, and store words, ``out_bits``'s ``WORDS``).  Tiles are built in the arrangement the installed Triton's layout rule needs
(``TIES_LOW``, ``env.layout_ties_low``); every arrangement gives the same bits.

Scale divisions are correctly rounded (``tl_rounding.div_rn_pos``, integer only, or
``tl.math.div_rn`` where operands and quotient are provably normal; ``recip_subnormal`` where only
the quotient is subnormal); element rounding uses ``tl_rounding``.  On a GPU some steps are the
hardware's, with the same bits: the bf16 output conversion (``HW_BF16``; sign and NaN pattern are
applied to the fp32 value before one paired conversion, ``out_bits``) and, from compute capability
8.9, E4M3 rounding (``HW_E4M3``, ``round_sat_e4m3``).  Per-expert scales are computed once per
program, which then loops over ``TPP`` tiles of its expert; with ``STAGES`` (square bf16 tiles,
``launch.KernelConfig.pipeline_stages``) Triton's pipeliner loads tiles ahead into shared memory,
and a program short of tiles redoes its last one (the same bits, written again) so that the loop
body holds no branch on the tile.

Every format's output has the sign of its input (the scales are positive and every rounding step
keeps the sign, -0 included), so elements are processed as magnitudes and the input's sign bit is
OR-ed into the output bits; the exceptions are per-expert (per-block) constants: INT with amax
< 2**-24 (an INT4 group with block amax < 2**-24) writes +0 for every element (per expert one
branch, per channel or per group an explicit select of the magnitude, sign mask and NaN pattern, so
compiled and interpreted kernels agree whatever their dequantization path), NVFP4 writes +0 where the
scaled value ``x * es`` is zero (TE codes ``-0.0`` as ``+0``), and NaN input writes the canonical NaN.

amax ``-0.0`` is valid (``-0.0 >= 0``) and gives the bits of ``+0.0`` in every format, as in the
reference: INT and FP8 only compare amax with 2**-24, NVFP4 selects ``+0.0`` for it explicitly.

Checks (``CHECK``; slots and host side in ``kernels/checks.py``): program ``(0, e)`` checks every
amax entry of expert ``e`` (empty experts included): NaN -> ``flag[0]``, +-inf -> ``flag[1]``,
negative -> ``flag[2]``; unsigned INT with a negative input -> ``flag[3]``; INT4 group-wise with a
NaN or inf input -> ``flag[4]`` (formats without amax check no amax).  Each flag is a plain store of 1 (idempotent: no atomics, any program order).  A
checked launch also writes the canonical NaN wherever a bad value acts: all of an expert (or row,
per channel) whose amax is bad, a negative element of an unsigned INT input.  With checks off the
defined results are: unsigned negative input -> -0; INT4 group holding a NaN or inf -> every element
of the block is the canonical NaN; bad amax -> whatever the arithmetic gives (not an error).  NVFP4
takes NaN input as its ``te`` reference does (no check): a block holding one is all NaN.  MX and FP8 block-wise take
NaN and inf input as the reference does (no check): an MX block holding one is all NaN (scale code
255); an FP8 block-wise tile holding inf and no NaN is all NaN (``0 * inf``); one holding NaN is
all NaN with ``fp32_scale``, and with pow2 scales gets ``s = 2**-1``: its finite elements are
quantized, an inf element saturates to ``+-896``.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .formats import (
    E2M1_MAX,
    E4M3_MAX,
    FIRST_FROM_DATA,
    FMT_FP8,
    FMT_FP8B_FP32S,
    FMT_INT,
    FMT_INT4G,
    FMT_MXFP4,
    FMT_MXFP8,
    FMT_NVFP4,
    FP32_MAX,
    IO_BF16,
    IO_FP16,
    IO_FP32,
    NVFP4_GLOBAL_SCALE_NUM,
    TINY_AMAX,
)
from .tiles import expert_geometry, expert_ptr, tile_2d, tile_3d, tile_4d, tile_aligned, tile_count, tile_rows
from .tl_rounding import (
    bf16_bits,
    bf16_pairs,
    bits_to_f32,
    div_rn_normal,
    div_rn_pos,
    f32_to_bits,
    INF_BITS,
    int_dequant_magnitude,
    io_magnitude_bits,
    io_magnitude_to_f32_bits,
    magnitude_bits,
    recip_subnormal,
    out_bits,
    pair_magnitude_bits,
    rne_integer_magnitude,
    round_mag_e2m1,
    round_sat_e4m3,
)

_FMT_INT = tl.constexpr(FMT_INT)
_FMT_FP8 = tl.constexpr(FMT_FP8)
_FMT_NVFP4 = tl.constexpr(FMT_NVFP4)
_FMT_INT4G = tl.constexpr(FMT_INT4G)
_FMT_FP8B_FP32S = tl.constexpr(FMT_FP8B_FP32S)
_FMT_MXFP8 = tl.constexpr(FMT_MXFP8)
_FMT_MXFP4 = tl.constexpr(FMT_MXFP4)
_FROM_DATA = tl.constexpr(FIRST_FROM_DATA)
_E2M1_MAX = tl.constexpr(E2M1_MAX)
_IO_BF16 = tl.constexpr(IO_BF16)
_IO_FP16 = tl.constexpr(IO_FP16)
_IO_FP32 = tl.constexpr(IO_FP32)
_TINY = tl.constexpr(TINY_AMAX)
_E4M3_MAX = tl.constexpr(E4M3_MAX)
_GSCALE = tl.constexpr(NVFP4_GLOBAL_SCALE_NUM)
_FMAX = tl.constexpr(FP32_MAX)
_SIXTH = tl.constexpr(0.1666666716337204)  # RN_fp32(1/6) = 0x3E2AAAAB, what torch.reciprocal(6.0) gives
_BF16_MAX = tl.constexpr(3.3895313892515355e38)  # 0x7F7F, torch.finfo(torch.bfloat16).max
_FP16_MAX = tl.constexpr(65504.0)
_INV_GSCALE = tl.constexpr(3.7202381645329297e-04)  # RN_fp32(1/2688) = 0x39C30C31, TE's factor_inv
_TWO126 = tl.constexpr(8.507059173023462e37)  # 2**126: 1/ge is normal up to here


@triton.jit
def _flag_each(flag_ptr, slot, bad):
    """Store 1 into ``flag[slot]`` from every true element of ``bad``: one predicated store per
    element (idempotent), no reduction.  Reducing ``bad`` first (``tl.max``) put a cross-warp
    barrier in every tile, measurably slower (``docs/kernels_performance.md`` section 1)."""
    tl.store(flag_ptr + slot + tl.zeros(bad.shape, tl.int32), tl.full(bad.shape, 1, tl.int32), mask=bad)


@triton.jit
def _bad_amax(a):
    """NaN, infinite or negative amax (the values the reference rejects)."""
    return (a != a) | (tl.abs(a) > _FMAX) | (a < 0.0)


@triton.jit
def _poisoned(s, a, zero, nan_all, CHECK: tl.constexpr):
    """Checked launches: the scale ``s`` made NaN where the amax ``a`` is bad (per expert: a scalar,
    per channel: one per row), and the NaN pattern to write where the scaled input is NaN (``0``
    where the INT scales of a tiny amax write +0, ``zero``, unless the amax is bad).  Every element
    already tests its scaled input for NaN (NaN input gives the NaN pattern), so a bad amax costs
    valid input no instruction per element (a select per element there was measurably slower where
    INT and FP8 run at their arithmetic ceiling: ``docs/kernels_performance.md`` section 9)."""
    if CHECK:
        bad = _bad_amax(a)
        s = tl.where(bad, float("nan"), s)
        nanb = tl.where(zero & (bad == 0), tl.zeros_like(nan_all), nan_all)
    else:
        nanb = tl.where(zero, tl.zeros_like(nan_all), nan_all)
    return s, nanb


@triton.jit
def _check_amax(amax_ptr, amax_se, amax_sr, flag_ptr, e, rows, PER_CHANNEL: tl.constexpr):
    """Flag every bad amax entry of expert ``e`` (its ``rows`` entries per channel, else one)."""
    if PER_CHANNEL:
        r0 = rows * 0  # a while loop: Triton 3.6's interpreter cannot iterate range() up to a loaded value
        while r0 < rows:
            r = r0 + tl.arange(0, 1024)
            a = tl.load(amax_ptr + e * amax_se + r * amax_sr, mask=r < rows, other=1.0)
            _flag_each(flag_ptr, 0, a != a)
            _flag_each(flag_ptr, 1, tl.abs(a) == float("inf"))
            _flag_each(flag_ptr, 2, a < 0.0)
            r0 += 1024
    else:
        a = tl.load(amax_ptr + e * amax_se)
        tl.store(flag_ptr + 0, 1, mask=a != a)
        tl.store(flag_ptr + 1, 1, mask=tl.abs(a) == float("inf"))
        tl.store(flag_ptr + 2, 1, mask=a < 0.0)


@triton.jit
def _int_scales(a, QMAX: tl.constexpr, INT_DIV: tl.constexpr):
    """INT "cuda" scales: ``s = RN(qmax/amax)``, ``s2 = 256 s``, ``r2 = RN(1/s2)``; ``zero`` where
    amax < 2**-24.  There the scales are those of amax = 1 (finite, normal) and the caller selects
    +0 explicitly: no arithmetic identity (``r2 = 0``, ``0 * x``) carries the zero, because the
    fp64 dequantization path (interpreters whose ``tl.fma`` rounds twice) never reads ``r2``."""
    zero = a < _TINY
    a1 = tl.where(zero, 1.0, a)
    s = div_rn_normal(tl.zeros_like(a1) + QMAX, a1, INT_DIV)  # a1 in [2**-24, FP32_MAX]: s normal
    s2 = s * 256.0
    r2 = div_rn_normal(tl.zeros_like(s2) + 1.0, s2, INT_DIV)
    return s, s2, r2, zero


@triton.jit
def _int_magnitude(xs, s2, r2, LO: tl.constexpr, QMAX: tl.constexpr, EXACT_FMA: tl.constexpr):
    """``|RN(q/s)|`` with ``q = clamp(rint(xs), lo, qmax)`` from ``xs = RN(x*s)``.

    ``q/s`` is evaluated as ``RN(|q| / (256 s)) * 256``: the quotient by ``s2 = 256 s`` is exact in
    the same way (power-of-two scaling) but keeps ``|q| * RN(1/s2)`` finite for every finite amax;
    multiplying by 256 overflows exactly when ``RN(q/s)`` does.
    """
    w = tl.minimum(tl.maximum(xs, LO, propagate_nan=tl.PropagateNan.ALL), QMAX, propagate_nan=tl.PropagateNan.ALL)  # NaN stays NaN
    return int_dequant_magnitude(rne_integer_magnitude(w), s2, r2, EXACT_FMA) * 256.0


@triton.jit
def _fp8_scales(a, INT_DIV: tl.constexpr):
    """FP8 "cuda": ``a = 1`` if amax <= 2**-24; ``s = RN(448/a)``; ``inv = RN(1/s)``."""
    a1 = tl.where(a <= _TINY, 1.0, a)
    s = div_rn_normal(tl.zeros_like(a1) + _E4M3_MAX, a1, INT_DIV)  # a1 in (2**-24, FP32_MAX]
    return s, div_rn_normal(tl.zeros_like(s) + 1.0, s, INT_DIV)


@triton.jit
def _fp8_magnitude(xs, inv, HW_E4M3: tl.constexpr):
    """``|RN(e4m3(RN(x*s)) * inv)|`` (e4m3 saturating at 448) from ``xs = |x| * s``."""
    return round_sat_e4m3(xs, HW_E4M3) * inv


@triton.jit
def _nvfp4_scales(g, INT_DIV: tl.constexpr):
    """NVFP4 "te" steps 1-3: ``ge = min(RN(2688/g), FP32_MAX)`` (1 if 0), ``gd = RN(1/ge)``,
    ``mult = RN(ge * RN(1/6))``; the amax ``g`` (as step 9 takes it) comes back as well.  ``g = -0.0``
    is taken as ``+0.0`` (the reference drops the sign of a zero amax, ``reference/granularity.py``);
    ``2688 / -0.0 = -inf`` would otherwise make every output NaN."""
    g = tl.where(g == 0.0, 0.0, g)
    ge = div_rn_normal(tl.zeros_like(g) + _GSCALE, g, INT_DIV)  # g = 0 or subnormal: +inf either way
    ge = tl.where(ge > _FMAX, _FMAX, ge)
    ge = tl.where(ge == 0.0, 1.0, ge)
    if INT_DIV:
        gd = div_rn_pos(tl.zeros_like(ge) + 1.0, ge)
    elif ge > _TWO126:  # subnormal quotient: integer division (a branch: the common path skips it)
        gd = div_rn_pos(tl.zeros_like(ge) + 1.0, ge)
    else:  # ge in [1, 2**126] (or NaN): normal quotient
        gd = tl.math.div_rn(tl.zeros_like(ge) + 1.0, ge)
    return g, gd, ge * _SIXTH


@triton.jit
def _recip(d, BLOCK_RECIP_INT: tl.constexpr):
    """``RN(1/d)`` for ``d >= 0``: integer division, or ``tl.math.div_rn`` on ``d`` normalised
    exactly from its bits when subnormal (``1/d = RN(1/(d*2**24)) * 2**24``) so that a flush-to-zero
    division never sees a subnormal operand."""
    if BLOCK_RECIP_INT:
        return div_rn_pos(tl.zeros_like(d) + 1.0, d)
    else:
        db = d.to(tl.int32, bitcast=True)
        tiny = db < 0x00800000
        dn = tl.where(tiny, db.to(tl.float32) * 2.350988701644575e-38, d)  # bits * 2**-125
        inv = tl.math.div_rn(tl.zeros_like(dn) + 1.0, dn)
        return tl.where(tiny, inv * 16777216.0, inv)  # * 2**24


@triton.jit
def _nvfp4_magnitude(ax, vmax, g, gd, mult, BLOCK_RECIP_INT: tl.constexpr, HW_E4M3: tl.constexpr):
    """NVFP4 "te" steps 5-10 on a ``[BR, NB, 16]`` tile (zero-padded short blocks), as magnitudes,
    given the block max ``vmax`` ``[BR, NB, 1]`` and the global amax ``g``: ds8 = e4m3(RN(vmax*mult));
    es = min(RN(1/RN(ds8*gd)), FP32_MAX); v = RN(|x|*es); q = e2m1(min(v, 6));
    y = RN(q * RN(RN(ds8*g) * RN(1/2688))) (TE's C++ dequantize).  Returns ``(y, v == 0)``: where the
    scaled value is zero the output is ``+0`` whatever the input's sign."""
    ds8 = round_sat_e4m3(vmax * mult, HW_E4M3)  # a NaN block: NaN (hardware) or 448; the caller writes NaN
    es = tl.minimum(_recip(ds8 * gd, BLOCK_RECIP_INT), _FMAX)
    v = ax * es
    q = round_mag_e2m1(tl.minimum(v, 6.0))
    return q * ((ds8 * g) * _INV_GSCALE), v == 0.0


@triton.jit
def _int4g_magnitude(x, A, bad, LO: tl.constexpr, QMAX: tl.constexpr, EXACT_FMA: tl.constexpr, INT_DIV: tl.constexpr):
    """INT4 group-wise "cuda" on a ``[BR, NB, 128]`` tile ``x`` given the block amax ``A`` ``[BR, NB, 1]``:
    ``s = RN(7/A)``, ``q = clamp(rint(RN(x*s)), -8, 7)``, ``|RN(q/s)|``; ``zero`` (the whole block
    writes +0) where ``A < 2**-24``.  Neither special block needs a select per element: a zero
    block takes the scales of amax 1 (``_int_scales``), under which its elements (``|x| < 2**-24``,
    ``|7 x| < 0.5``) all give ``q = 0`` and magnitude ``+0`` (the caller drops their sign); a block
    holding NaN or inf (``bad``) is multiplied by NaN, so its magnitude is NaN exactly there (the
    clamp propagates NaN)."""
    s, s2, r2, zero = _int_scales(A, QMAX, INT_DIV)
    s = tl.where(bad, float("nan"), s)
    return _int_magnitude(x * s, s2, r2, LO, QMAX, EXACT_FMA), zero


@triton.jit
def _fp8b_scales(A, FP32_SCALE: tl.constexpr, INT_DIV: tl.constexpr, EXACT_FMA: tl.constexpr, IO: tl.constexpr):
    """FP8 block-wise "te" steps 2-6 of block amax ``A``: ``(s, inv)``.

    ``s = RN(448/A)`` (``A = 0`` -> inf, inf -> 0, NaN -> NaN), the input dtype's largest value where
    inf (bf16 ``0x7F7F``, fp16 65504, fp32 ``FP32_MAX``; only ``0 < A < 448 / max`` reach it).  pow2 (default):
    ``s`` is cut to the power of two at or below it (its exponent bits; ``s`` is normal or 0 here),
    NaN -> ``2**-1``, ``A = 0`` -> 1, and ``inv = 2**-k`` is written from the bits (exact, ``2**-127``
    subnormal for ``s = 2**127``, inf for ``s = 0``).  ``FP32_SCALE``: ``s`` unchanged (1 where
    ``A = 0``), ``inv = RN(1/s)``: the back end's IEEE division where ``s <= 2**126`` (``s`` and the
    quotient normal, so a flush-to-zero division agrees), ``tl_rounding.recip_subnormal`` for a
    larger ``s`` (its quotient subnormal), the integer division (``div_rn_pos``) with ``INT_DIV``."""
    s = div_rn_normal(tl.zeros_like(A) + _E4M3_MAX, A, INT_DIV)  # A >= 2**-126 or the quotient overflows
    s = tl.where(s > _FMAX, _BF16_MAX if IO == _IO_BF16 else (_FP16_MAX if IO == _IO_FP16 else _FMAX), s)
    if FP32_SCALE:
        s = tl.where(A == 0.0, 1.0, s)
        if INT_DIV:
            inv = div_rn_pos(tl.zeros_like(s) + 1.0, s)
        else:  # s in [448/FP32_MAX, 2**126]: operand and quotient normal; above (0 < amax < 448 * 2**-126) subnormal
            # recip_subnormal's own division overflows for a normal-quotient s and would take the back
            # end's slow path in every block: it gets 2**126 there (its result unused)
            sub = recip_subnormal(tl.maximum(s, _TWO126), EXACT_FMA)
            inv = tl.where(s > _TWO126, sub, tl.math.div_rn(tl.zeros_like(s) + 1.0, s))
    else:
        sb = s.to(tl.int32, bitcast=True) & 0x7F800000
        sb = tl.where(s != s, 0x3F000000, sb)
        sb = tl.where(A == 0.0, 0x3F800000, sb)
        s = sb.to(tl.float32, bitcast=True)
        e = sb >> 23
        ib = tl.where(e == 254, 0x00400000, (254 - e) << 23)
        inv = tl.where(e == 0, 0x7F800000, ib).to(tl.float32, bitcast=True)
    return s, inv


@triton.jit
def _mx_scales(A, EMAX: tl.constexpr):
    """MX "floor" steps 2-3 and the decode of step 6, from the block amax ``A``: E8M0 code
    ``c = max(E - emax, 0)`` with ``E`` the biased exponent field of ``A`` (so 0 for zero and
    subnormal ``A``), 255 for non-finite ``A``; ``(inv, dec) = (2**(127-c), 2**(c-127))`` from bits
    (``c <= 254 - emax``: ``inv`` normal; ``dec = 2**-127``, subnormal, for ``c = 0``); code 255 gives
    ``inv = NaN`` (the block is all NaN)."""
    e = (A.to(tl.int32, bitcast=True) >> 23) & 0xFF
    c = tl.maximum(e - EMAX, 0)
    inv = tl.where(e == 255, 0x7FC00000, (254 - c) << 23).to(tl.float32, bitcast=True)
    dec = tl.where(c == 0, 0x00400000, c << 23).to(tl.float32, bitcast=True)
    return inv, dec


@triton.jit
def _square_max(m, ROWS_INNER: tl.constexpr, K: tl.constexpr, TIES_LOW: tl.constexpr):
    """Max over each square block of ``m`` (``tiles.tile_4d``'s axes, keep_dims): with ``ROWS_INNER``
    a thread's ``K`` row groups first (axis 0, or 2 with ``TIES_LOW``), then its other rows' and
    its columns' lanes; else the columns, then the rows (axis 1, or 2 with ``TIES_LOW``)."""
    if ROWS_INNER:
        if K > 1:
            m = tl.max(m, axis=2 if TIES_LOW else 0, keep_dims=True)
        return tl.max(tl.max(m, axis=3, keep_dims=True), axis=0 if TIES_LOW else 2, keep_dims=True)
    else:
        return tl.max(tl.max(m, axis=3, keep_dims=True), axis=2 if TIES_LOW else 1, keep_dims=True)


@triton.jit
def _from_data_tile(bits, x, mag, bmax, flag_ptr, sign_all, nan_all, FMT: tl.constexpr, LO: tl.constexpr, QMAX: tl.constexpr,
                    IO: tl.constexpr, CHECK: tl.constexpr, EXACT_FMA: tl.constexpr, HW_BF16: tl.constexpr, HW_E4M3: tl.constexpr,
                    INT_DIV: tl.constexpr, WORDS: tl.constexpr = False):
    """Output bits of a tile of input ``bits`` (``[BR, NB, block]``, or ``[1, NB, R, block]`` / ``[1, R, NB, block]`` for
    square blocks; partial blocks zero-padded) for a format whose scales come from the data, given the
    input as fp32 ``x``, its ``magnitude_bits`` ``mag`` and their block max ``bmax`` (keep_dims;
    exact, a NaN orders above inf): the format's scales per block from
    the block amax ``A`` and its element rounding on magnitudes, the input's sign OR-ed back (INT4
    zero blocks: +0)."""
    A = bmax.to(tl.float32, bitcast=True)
    ax = mag.to(tl.float32, bitcast=True)  # |x|
    if FMT == _FMT_INT4G:
        bad = bmax >= INF_BITS  # NaN or inf in the block: no INT scale (the reference raises)
        if CHECK:
            _flag_each(flag_ptr, 4, bad)
        y, zero = _int4g_magnitude(x, A, bad, LO, QMAX, EXACT_FMA, INT_DIV)
        smask = tl.where(zero, tl.zeros_like(sign_all), sign_all)
        return out_bits(y, x, bits, smask, bad, nan_all, IO, HW_BF16, True, WORDS)
    elif FMT == _FMT_MXFP8:
        inv, dec = _mx_scales(A, 8)
        v = ax * inv
        return out_bits(round_sat_e4m3(v, HW_E4M3) * dec, x, bits, sign_all, v != v, nan_all, IO, HW_BF16, HW_E4M3, WORDS)
    elif FMT == _FMT_MXFP4:
        inv, dec = _mx_scales(A, 2)
        v = ax * inv
        y = round_mag_e2m1(tl.minimum(v, _E2M1_MAX, propagate_nan=tl.PropagateNan.ALL)) * dec  # NaN exactly where v is
        return out_bits(y, x, bits, sign_all, v != v, nan_all, IO, HW_BF16, True, WORDS)
    else:
        s, inv = _fp8b_scales(A, FMT == _FMT_FP8B_FP32S, INT_DIV, EXACT_FMA, IO)
        v = ax * s
        y = round_sat_e4m3(v, HW_E4M3) * inv  # 0 * inf (a block holding inf) is NaN
        return out_bits(y, x, bits, sign_all, (v != v) | (y != y), nan_all, IO, HW_BF16, HW_E4M3, WORDS)


@triton.jit
def _nvfp4_tile(bits, x, mag, bmax, g, gd, mult, bad, sign_all, nan_all, IO: tl.constexpr, CHECK: tl.constexpr,
                HW_BF16: tl.constexpr, HW_E4M3: tl.constexpr, BLOCK_RECIP_INT: tl.constexpr, WORDS: tl.constexpr = False):
    """NVFP4 output bits of a tile of input ``bits`` (fp32 ``x``, ``magnitude_bits`` ``mag``) given
    ``bmax``, its block max of ``mag`` (keep_dims; step 4, exact): a block holding a NaN is all NaN
    (as the reference's; with ``CHECK`` so is every block of an expert whose amax is ``bad``), and the
    sign is dropped where the scaled value is zero."""
    block_nan = bmax > INF_BITS
    y, vzero = _nvfp4_magnitude(mag.to(tl.float32, bitcast=True), bmax.to(tl.float32, bitcast=True), g, gd, mult, BLOCK_RECIP_INT, HW_E4M3)
    if CHECK:
        block_nan = tl.where(bad, True, block_nan)  # per block
    smask = tl.where(vzero, tl.zeros_like(sign_all), sign_all)
    # NaN also where step 9's scale overflows (ds8 * g = inf: 0 * inf); the hardware path's y carries every NaN
    return out_bits(y, x, bits, smask, block_nan | (y != y), nan_all, IO, HW_BF16, HW_E4M3, WORDS)


@triton.jit
def _two_pass_block(xb, yb, t, n_tc, rows, cols, flag_ptr, sign_all, nan_all, FMT: tl.constexpr, LO: tl.constexpr, QMAX: tl.constexpr,
                    IO: tl.constexpr, CHECK: tl.constexpr, EXACT_FMA: tl.constexpr, HW_BF16: tl.constexpr, HW_E4M3: tl.constexpr,
                    INT_DIV: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr, CHUNK_R: tl.constexpr):
    """Tile ``t``: one ``BR x BC`` square block of bf16, read as int32 words of two elements (cols
    even), of a format whose scales come from the data, in two passes over its ``CHUNK_R``-row
    chunks: the block max of every chunk's words, then each chunk loaded again (from the caches)
    and rounded with the block's scale.  Only one chunk is live at a time, so a 128x128 block
    needs few registers a thread and several programs fit an SM; the first read asks the caches to
    keep the lines (``evict_last``) for the second.  Partial blocks are masked (their padding reads
    as zero)."""
    tr = t // n_tc
    r0 = tr * BR
    c0 = (t - tr * n_tc) * (BC // 2)
    cw = cols // 2
    rl = tl.arange(0, CHUNK_R)[:, None]
    cl = tl.arange(0, BC // 2)[None, :]
    base = r0.to(tl.int64) * cw + c0
    xw = xb.to(tl.pointer_type(tl.int32)) + base
    yw = yb.to(tl.pointer_type(tl.int32)) + base
    cmask = (c0 + cl) < cw
    acc = tl.zeros([CHUNK_R, BC // 2], tl.int32)
    for c in tl.range(0, BR // CHUNK_R):
        r = c * CHUNK_R + rl
        w = tl.load(xw + r * cw + cl, mask=cmask & ((r0 + r) < rows), other=0, eviction_policy="evict_last")
        acc = tl.maximum(acc, pair_magnitude_bits(w))
    bmax = tl.max(tl.max(acc, axis=1, keep_dims=True), axis=0, keep_dims=True)
    bmax = tl.expand_dims(bmax, 2)
    for c in tl.range(0, BR // CHUNK_R):
        r = c * CHUNK_R + rl
        mask = cmask & ((r0 + r) < rows)
        w = tl.load(xw + r * cw + cl, mask=mask, other=0, eviction_policy="evict_first")
        x = bf16_pairs(w)
        mag = magnitude_bits(x)
        bits = bf16_bits(x)
        out = _from_data_tile(bits, x, mag, bmax, flag_ptr, sign_all, nan_all, FMT, LO, QMAX, IO, CHECK, EXACT_FMA, HW_BF16, HW_E4M3, INT_DIV,
                              True)
        tl.store(yw + r * cw + cl, out, mask=mask)


# n_experts is not specialised: Triton makes an int argument equal to 1 a constant, so a one-expert
# call would otherwise compile a kernel of its own (about a second per variant on a cold cache).
@triton.jit(do_not_specialize=["n_experts"])
def fake_quant_fwd_kernel(
    x_ptr,  # input bits: stacked [N, rows, cols]; list: base, expert e at x_ptr + meta[0, e]
    y_ptr,  # output bits: stacked [N, rows, cols]; list: one buffer, expert e at y_ptr + meta[1, e]
    meta_ptr,  # list: int64 [7, N] (see kernels/tiles.py)
    amax_ptr,  # fp32; element (e, r) at e*amax_se + r*amax_sr
    amax_se,
    amax_sr,
    flag_ptr,  # int32 [checks.SLOTS] (kernels/checks.py), written only when CHECK
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
    VEC: tl.constexpr,
    EXACT_FMA: tl.constexpr,
    HW_BF16: tl.constexpr,
    HW_E4M3: tl.constexpr,
    BLOCK_RECIP_INT: tl.constexpr,
    INT_DIV: tl.constexpr,
    FLAT: tl.constexpr,
    ALIGNED: tl.constexpr,
    SPLIT: tl.constexpr,
    BLOCK: tl.constexpr,
    TILE_R: tl.constexpr,
    BR: tl.constexpr,
    BC: tl.constexpr,
    TPP: tl.constexpr,
    PAIRS: tl.constexpr = False,
    TIES_LOW: tl.constexpr = False,
    ROWS_INNER: tl.constexpr = False,
    CHUNK_R: tl.constexpr = 0,
    STAGES: tl.constexpr = 0,
):
    """Fake-quantize tiles ``program_id(0)*TPP ..`` of expert ``program_id(1)``; see the module docstring."""
    p = tl.program_id(0)
    e = tl.program_id(1)
    rows, cols = expert_geometry(meta_ptr, n_experts, rows_u, cols_u, e, LIST, VEC, FLAT)
    n_tc, n_t = tile_count(rows, cols, BR, BC)
    if CHECK:
        if FMT < _FROM_DATA:
            if p == 0:
                _check_amax(amax_ptr, amax_se, amax_sr, flag_ptr, e, rows, PER_CHANNEL)
    if p * TPP < n_t:
        xb = expert_ptr(x_ptr, meta_ptr, 0, n_experts, e, rows, cols, LIST, VEC)
        yb = expert_ptr(y_ptr, meta_ptr, 1, n_experts, e, rows, cols, LIST, VEC)
        if IO == _IO_FP32:
            sign_all = tl.full([], -2147483648, tl.int32)
            nan_all = tl.full([], 0x7FFFFFFF, tl.int32)
        else:
            sign_all = tl.full([], -32768, tl.int16)
            nan_all = tl.full([], 0x7FFF, tl.int16)
        if FMT < _FROM_DATA:
            if not PER_CHANNEL:
                a = tl.load(amax_ptr + e * amax_se)
        if FMT == _FMT_NVFP4:
            g, gd, mult = _nvfp4_scales(a, INT_DIV)
            bad = _bad_amax(a)  # used only when CHECK
            if CHECK:  # every output of the expert NaN: both the scales of steps 2-8 and the amax of step 9
                gd = tl.where(bad, float("nan"), gd)
                g = tl.where(bad, float("nan"), g)
        elif FMT == _FMT_INT:
            if not PER_CHANNEL:
                s, s2, r2, zero = _int_scales(a, QMAX, INT_DIV)
                s, nanb = _poisoned(s, a, zero, nan_all, CHECK)
                zero_out = zero & (_bad_amax(a) == 0) if CHECK else zero  # a bad amax writes NaN instead
        elif FMT == _FMT_FP8:
            if not PER_CHANNEL:
                s, inv = _fp8_scales(a, INT_DIV)
                s, nanb = _poisoned(s, a, tl.zeros_like(a) != 0, nan_all, CHECK)
        for k in tl.range(0, TPP, num_stages=STAGES if STAGES > 0 else None):
            if STAGES == 0:
                t = p * TPP + k
                live = t < n_t
            else:  # the pipeliner needs a body without a branch on t: a program short of tiles redoes its last (the same bits again)
                t = tl.minimum(p * TPP + k, n_t - 1)
                live = tl.constexpr(True)
            if live:
                if CHUNK_R > 0:  # one square block a tile, in two passes over its row chunks
                    _two_pass_block(xb, yb, t, n_tc, rows, cols, flag_ptr, sign_all, nan_all, FMT, LO, QMAX, IO, CHECK, EXACT_FMA, HW_BF16,
                                    HW_E4M3, INT_DIV, BR, BC, CHUNK_R)
                elif TILE_R > 1:  # square TILE_R x BLOCK blocks (tile_2d): the block max over two axes
                    tile0, offs, mask = tile_4d(t, n_tc, rows, cols, BR, BC, TILE_R, BLOCK, ROWS_INNER, SPLIT, TIES_LOW)
                    if ALIGNED:  # whole tiles (launch.row_aligned)
                        mask = None
                    if PAIRS:  # the same tile in words (cols and the tile's columns are even); only the words live across the max
                        if ROWS_INNER:
                            tile0w, offsw, maskw = tile_4d(t, n_tc, rows, cols // 2, BR, BC // 2, TILE_R, BLOCK // 2, ROWS_INNER, SPLIT, TIES_LOW)
                        else:  # rows of words, split into blocks after the load (tile_rows)
                            tile0w, offsw, maskw = tile_rows(t, n_tc, rows, cols // 2, BR, BC // 2)
                        if ALIGNED:
                            maskw = None
                            w = tl.load(xb.to(tl.pointer_type(tl.int32)) + tile0w + offsw, eviction_policy="evict_first")
                        else:
                            w = tl.load(xb.to(tl.pointer_type(tl.int32)) + tile0w + offsw, mask=maskw, other=0, eviction_policy="evict_first")
                        if ROWS_INNER:
                            bmax = tl.expand_dims(_square_max(pair_magnitude_bits(w), ROWS_INNER, SPLIT, TIES_LOW), 4)
                        else:
                            w = tl.reshape(w, [BR // TILE_R, TILE_R, BC // BLOCK, BLOCK // 2])
                            bmax = tl.expand_dims(_square_max(pair_magnitude_bits(w), False, 1, False), 4)
                        x = bf16_pairs(w)
                        mag = magnitude_bits(x)
                        bits = bf16_bits(x)
                    else:
                        if ALIGNED:
                            bits = tl.load(xb + tile0 + offs, eviction_policy="evict_first")
                        else:
                            bits = tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
                        bmax = io_magnitude_to_f32_bits(_square_max(io_magnitude_bits(bits, IO), ROWS_INNER, SPLIT, TIES_LOW), IO)
                        x = bits_to_f32(bits, IO)
                        mag = magnitude_bits(x)
                    if FMT == _FMT_NVFP4:
                        out = _nvfp4_tile(bits, x, mag, bmax, g, gd, mult, bad, sign_all, nan_all, IO, CHECK, HW_BF16, HW_E4M3, BLOCK_RECIP_INT,
                                          PAIRS)
                    else:
                        out = _from_data_tile(bits, x, mag, bmax, flag_ptr, sign_all, nan_all, FMT, LO, QMAX, IO, CHECK, EXACT_FMA, HW_BF16,
                                              HW_E4M3, INT_DIV, PAIRS)
                    if PAIRS:  # stored as the words it was loaded as
                        if not ROWS_INNER:
                            out = tl.reshape(out, [BR, BC // 2])
                        tl.store(yb.to(tl.pointer_type(tl.int32)) + tile0w + offsw, out, mask=maskw)
                    else:
                        tl.store(yb + tile0 + offs, out, mask=mask)
                elif FMT >= _FROM_DATA or FMT == _FMT_NVFP4:  # blocks of BLOCK along the row
                    if ALIGNED:
                        tile0, offs = tile_aligned(t, BC, BLOCK, SPLIT, TIES_LOW)
                        mask = None
                        if PAIRS:
                            tile0w, offsw = tile_aligned(t, BC // 2, BLOCK // 2, SPLIT, TIES_LOW)
                            w = tl.load(xb.to(tl.pointer_type(tl.int32)) + tile0w + offsw, eviction_policy="evict_first")
                            x = bf16_pairs(w)
                            mag = magnitude_bits(x)
                            bits = bf16_bits(x)
                            bmax = tl.max(mag, axis=3, keep_dims=True)
                        else:
                            bits = tl.load(xb + tile0 + offs, eviction_policy="evict_first")
                    else:
                        tile0, offs, mask = tile_3d(t, n_tc, rows, cols, BR, BC, BLOCK)
                        bits = tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
                    if not (ALIGNED and PAIRS):
                        x = bits_to_f32(bits, IO)
                        mag = magnitude_bits(x)
                        bmax = mag
                    if ALIGNED and SPLIT > 1:  # the thread's parts first (tiles.tile_aligned's axis 0, or 1), then the lanes
                        bmax = tl.max(bmax, axis=1 if TIES_LOW else 0, keep_dims=True)
                    bmax = tl.max(bmax, axis=2, keep_dims=True)
                    if FMT == _FMT_NVFP4:
                        out = _nvfp4_tile(bits, x, mag, bmax, g, gd, mult, bad, sign_all, nan_all, IO, CHECK, HW_BF16, HW_E4M3, BLOCK_RECIP_INT)
                    else:
                        out = _from_data_tile(bits, x, mag, bmax, flag_ptr, sign_all, nan_all, FMT, LO, QMAX, IO, CHECK, EXACT_FMA, HW_BF16,
                                              HW_E4M3, INT_DIV)
                    if ALIGNED and PAIRS:
                        out = tl.reshape(out, offs.shape)
                else:
                    if ALIGNED:  # per expert only (per channel needs the row of each element)
                        tile0, offs = tile_aligned(t, BC, 0)
                        mask = None
                        bits = tl.load(xb + tile0 + offs, eviction_policy="evict_first")
                    else:
                        tile0, offs, r, rmask, mask = tile_2d(t, n_tc, rows, cols, BR, BC)
                        bits = tl.load(xb + tile0 + offs, mask=mask, other=0, eviction_policy="evict_first")
                    x = bits_to_f32(bits, IO)
                    if FMT == _FMT_INT:
                        if PER_CHANNEL:
                            a = tl.load(amax_ptr + e * amax_se + r * amax_sr, mask=rmask, other=1.0)
                            s, s2, r2, zero = _int_scales(a, QMAX, INT_DIV)
                            s, nanb = _poisoned(s, a, zero, nan_all, CHECK)
                        xs = x * s  # NaN exactly where x is NaN (s > 0 finite), everywhere for a poisoned s
                        if not PER_CHANNEL:  # per-expert branches, taken alike by every element of the tile
                            if zero_out:  # the expert writes +0
                                out = tl.zeros(bits.shape, bits.dtype)
                            else:
                                out = out_bits(_int_magnitude(xs, s2, r2, LO, QMAX, EXACT_FMA), x, bits, sign_all, xs != xs, nan_all, IO, HW_BF16, True)
                        else:
                            y = tl.where(zero, 0.0, _int_magnitude(xs, s2, r2, LO, QMAX, EXACT_FMA))
                            smask = tl.where(zero, tl.zeros_like(sign_all), sign_all)
                            out = f32_to_bits(y, bits & smask, xs != xs, nanb, IO, HW_BF16)
                        if CHECK:
                            if UNSIGNED:
                                neg = x < 0.0
                                if not ALIGNED:
                                    neg = neg & mask
                                _flag_each(flag_ptr, 3, neg)
                                out = tl.where(x < 0.0, nan_all, out)
                    else:
                        if PER_CHANNEL:
                            a = tl.load(amax_ptr + e * amax_se + r * amax_sr, mask=rmask, other=1.0)
                            s, inv = _fp8_scales(a, INT_DIV)
                            s, nanb = _poisoned(s, a, tl.zeros_like(a) != 0, nan_all, CHECK)
                        xs = tl.abs(x) * s
                        out = out_bits(_fp8_magnitude(xs, inv, HW_E4M3), x, bits, sign_all, xs != xs, nanb, IO, HW_BF16, HW_E4M3)
                if TILE_R == 1:
                    tl.store(yb + tile0 + offs, out, mask=mask)
