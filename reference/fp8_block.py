"""FP8 E4M3 block-wise fake quantization: one scale per 1x128 block or 128x128 tile, from the data.

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``, upcast exactly to fp32; NaN and ±inf
  input allowed.
* No amax (``amax=None``, granularity ``from_data``): each tile's scale comes from the tile.
* Tiles: 128 consecutive elements along in-features (Transformer Engine ``Float8BlockScaling``'s
  1x128 for inputs and gradients, DeepSeek-V3's activations), or with ``tile_2d=True`` 128x128 tiles of
  the last two dims (the weight tiles of all three upstreams).  A partial tile is zero-padded (a short
  tile), as DeepGEMM pads (``deep_gemm/utils/math.py``) and DeepSeek-V3's masked loads read zeros
  (``inference/kernel.py``).
* E4M3 rounding: nearest, ties to even, saturating at ±448 (±inf -> ±448), NaN stays NaN, signed
  zeros kept (``round_to_e4m3``); output dtype = input dtype (RNE, canonical NaN).

Scales: every variant takes the option ``fp32_scale``: ``False`` (default) rounds each tile's scale
to a power of two (TE's ``pow_2_scales``, DeepSeek's ``scale_fmt="ue8m0"``, DeepGEMM's
``use_ue8m0=True``), ``True`` keeps the fp32 scale (TE ``pow_2_scales=False``, DeepSeek's default
``scale_fmt=None``, DeepGEMM ``use_ue8m0=False``).  ``tile_2d`` is taken by ``te`` and ``deepgemm``
(``per_block_cast_to_fp8``); DeepSeek-V3's code quantizes no 128x128 tile (its weights arrive
quantized; ``weight_dequant`` only multiplies), so ``deepseek`` is 1 x 128 only.

Variant ``te`` (default; Transformer Engine ``tests/pytorch/references/blockwise_quantizer_reference.py``
``BlockwiseQuantizerReference.quantize`` with ``eps = 0`` and its scale rule
``quantize_scale_calc.py`` ``scale_from_amax_tensor``, dequantized by ``ref_dequantize_rowwise``)::

    1. A     = max |x| over the tile           NaN-propagating (``torch.amax``)
    2. s     = RN(448 / A)                      IEEE division (A = 0 -> inf, NaN -> NaN)
    3. s     = M where s == inf                 M = the largest finite value of the *input* dtype
                                                (``torch.finfo(x_dtype).max``: bf16 0x7F7F = 3.3895e38,
                                                fp16 65504, fp32 3.4028e38)
    4. pow2 (default):  s = 2**(frexp(s).exponent - 1)   the power of two at or below s;
                        NaN s -> 2**-1 (frexp gives exponent 0 for NaN)
       fp32_scale=True: s unchanged
    5. s     = 0 where A == inf (pow2 only: TE's reference writes 0 after ldexp);  s = 1 where A == 0
    6. inv   = RN(1 / s)                        (s = 0 -> inf)
    7. q     = e4m3(clamp(RN(x * s), -448, 448))
    8. y     = RN(q * inv)

  Step 3 matters for tiles with ``0 < A < 448 / M``: bf16 tiles of subnormals and tiny normals
  (``A < 1.32e-36``) get the scale ``3.3895e38`` with ``fp32_scale``; with pow2 scales both maxima
  give ``2**127``.  Consequences: a tile holding inf is all NaN (pow2: ``s = 0``, ``inv = inf``;
  fp32: ``s = 0`` as well, from 448/inf); a tile holding NaN keeps its finite elements with pow2
  (``s = 1/2``) and is all NaN with ``fp32_scale``.

Variant ``deepseek`` (DeepSeek-V3 ``inference/kernel.py`` ``act_quant_kernel``, dequantized as its
``weight_dequant_kernel`` does, ``y = q * s``)::

    1. A = max |x| over the tile, NaN elements ignored (``tl.max`` on the GPU)
    2. A = max(A, RN(1e-4))                    ``tl.maximum(amax, 1e-4)``: every tile below 1e-4,
                                               the all-zero tile included, gets 1e-4
    3. s = RN(A * RN(1 / 448))                 the kernel's ``amax / 448.`` as the GPU computes it: a
                                               product with the rounded reciprocal (measured on an H200,
                                               Triton 3.6: 14 of the 329,728 elements of the adversarial
                                               classes differ from the IEEE quotient ``RN(A / 448)``, none
                                               from this product)
    4. pow2 (default, ``scale_fmt="ue8m0"``):  s = 2**ceil(log2 s), the power of two at or above s,
       with the exact ``log2``: the biased exponent of ``s`` plus 1 when its mantissa is not 0 (``s``
       is normal); inf stays inf.  For bf16 and fp16 ``A`` no ``s`` lies within a relative 2**-11 of a
       power of two but on it (``448 * 2**k * RN(1/448)`` rounds to ``2**k``), so every ``log2``
       rounded to fp32 gives the same ceiling; fp32 ``A`` a few ulps above ``448 * 2**k`` can meet a
       ``log2`` that rounds down to ``k``
       fp32_scale=True (``scale_fmt=None``):  s unchanged
    5. q = e4m3(RN(x / s))                     IEEE division; saturating (the kernel's fp8 cast)
    6. y = RN(q * s)

  A tile holding inf has ``s = inf``: every element is ``q * inf`` with ``q = +-0`` or ``+-448``,
  so the tile is all NaN but its inf elements.  NaN elements give NaN; the tile's other elements
  keep the scale of its finite elements.  Step 5's ``x / s`` is an approximate division on the GPU
  too; it gave the IEEE quotient's e4m3 on every element of the adversarial classes, and this
  reference keeps the IEEE quotient (as ``reference.nvfp4`` states for the same reason).

Variant ``deepgemm`` (DeepGEMM ``deep_gemm/utils/math.py`` ``per_token_cast_to_fp8`` (1 x 128) and
``per_block_cast_to_fp8`` (128 x 128), dequantized as its tests cast back, ``q.float() * sf``)::

    1. A  = max |x| over the tile, NaN-propagating (``torch.amax``)
    2. A  = max(A, RN(1e-4))    ``clamp(1e-4)``: NaN stays NaN; every tile with A < 1e-4 gets 1e-4
    3. sf = RN(A / 448)
    4. pow2 (default, ``use_ue8m0=True``): sf = 2**(e + (m != 0) - 127) with e, m the exponent and
       mantissa fields of sf, the biased exponent clamped to [1, 254] (``ceil_to_ue8m0``; NaN and inf
       sf -> 2**127)
       fp32_scale=True (``use_ue8m0=False``): sf unchanged (NaN and inf stay)
    5. q  = e4m3(RN(x * RN(1 / sf)))   (pow2: 1/sf exact)
    6. y  = RN(q * sf)

Backward: as ``reference.mx`` (no amax: ``clipped`` keeps every non-NaN element's gradient).
"""

from __future__ import annotations

import torch

from .constants import E4M3_MAX, FP8_BLOCK
from .granularity import from_tiles, to_tiles
from .mx import _check_amax
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e4m3, to_output_dtype

AMAX_FLOOR = 1e-4
"""DeepSeek's ``tl.maximum(amax, 1e-4)`` and DeepGEMM's ``clamp(1e-4)`` on the tile amax (rounded to fp32)."""

VARIANTS_2D = frozenset({"te", "deepgemm"})
"""The variants that take ``tile_2d`` (the module docstring)."""


def fp8_tile(tile_2d: bool) -> tuple[int, int]:
    return (FP8_BLOCK, FP8_BLOCK) if tile_2d else (1, FP8_BLOCK)


def _tiles(x: torch.Tensor, tile_2d: bool, amax: None) -> tuple[torch.Tensor, tuple[int, int]]:
    _check_amax(amax, "fp8_block")
    tile = fp8_tile(tile_2d)
    return to_tiles(x.to(torch.float32), tile), tile


def _result(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, tile: tuple[int, int]) -> FakeQuantResult:
    shape = tuple(x.shape)
    return FakeQuantResult(to_output_dtype(from_tiles(y, tile, shape), x.dtype), from_tiles(v, tile, shape), round_to_e4m3)


def pow2_floor(s: torch.Tensor) -> torch.Tensor:
    """``2**(frexp(s).exponent - 1)`` for fp32 ``s`` (normal or a dtype maximum); NaN -> ``2**-1``."""
    _, e = torch.frexp(s)
    e = torch.where(torch.isnan(s), torch.zeros_like(e), e) - 1
    return ((e.to(torch.int32) + 127).clamp(1, 254) << 23).view(torch.float32)


def te_scale(a: torch.Tensor, dtype: torch.dtype, *, fp32_scale: bool = False) -> torch.Tensor:
    """Steps 2-5 of ``te``: the fp32 encode scale of tile amax ``a`` for input of ``dtype``."""
    s = fp32_scalar_like(E4M3_MAX, a) / a
    s = torch.where(s == float("inf"), fp32_scalar_like(torch.finfo(dtype).max, a), s)
    if not fp32_scale:
        s = pow2_floor(s)
        s = torch.where(a == float("inf"), torch.zeros((), device=a.device), s)
    return torch.where(a == 0, torch.ones((), device=a.device), s)


def fp8_block_te(x, amax=None, *, tile_2d: bool = False, fp32_scale: bool = False) -> FakeQuantResult:
    """Transformer Engine's blockwise reference; see the module docstring."""
    xt, tile = _tiles(x, tile_2d, amax)
    s = te_scale(xt.abs().amax(dim=-1, keepdim=True), x.dtype, fp32_scale=fp32_scale)
    inv = fp32_scalar_like(1.0, xt) / s
    v = xt * s
    return _result(x, round_to_e4m3(v) * inv, v, tile)


def ue8m0_ceil(d: torch.Tensor, *, lo: int = 1, hi: int = 254) -> torch.Tensor:
    """``2**(e + (m != 0) - 127)`` of fp32 ``d >= 0`` (its exponent and mantissa fields), the biased
    exponent clamped to ``[lo, hi]`` (DeepGEMM ``ceil_to_ue8m0``: [1, 254])."""
    bits = d.abs().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (e.clamp(lo, hi) << 23).view(torch.float32)


def _floored(a: torch.Tensor) -> torch.Tensor:
    floor = fp32_scalar_like(AMAX_FLOOR, a)
    return torch.where(a < floor, floor, a)  # max(a, 1e-4): NaN stays NaN


def deepseek_scale(a: torch.Tensor, *, fp32_scale: bool = False) -> torch.Tensor:
    """Steps 2-4 of ``deepseek``: the decode scale ``s`` of the NaN-ignoring tile amax ``a``."""
    s = _floored(a) * torch.reciprocal(fp32_scalar_like(E4M3_MAX, a))
    if fp32_scale:
        return s
    up = ue8m0_ceil(s, lo=0, hi=255)  # s >= RN(1e-4 / 448) is normal; field 255 only for inf
    return torch.where(torch.isinf(s), s, up)


def fp8_block_deepseek(x, amax=None, *, fp32_scale: bool = False) -> FakeQuantResult:
    """DeepSeek-V3's ``act_quant``; see the module docstring."""
    xt, tile = _tiles(x, False, amax)
    mag = xt.abs()
    a = torch.where(torch.isnan(mag), torch.zeros((), device=mag.device), mag).amax(dim=-1, keepdim=True)
    s = deepseek_scale(a, fp32_scale=fp32_scale)
    v = xt / s
    return _result(x, round_to_e4m3(v) * s, v, tile)


def deepgemm_scale(a: torch.Tensor, *, fp32_scale: bool = False) -> torch.Tensor:
    """Steps 2-4 of ``deepgemm``: the decode scale ``sf`` of tile amax ``a``."""
    sf = _floored(a) / fp32_scalar_like(E4M3_MAX, a)
    return sf if fp32_scale else ue8m0_ceil(sf)


def fp8_block_deepgemm(x, amax=None, *, tile_2d: bool = False, fp32_scale: bool = False) -> FakeQuantResult:
    """DeepGEMM's block cast; see the module docstring."""
    xt, tile = _tiles(x, tile_2d, amax)
    sf = deepgemm_scale(xt.abs().amax(dim=-1, keepdim=True), fp32_scale=fp32_scale)
    v = xt * (fp32_scalar_like(1.0, xt) / sf)
    return _result(x, round_to_e4m3(v) * sf, v, tile)


VARIANTS = {"te": fp8_block_te, "deepseek": fp8_block_deepseek, "deepgemm": fp8_block_deepgemm}
DEFAULT_VARIANT = "te"
