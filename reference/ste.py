"""Straight-through-estimator backward of fake quantization.

Numeric contract
================
* ``pass_through`` (Model-Optimizer ``pass_through_bwd=True``, the default since 0.43): the input
  gradient *is* the output gradient, bit for bit (the same tensor is returned; no copy).
* ``clipped`` (``pass_through_bwd=False``): ``grad_in = grad_out where |x| <= amax else +0``.
  The comparison is inclusive (``|x| == amax`` keeps its gradient); NaN ``x`` gives ``+0``; amax
  is broadcast per tensor / expert / channel exactly as in the forward (``reference.granularity``).
  For NVFP4 ``amax`` is the global amax.  Output dtype = ``grad_out`` dtype.
  A format whose scales come from the data (``amax=None``: MX, FP8 block-wise) clips at each
  element's own tile amax, which every element but NaN meets: ``clipped`` keeps the gradient where
  ``x`` is not NaN (±inf included) and gives ``+0`` for NaN ``x``.

  In which precision ``|x|`` and ``amax`` (fp32) are compared is the ``clip_rule``:

  - ``fp32`` (default): after an exact upcast of ``x`` to fp32, whatever amax's shape.  The rule
    of the CUDA extension's vectors (docs/measured.md §7) and of this package's kernels, and the one that depends only
    on the numbers.
  - ``torch_promotion``: what torch's type promotion makes of Model-Optimizer's
    ``torch.where(x.abs() <= amax, grad, 0)`` (``tensor_quant._fake_tensor_quant_backward``, a
    TorchScript function: on CPU always, on CUDA until TorchScript's profiling executor fuses it,
    after which it compares in fp32) when each quantizer holds a **0-dim** fp32 amax, as a per-tensor
    ``TensorQuantizer`` does: a 0-dim tensor does not promote a bf16/fp16 ``x``, so the
    comparison runs in ``x``'s dtype, ``|x| <= RNE_dtype(amax)`` (fp16: amax above 65504 rounds
    to ``inf``).  It applies to a 0-dim amax and to per-expert amax (one 0-dim amax per expert
    quantizer); a ``(1,)``-shaped or per-channel amax is a dimensioned tensor, promotes ``x`` to
    fp32 and gives the ``fp32`` rule.  fp32 ``x``: both rules agree.  Example: bf16
    ``x = 1.0078125``, fp32 amax ``1.006`` (bf16 ``1.0078125``): ``torch_promotion`` keeps the
    gradient, ``fp32`` zeroes it.
"""

from __future__ import annotations

from typing import Optional

import torch

from .granularity import broadcast_amax, check_input, granularity_of

STE_MODES = ("pass_through", "clipped")
CLIP_RULES = ("fp32", "torch_promotion")
DEFAULT_CLIP_RULE = "fp32"


def promotes_to_input_dtype(x: torch.Tensor, amax: torch.Tensor) -> bool:
    """Whether the ``torch_promotion`` rule compares in ``x``'s dtype for this ``amax`` (see the
    module docstring): a bf16/fp16 ``x`` and a 0-dim or per-expert amax."""
    if x.dtype == torch.float32:
        return False
    return amax.dim() == 0 or granularity_of(x, amax) == "per_expert"


def clip_keep(x: torch.Tensor, amax: Optional[torch.Tensor], clip_rule: str = DEFAULT_CLIP_RULE) -> torch.Tensor:
    """The boolean mask ``|x| <= amax`` of the clipped backward under ``clip_rule`` (``amax=None``:
    ``x`` is not NaN)."""
    if clip_rule not in CLIP_RULES:
        raise ValueError(f"clip_rule must be one of {CLIP_RULES}, got {clip_rule!r}")
    if amax is None:
        check_input(x)
        return ~torch.isnan(x)
    a = broadcast_amax(x, amax)
    if clip_rule == "torch_promotion" and promotes_to_input_dtype(x, amax):
        return x.abs() <= a.to(x.dtype)
    return x.to(torch.float32).abs() <= a


def ste_backward(x: torch.Tensor, amax: Optional[torch.Tensor], grad_out: torch.Tensor, mode: str,
                 *, clip_rule: str = DEFAULT_CLIP_RULE) -> torch.Tensor:
    """Input gradient of fake quant for ``grad_out``; see the module docstring."""
    if mode not in STE_MODES:
        raise ValueError(f"mode must be one of {STE_MODES}, got {mode!r}")
    if grad_out.shape != x.shape:
        raise ValueError(f"grad shape {tuple(grad_out.shape)} != input shape {tuple(x.shape)}")
    if clip_rule not in CLIP_RULES:
        raise ValueError(f"clip_rule must be one of {CLIP_RULES}, got {clip_rule!r}")
    if mode == "pass_through":
        if amax is None:
            check_input(x)
        else:
            broadcast_amax(x, amax)  # the same validation as the clipped mode
        return grad_out
    keep = clip_keep(x, amax, clip_rule)
    return torch.where(keep, grad_out, torch.zeros((), dtype=grad_out.dtype, device=grad_out.device))
