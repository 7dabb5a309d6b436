"""NVFP4 two-level fake quantization: FP4 E2M1 elements, E4M3 block scales, fp32 global scale.

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``.  NaN input: ``te`` and ``torchao``
  take it as their upstreams do (below); ``modelopt_static`` raises ``ValueError``.
* ``amax``: the *global* amax, per tensor or per expert (``[N]`` for ``[N, out, in]``), fp32,
  finite, >= 0.  Per-channel global amax is not a format NVFP4 has: ``ValueError`` (the
  registry's ``amax_granularities``, checked by ``reference.api``).
* Blocks: ``block_size`` (default 16) consecutive elements along the last dim.  When the last
  dim is not a multiple of the block size, the last block of each row is *shorter*: it is
  quantized as if zero-padded to a full block (Transformer Engine pads with zeros), and the
  padding is dropped.  Zeros never raise a block max, so this equals a short block.
* ``tile_2d=True`` (variant ``te``): the block is a ``block_size x block_size`` tile of the last
  two dims (16x16: Transformer Engine ``NVFP4BlockScaling``'s weight recipe, 2D block scales, no
  random Hadamard transform); ``vmax`` (step 4) is the tile's max, partial tiles are zero-padded in
  both dims.  Every other step is unchanged.
* E2M1 rounding (``round_to_e2m1``): nearest, ties to even on {0,.5,1,1.5,2,3,4,6}, ±6 saturation.
* E4M3 block-scale rounding (``round_to_e4m3``): nearest, ties to even, saturating at 448.
* Output dtype = input dtype (RNE from fp32).

Default variant ``te``: Transformer Engine's NVFP4 as its user gets it, quantized by the pure-torch
reference ``custom_recipes/reference_nvfp4.py`` (``NVFP4QuantizerRef._quantize_blockwise_reference``,
1x16 tiles, no RHT; the spec TE's kernels are tested against bit for bit) with the global amax ``g``
given, and dequantized by TE's only NVFP4 dequantize, the C++ kernel
``common/cast/nvfp4/dequantize_nvfp4.cuh`` (``final_scale = scale * amax * factor_inv``, ``factor_inv
= 1 / (6 * 448)``; the host reference of ``tests/cpp/operator/test_dequantize_nvfp4.cu``)::

    1. ge   = RN(2688 / g);  ge = min(ge, FP32_MAX);  ge = 1 where ge == 0
    2. gd   = RN(1 / ge)
    3. mult = RN(ge * RN(1 / 6))            TE folds 1/6 into the multiplier "to match the kernel"
    4. vmax = max |x| over the block        exact, NaN-propagating (``torch.amax``)
    5. ds8  = e4m3(RN(vmax * mult))         saturating (inf -> 448); NaN stays NaN
    6. es   = min(RN(1 / RN(ds8 * gd)), FP32_MAX)     (ds8 == 0 -> FP32_MAX)
    7. v    = RN(x * es)
    8. q    = e2m1(v)                       ``cast_to_fp4x2``: ``v = -0.0`` and NaN coded ``+0``
                                            (``round_to_e2m1_te``); ``v`` in (-0.25, 0) is ``-0``
    9. fs   = RN(RN(ds8 * g) * RN(1 / 2688))        RN(1/2688) = 3.7202382e-04 (0x39C30C31)
    10. y   = RN(q * fs);  out = RNE_dtype(y)

A block holding NaN has ``ds8 = NaN``, so ``fs = NaN`` and the whole block is NaN.  ``g = 0`` gives
``fs = 0``: every output is a zero of its code's sign.  The order ``RN(RN(q * ds8) * gd)`` (a GEMM
applying the block scale, then the global decode scale) rounds differently: on the ``te_dequant``
case of ``harness.sections.external.match_cases`` (327,712 calibrated bf16 elements) it differs from
steps 9-10 on 1,062 bf16 outputs (exact results that are bf16 ties: steps 9-10 reach them exactly
and round to even, the other order lands an fp32 ulp off; e.g. global amax 18.375, block ``[2.625,
9.875, 0...]``: exact 2.4609375 and 9.84375, TE 2.46875 and 9.875, the other order 2.453125 and
9.8125) and on 96,083 fp32 outputs.

Variant ``modelopt_static`` (Model-Optimizer 0.47.0 ``static_blockwise_fp4_fake_quant`` on CUDA with
``quantize_block_scales=True``, read from ``tensor_quant.py`` (``StaticBlockwiseFP4FakeQuantFunction``),
``kernels/quantization/gemm/fp4_kernel.py`` (``compute_fp4_scales``, the Triton kernel),
``kernels/quantization/common/nvfp4_quant.py`` (``nvfp4_scalar_quant``) and
``gemm/tensor_quant_gpu_fp8.cu`` (``fake_e4m3fy``)).  The per-block ``_amax`` defaults to the block
max of ``x``, as max calibration sets it, or is passed as ``block_amax`` of shape
``x.shape[:-1] + (n_blocks,)`` (a stale one is allowed)::

    1. bs   = RN(bamax * RN(1/6))           torch CUDA evaluates ``amax / 6.0`` this way
    2. ga6  = RN(g * RN(1/6))               ``global_amax * (448/448) / 6.0``
    3. a    = 1 where ga6 <= 2**-24 else ga6      the FP8 CUDA extension's tiny-amax rule
    4. s    = RN(448 / a)                   FP8 ``cuda`` core (``reference.fp8_e4m3.cuda_core``)
    5. inv  = RN(1 / s)
    6. sc   = RN(e4m3(RN(bs * s)) * inv)    e4m3 saturating (``__nv_fp8_e4m3`` satfinite)
    7. zero = (sc == 0);  safe = 1 where zero or sc not finite, else sc
    8. a    = RN(|x| / safe)                IEEE division (see below)
    9. q    = e2m1(a)                       ties to even (``fp4_round_magnitude``'s <=/< table)
    10. m   = RN(q * safe);  y = m where x >= 0 else RN(0 - m)
    11. y   = +0.0 for every element of a block with zero   (whole block, after the sign)
    12. out = RNE_dtype(y)

Every zero output is ``+0.0``: ``-0.0`` input takes the ``x >= 0`` branch, and a negative ``x``
whose magnitude rounds to 0 gets ``0 - (+0) = +0`` because Triton 3.6 compiles the kernel's unary
minus ``-x_rescaled`` as ``0 - x`` (measured: Model-Optimizer 0.47.0 with Triton 3.6.0 on an H100
writes ``+0`` there, 1,525 elements of the ``scale_pairs`` and ``e2m1_ties`` cases).  Triton
releases that lower float negation to ``fneg`` (triton-lang/triton PR 10270) give ``-0.0`` there
instead: a sign-of-zero difference only.

Step 8 on the GPU: Triton compiles the kernel's fp32 ``|x| / scale`` to ``div.full.f32``, an
approximate division (not correctly rounded), so a quotient that is exactly an E2M1 tie in IEEE
arithmetic (``.25 .75 1.25 1.75 2.5 3.5 5``) may come out one ulp off and round the other way.
This reference keeps the IEEE quotient; ``nvfp4_tie_probe`` builds such an exact tie
(``g = 2688``, block amax 5.625 -> sc = 0.9375, ``x = 4.6875`` -> ``a = 5.0`` -> ``q = 4``).

Variant ``torchao`` (torchao 0.18.0 ``prototype/mx_formats/nvfp4_tensor.py``: ``NVFP4Tensor.to_nvfp4``
with ``per_tensor_scale = per_tensor_amax_to_scale(g)``, i.e. ``nvfp4_quantize``'s two-level branch,
then ``NVFP4Tensor.dequantize``; the order of its CPU torch code)::

    1. pts  = RN(g / 2688)                  per-tensor scale
    2. bs   = RN(vmax / 6)                  vmax = max |x| over the block
    3. s8   = e4m3(clamp(RN(bs / pts), 2**-6, 448))    the scale never falls below 2**-6 (the
                                            smallest normal E4M3): a zero block gets 2**-6, not 0
    4. v    = RN(x * RN(RN(1 / pts) / s8))
    5. q    = e2m1(v)                       ties to even, ±6 saturation, signed zeros kept; a NaN v
                                            gives a code from its bits (below)
    6. y    = RN(q * RN(pts * s8));  out = RNE_dtype(y)

``g = 0`` makes ``pts = 0`` and ``RN(1/pts) = inf``: a zero block gets ``s8 = NaN`` (``0/0``) and
NaN outputs; in any other block ``s8 = 448`` and every element gives ``±0`` (``q * RN(0 * 448)``; a
zero element has ``v = 0 * inf = NaN``, see step 5).  NaN outputs are the canonical NaN here;
torchao's CPU cast keeps torch's NaN bits (``variant_match`` counts NaN payloads apart).  The same
``v = NaN`` arises at a tiny ``g`` whose ``RN(1/pts)`` overflows (``g`` below ``2688 / FP32_MAX``,
about ``7.9e-36``) for every zero element.  Step 5 is torchao's E2M1 converter (``f32_to_f4_unpacked``),
which has no NaN: it works on the bits and turns a NaN ``v`` into a code (``round_to_e2m1_torchao``:
±1, ±1.5 or ±2 by the NaN's bits and sign; on x86 CPU ``0 * inf`` is the NaN ``0xFFC00000``, so
-1.5), which step 6 multiplies by ``RN(pts * s8)`` (0 or an fp32 subnormal): a finite output, as
torchao gives (before this rule: 510 of the 112,896 elements of ``variant_match``'s
``calibrated_tiny`` case differed, at ``g = 2**-133`` and ``2**-126``).  Only where ``s8`` or
``pts * s8`` is NaN (a zero block at ``g = 0``, a NaN input) is the output NaN.
torch's CUDA ``tensor / python-float`` multiplies by the reciprocal; steps 1-2 are true divisions as
on the CPU.
"""

from __future__ import annotations

import torch

from .constants import E2M1_MAX, E4M3_MAX, E4M3_MIN_NORMAL_EXP, FP32_MAX, NVFP4_BLOCK, NVFP4_GLOBAL_SCALE_NUM, TINY_AMAX
from .fp8_e4m3 import cuda_core
from .granularity import amax_to_fp32, broadcast_amax, from_tiles, to_tiles
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e2m1, round_to_e2m1_te, round_to_e4m3, to_output_dtype


E4M3_MIN_NORMAL = 2.0**E4M3_MIN_NORMAL_EXP
"""2**-6, the smallest normal E4M3 value: torchao's lower clamp of NVFP4 block scales (its ``E4M3_EPS``,
``torch.finfo(torch.float8_e4m3fn).tiny``)."""


def to_blocks(xf: torch.Tensor, block_size: int) -> torch.Tensor:
    """``[..., n]`` -> ``[..., ceil(n/b), b]`` with zero padding of the last block (layout only)."""
    if block_size < 1:
        raise ValueError(f"block_size must be >= 1, got {block_size}")
    n = xf.shape[-1]
    pad = (-n) % block_size
    if pad:
        xf = torch.nn.functional.pad(xf, (0, pad))
    return xf.reshape(*xf.shape[:-1], (n + pad) // block_size, block_size)


def from_blocks(yb: torch.Tensor, n: int) -> torch.Tensor:
    """Inverse of ``to_blocks``: drop the padding."""
    return yb.reshape(*yb.shape[:-2], yb.shape[-2] * yb.shape[-1])[..., :n]


def block_amax(x: torch.Tensor, block_size: int = NVFP4_BLOCK) -> torch.Tensor:
    """fp32 ``max |x|`` per block, shape ``x.shape[:-1] + (n_blocks,)`` (what max calibration stores)."""
    return to_blocks(x.to(torch.float32), block_size).abs().amax(dim=-1)


def _prepare(x: torch.Tensor, amax: torch.Tensor, block_size: int, *, nan_ok: bool = True):
    g = broadcast_amax(x, amax)
    xf = x.to(torch.float32)
    if not nan_ok and xf.numel() and bool(torch.isnan(xf).any()):
        raise ValueError("NVFP4 fake quant got NaN input: modelopt_static defines no block scale for a NaN block")
    return xf, g.unsqueeze(-1), to_blocks(xf, block_size)


def _te_quantize(x, amax, block_size: int, tile_2d: bool):
    """Steps 1-8 of the ``te`` variant: ``(q, v, ds8, gd, g, back)`` in fp32, blocked ``[..., nb, b]``
    (or tiles with ``tile_2d``; ``ds8`` one per block; ``g`` the global amax, broadcastable against
    them; ``back`` maps a blocked tensor back to ``x``'s layout)."""
    xf, g, xb = _prepare(x, amax, block_size)
    if tile_2d:
        xb = to_tiles(xf, (block_size, block_size))
    fmax = fp32_scalar_like(FP32_MAX, xf)
    ge = torch.minimum(fp32_scalar_like(NVFP4_GLOBAL_SCALE_NUM, xf) / g, fmax)
    ge = torch.where(ge == 0, torch.ones((), device=xf.device), ge)
    gd = fp32_scalar_like(1.0, xf) / ge
    mult = ge * torch.reciprocal(fp32_scalar_like(6.0, xf))
    vmax = xb.abs().amax(dim=-1, keepdim=True)
    ds8 = round_to_e4m3(vmax * mult)
    es = torch.minimum(fp32_scalar_like(1.0, xf) / (ds8 * gd), fmax)
    v = xb * es
    if tile_2d:
        back = lambda t: from_tiles(t, (block_size, block_size), tuple(x.shape))  # noqa: E731
    else:
        back = lambda t: from_blocks(t, x.shape[-1])  # noqa: E731
    return round_to_e2m1_te(v), v, ds8, gd, g, back


def te_dequant_scale(ds8: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Step 9 of ``te``: TE's C++ ``final_scale = RN(RN(ds8 * g) * RN(1/2688))`` per block."""
    return (ds8 * g) * torch.reciprocal(fp32_scalar_like(NVFP4_GLOBAL_SCALE_NUM, ds8))


def nvfp4_te(x, amax, *, block_size: int = NVFP4_BLOCK, tile_2d: bool = False) -> FakeQuantResult:
    """Default variant: Transformer Engine's reference quantize and its C++ dequantize (1 x block_size
    blocks, or square tiles with ``tile_2d``); see the module docstring."""
    q, v, ds8, _, g, back = _te_quantize(x, amax, block_size, tile_2d)
    y = q * te_dequant_scale(ds8, g)
    return FakeQuantResult(to_output_dtype(back(y), x.dtype), back(v), round_to_e2m1_te)


def nvfp4_torchao(x, amax, *, block_size: int = NVFP4_BLOCK) -> FakeQuantResult:
    """Variant ``torchao``: torchao's two-level ``nvfp4_quantize`` and ``NVFP4Tensor.dequantize``;
    see the module docstring."""
    xf, g, xb = _prepare(x, amax, block_size)
    pts = g / fp32_scalar_like(NVFP4_GLOBAL_SCALE_NUM, xf)
    bs = xb.abs().amax(dim=-1, keepdim=True) / fp32_scalar_like(E2M1_MAX, xf)
    s8 = round_to_e4m3(torch.clamp(bs / pts, min=E4M3_MIN_NORMAL, max=E4M3_MAX))
    v = xb * ((fp32_scalar_like(1.0, xf) / pts) / s8)
    y = round_to_e2m1_torchao(v) * (pts * s8)
    n = x.shape[-1]
    return FakeQuantResult(to_output_dtype(from_blocks(y, n), x.dtype), from_blocks(v, n), round_to_e2m1)


def round_to_e2m1_torchao(v: torch.Tensor) -> torch.Tensor:
    """torchao 0.18.0 ``f32_to_f4_unpacked`` (``prototype/custom_fp_utils.py``
    ``_f32_to_floatx_unpacked``) as fp32 values: ``round_to_e2m1`` for every non-NaN ``v``; a NaN ``v``
    takes the normal-range branch on its bits ``b`` (sign cleared): magnitude code
    ``((b - (126 << 23) + 0x1FFFFF + ((b >> 22) & 1)) >> 22) & 0xFF`` (2, 3 or 4 for any NaN: E2M1 1, 1.5
    or 2), sign from the NaN's sign bit.

    The NaN's bits are the device's: torchao's only NaN here is ``0 * inf`` (a global amax whose
    ``RN(1/pts)`` overflows), which an x86 CPU writes as its default NaN ``0xFFC00000`` (code 3:
    -1.5) and a CUDA GPU as ``0x7FFFFFFF`` (code 4: +2).  The reference takes the CPU's bits on every
    device, so its bits do not depend on where it runs; torchao on a GPU differs from this variant
    on exactly those elements."""
    nan_bits = torch.full_like(v.view(torch.int32), -4194304)  # 0xFFC00000, x86's default NaN
    mag = nan_bits & 0x7FFFFFFF
    code = ((mag - (126 << 23) + 0x1FFFFF + ((mag >> 22) & 1)) >> 22) & 0xFF
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], device=v.device)
    nan_val = table[code.clamp(0, 7)]
    nan_val = torch.where(nan_bits < 0, -nan_val, nan_val)
    return torch.where(torch.isnan(v), nan_val, round_to_e2m1(v))


def static_block_scales(bamax: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``modelopt_static`` steps 1-6: fp32 E4M3-rounded block scales ``sc`` of block amax ``bamax``
    (``[..., n_blocks]``) under a global amax ``g`` that broadcasts against ``bamax`` (``g[..., None]``)."""
    bamax = bamax.to(torch.float32)
    g = g.to(device=bamax.device, dtype=torch.float32)
    sixth = torch.reciprocal(fp32_scalar_like(6.0, bamax))
    bs = bamax * sixth
    ga6 = g * sixth
    a = torch.where(ga6 <= TINY_AMAX, torch.ones((), device=bamax.device), ga6)
    return cuda_core(bs, a)[0]


def nvfp4_modelopt_static(
    x, amax, *, block_size: int = NVFP4_BLOCK, block_amax: torch.Tensor | None = None
) -> FakeQuantResult:
    """Model-Optimizer static-block variant; see the module docstring."""
    xf, g, xb = _prepare(x, amax, block_size, nan_ok=False)
    nb = xb.shape[-2]
    if block_amax is None:
        bamax = xb.abs().amax(dim=-1)
    else:
        expected = tuple(x.shape[:-1]) + (nb,)
        if not isinstance(block_amax, torch.Tensor):
            raise TypeError(f"block_amax must be a torch.Tensor, got {type(block_amax).__name__}")
        if tuple(block_amax.shape) != expected:
            raise ValueError(f"block_amax shape {tuple(block_amax.shape)} != expected {expected}")
        try:  # the amax policy, checked in block_amax's own dtype: finite and >= 0, block amax included
            bamax = amax_to_fp32(block_amax.to(xf.device))
        except ValueError as exc:
            raise ValueError(f"block_amax: {exc}") from None
    sc = static_block_scales(bamax, g.squeeze(-1)).unsqueeze(-1)
    zero = sc == 0
    one = torch.ones((), device=xf.device)
    safe = torch.where(zero | ~torch.isfinite(sc), one, sc)
    a = xb.abs() / safe
    mag = round_to_e2m1(a) * safe
    pos = xb >= 0
    plus0 = torch.zeros((), device=xf.device)
    y = torch.where(zero, plus0, torch.where(pos, mag, plus0 - mag))
    v = torch.where(pos, a, -a)
    n = x.shape[-1]
    return FakeQuantResult(to_output_dtype(from_blocks(y, n), x.dtype), from_blocks(v, n), round_to_e2m1)


def nvfp4_tie_probe() -> dict[str, float]:
    """The exact E2M1 tie of the module docstring, as fp32 numbers: ``g = 2688``, block amax 5.625
    (sc = 0.9375), ``x = 4.6875``: IEEE ``|x| / sc = 5.0`` rounds to 4 (y = 3.75); a quotient one
    ulp above 5.0 rounds to 6 (y = 5.625)."""
    return {"global_amax": 2688.0, "block_amax": 5.625, "block_scale": 0.9375, "x": 4.6875,
            "ieee_quotient": 5.0, "y_ieee": 3.75, "y_quotient_above": 5.625}


VARIANTS = {"te": nvfp4_te, "modelopt_static": nvfp4_modelopt_static, "torchao": nvfp4_torchao}
DEFAULT_VARIANT = "te"
