"""NVFP4 two-level fake quantization: FP4 E2M1 elements, E4M3 block scales, fp32 global scale.

Numeric contract
================
* Input ``x``: bf16 (primary), fp16 or fp32 ``[..., out, in]``; NaN input raises ``ValueError``
  (the block scale of a NaN block is undefined in every production implementation).
* ``amax``: the *global* amax, per tensor or per expert (``[N]`` for ``[N, out, in]``), fp32,
  finite, >= 0.  Per-channel global amax is not a format NVFP4 has: ``ValueError`` (the
  registry's ``amax_granularities``, checked by ``reference.api``).
* Blocks: ``block_size`` (default 16) consecutive elements along the last dim.  When the last
  dim is not a multiple of the block size, the last block of each row is *shorter*: it is
  quantized as if zero-padded to a full block (Transformer Engine pads with zeros), and the
  padding is dropped.  Zeros never raise a block max, so this equals a short block.
* E2M1 rounding (``round_to_e2m1``): nearest, ties to even on {0,.5,1,1.5,2,3,4,6}, ±6 saturation.
* E4M3 block-scale rounding (``round_to_e4m3``): nearest, ties to even, saturating at 448.
* Output dtype = input dtype (RNE from fp32).

Default variant ``te`` (Transformer Engine ``reference_nvfp4.py``, 1x16 tiles, no RHT)::

    1. ge   = RN(2688 / g);  ge = min(ge, FP32_MAX);  ge = 1 where ge == 0
    2. gd   = RN(1 / ge)
    3. mult = RN(ge * RN(1 / 6))            TE folds 1/6 into the multiplier "to match the kernel"
    4. vmax = max |x| over the block        exact
    5. ds8  = e4m3(RN(vmax * mult))         saturating (inf -> 448)
    6. es   = min(RN(1 / RN(ds8 * gd)), FP32_MAX)     (ds8 == 0 -> FP32_MAX)
    7. v    = RN(x * es)
    8. q    = e2m1(v)                       saturating at ±6
    9. y    = RN(RN(q * ds8) * gd)          dequantization order chosen here (TE dequantizes
                                            inside its GEMM); documented and tested
    10. out = RNE_dtype(y)

Variant ``modelopt_static`` (Model-Optimizer ``static_blockwise_fp4_fake_quant`` on CUDA, with
``quantize_block_scales=True``; the per-block ``_amax`` defaults to the block max of ``x``, as
max calibration sets it, or is passed as ``block_amax`` of shape ``x.shape[:-1] + (n_blocks,)``)::

    1. bs   = RN(bamax * RN(1/6))           torch CUDA evaluates ``amax / 6.0`` this way
    2. ga6  = RN(g * RN(1/6))
    3. bs   = FP8 ``reciprocal`` variant fake quant of bs with amax ga6 (``reference.fp8_e4m3``;
              ga6 <= 2**-24 treated as 1), kept in fp32
    4. safe = 1 where bs == 0 or not finite, else bs
    5. a    = RN(|x| / safe)
    6. q    = e2m1(a)
    7. y    = RN(q * safe), negated where not (x >= 0)   (so -0.0 -> +0.0)
    8. out  = RNE_dtype(y)
"""

from __future__ import annotations

import torch

from .constants import FP32_MAX, NVFP4_BLOCK, NVFP4_GLOBAL_SCALE_NUM, TINY_AMAX
from .fp8_e4m3 import reciprocal_core
from .granularity import broadcast_amax
from .result import FakeQuantResult
from .rounding import fp32_scalar_like, round_to_e2m1, round_to_e4m3, to_output_dtype


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


def _prepare(x: torch.Tensor, amax: torch.Tensor, block_size: int):
    g = broadcast_amax(x, amax)
    xf = x.to(torch.float32)
    if xf.numel() and bool(torch.isnan(xf).any()):
        raise ValueError("NVFP4 fake quant got NaN input: the block scale of a NaN block is undefined")
    return xf, g.unsqueeze(-1), to_blocks(xf, block_size)


def nvfp4_te(x, amax, *, block_size: int = NVFP4_BLOCK) -> FakeQuantResult:
    """Default variant: Transformer Engine's reference recipe; see the module docstring."""
    xf, g, xb = _prepare(x, amax, block_size)
    fmax = fp32_scalar_like(FP32_MAX, xf)
    ge = torch.minimum(fp32_scalar_like(NVFP4_GLOBAL_SCALE_NUM, xf) / g, fmax)
    ge = torch.where(ge == 0, torch.ones((), device=xf.device), ge)
    gd = fp32_scalar_like(1.0, xf) / ge
    mult = ge * torch.reciprocal(fp32_scalar_like(6.0, xf))
    vmax = xb.abs().amax(dim=-1, keepdim=True)
    ds8 = round_to_e4m3(vmax * mult)
    es = torch.minimum(fp32_scalar_like(1.0, xf) / (ds8 * gd), fmax)
    v = xb * es
    y = (round_to_e2m1(v) * ds8) * gd
    n = x.shape[-1]
    return FakeQuantResult(to_output_dtype(from_blocks(y, n), x.dtype), from_blocks(v, n), round_to_e2m1)


def nvfp4_modelopt_static(
    x, amax, *, block_size: int = NVFP4_BLOCK, block_amax: torch.Tensor | None = None
) -> FakeQuantResult:
    """Model-Optimizer static-block variant; see the module docstring."""
    xf, g, xb = _prepare(x, amax, block_size)
    nb = xb.shape[-2]
    if block_amax is None:
        bamax = xb.abs().amax(dim=-1)
    else:
        expected = tuple(x.shape[:-1]) + (nb,)
        if tuple(block_amax.shape) != expected:
            raise ValueError(f"block_amax shape {tuple(block_amax.shape)} != expected {expected}")
        bamax = block_amax.to(device=xf.device, dtype=torch.float32)
    sixth = torch.reciprocal(fp32_scalar_like(6.0, xf))
    bs = bamax * sixth
    ga6 = g.squeeze(-1) * sixth
    ga6 = torch.where(ga6 <= TINY_AMAX, torch.ones((), device=xf.device), ga6)
    bs = reciprocal_core(bs, ga6)[0].unsqueeze(-1)
    safe = torch.where((bs == 0) | ~torch.isfinite(bs), torch.ones((), device=xf.device), bs)
    a = xb.abs() / safe
    mag = round_to_e2m1(a) * safe
    pos = xb >= 0
    y = torch.where(pos, mag, -mag)
    v = torch.where(pos, a, -a)
    n = x.shape[-1]
    return FakeQuantResult(to_output_dtype(from_blocks(y, n), x.dtype), from_blocks(v, n), round_to_e2m1)


VARIANTS = {"te": nvfp4_te, "modelopt_static": nvfp4_modelopt_static}
DEFAULT_VARIANT = "te"
