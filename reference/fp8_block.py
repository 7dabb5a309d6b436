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

Variant ``te`` (default; Transformer Engine ``tests/pytorch/references/quantize_scale_calc.py``
``scale_from_amax_tensor`` with ``eps = 0``, ``pow_2_scales`` = not ``fp32_scale``)::

    1. A     = max |x| over the tile           NaN-propagating
    2. s     = RN(448 / A)                      IEEE division (A = 0 -> inf, NaN -> NaN)
    3. s     = FP32_MAX where s == inf
    4. pow2 (default):  s = 2**(frexp(s).exponent - 1)   the power of two at or below s;
                        NaN s -> 2**-1 (frexp gives exponent 0 for NaN)
       fp32_scale=True: s unchanged
    5. s     = 0 where A == inf (pow2 only: TE's reference writes 0 after ldexp);  s = 1 where A == 0
    6. inv   = RN(1 / s)                        (s = 0 -> inf)
    7. q     = e4m3(RN(x * s))
    8. y     = RN(q * inv)

  TE's reference replaces an infinite scale by the largest value of the *input* dtype; this
  reference uses ``FP32_MAX``, the value of TE's C++ ``compute_scale_from_amax``: with pow2 scales
  the two give the same ``2**127``; with ``fp32_scale`` and bf16/fp16 input they differ for tiles with
  ``0 < A < 448 / FP32_MAX``.  Consequences: a tile holding inf is all NaN (pow2: ``s = 0``,
  ``inv = inf``; fp32: ``s = 0`` as well, from 448/inf); a tile holding NaN keeps its finite
  elements with pow2 (``s = 1/2``) and is all NaN with ``fp32_scale``; a tiny ``A`` gets ``2**127``.

Variant ``deepseek`` (DeepSeek-V3 ``inference/kernel.py`` ``act_quant`` / ``weight_dequant``)::

    1. A = max |x| over the tile, NaN elements ignored (Triton's ``tl.max``)
    2. s = RN(A / 448)          no eps, no zero guard
    3. q = e4m3(RN(x / s))      IEEE division (an all-zero tile: 0/0 = NaN, so the tile is all NaN)
    4. y = RN(q * s)

  DeepSeek's Triton kernel compiles ``/`` to an approximate division on the GPU; this reference keeps
  the IEEE quotient (as ``reference.nvfp4`` states for the same reason).

Variant ``deepgemm`` (DeepGEMM ``deep_gemm/utils/math.py`` ``per_block_cast_to_fp8`` /
``per_token_cast_to_fp8`` with ``use_ue8m0=True``)::

    1. A  = max |x| over the tile, NaN-propagating (``torch.amax``)
    2. A' = max(A, RN(1e-4))    ``clamp(1e-4)``: NaN stays NaN; every tile with A < 1e-4 gets 1e-4
    3. d  = RN(A' / 448)
    4. sf = 2**(e + (m != 0) - 127) with e, m the exponent and mantissa fields of d, the biased
            exponent clamped to [1, 254] (``ceil_to_ue8m0``; NaN and inf d -> 2**127)
    5. q  = e4m3(RN(x * RN(1 / sf)))   (1/sf exact)
    6. y  = RN(q * sf)

Backward: as ``reference.mx`` (no amax: ``clipped`` keeps every non-NaN element's gradient).
"""

from __future__ import annotations

import torch

from .constants import E4M3_MAX, FP32_MAX, FP8_BLOCK
from .granularity import from_tiles, to_tiles
from .mx import _check_amax
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e4m3, to_output_dtype

DEEPGEMM_AMAX_FLOOR = 1e-4
"""DeepGEMM's ``clamp(1e-4)`` on the tile amax (rounded to fp32)."""


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
    """``2**(frexp(s).exponent - 1)`` for fp32 ``s`` (normal or ``FP32_MAX``); NaN -> ``2**-1``."""
    _, e = torch.frexp(s)
    e = torch.where(torch.isnan(s), torch.zeros_like(e), e) - 1
    return ((e.to(torch.int32) + 127).clamp(1, 254) << 23).view(torch.float32)


def te_scale(a: torch.Tensor, *, fp32_scale: bool = False) -> torch.Tensor:
    """Steps 2-5 of ``te``: the fp32 encode scale of tile amax ``a``."""
    s = fp32_scalar_like(E4M3_MAX, a) / a
    s = torch.where(s == float("inf"), fp32_scalar_like(FP32_MAX, a), s)
    if not fp32_scale:
        s = pow2_floor(s)
        s = torch.where(a == float("inf"), torch.zeros((), device=a.device), s)
    return torch.where(a == 0, torch.ones((), device=a.device), s)


def fp8_block_te(x, amax=None, *, tile_2d: bool = False, fp32_scale: bool = False) -> FakeQuantResult:
    """Transformer Engine ``Float8BlockScaling``; see the module docstring."""
    xt, tile = _tiles(x, tile_2d, amax)
    s = te_scale(xt.abs().amax(dim=-1, keepdim=True), fp32_scale=fp32_scale)
    inv = fp32_scalar_like(1.0, xt) / s
    v = xt * s
    return _result(x, round_to_e4m3(v) * inv, v, tile)


def fp8_block_deepseek(x, amax=None, *, tile_2d: bool = False) -> FakeQuantResult:
    """DeepSeek-V3's ``s = amax/448``, ``x/s``; see the module docstring."""
    xt, tile = _tiles(x, tile_2d, amax)
    mag = xt.abs()
    a = torch.where(torch.isnan(mag), torch.zeros((), device=mag.device), mag).amax(dim=-1, keepdim=True)
    s = a / fp32_scalar_like(E4M3_MAX, a)
    v = xt / s
    return _result(x, round_to_e4m3(v) * s, v, tile)


def ue8m0_ceil(d: torch.Tensor) -> torch.Tensor:
    """DeepGEMM ``ceil_to_ue8m0``: ``2**(e + (m != 0) - 127)``, biased exponent clamped to [1, 254]."""
    bits = d.abs().view(torch.int32)
    e = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0).to(torch.int32)
    return (e.clamp(1, 254) << 23).view(torch.float32)


def deepgemm_scale(a: torch.Tensor) -> torch.Tensor:
    """Steps 2-4 of ``deepgemm``: the UE8M0 decode scale ``sf`` of tile amax ``a``."""
    floor = fp32_scalar_like(DEEPGEMM_AMAX_FLOOR, a)
    a = torch.where(a < floor, floor, a)  # clamp(min): NaN stays NaN
    return ue8m0_ceil(a / fp32_scalar_like(E4M3_MAX, a))


def fp8_block_deepgemm(x, amax=None, *, tile_2d: bool = False) -> FakeQuantResult:
    """DeepGEMM's UE8M0 block cast; see the module docstring."""
    xt, tile = _tiles(x, tile_2d, amax)
    sf = deepgemm_scale(xt.abs().amax(dim=-1, keepdim=True))
    v = xt * (fp32_scalar_like(1.0, xt) / sf)
    return _result(x, round_to_e4m3(v) * sf, v, tile)


VARIANTS = {"te": fp8_block_te, "deepseek": fp8_block_deepseek, "deepgemm": fp8_block_deepgemm}
DEFAULT_VARIANT = "te"
