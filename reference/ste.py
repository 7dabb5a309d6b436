"""Straight-through-estimator backward of fake quantization.

Numeric contract
================
* ``pass_through`` (Model-Optimizer ``pass_through_bwd=True``, the default since 0.43): the input
  gradient *is* the output gradient, bit for bit (the same tensor is returned; no copy).
* ``clipped`` (``pass_through_bwd=False``): ``grad_in = grad_out where |x| <= amax else +0``.
  The comparison is inclusive (``|x| == amax`` keeps its gradient), done in fp32 after an exact
  upcast of ``x``; NaN ``x`` gives ``+0``; amax is broadcast per tensor / expert / channel
  exactly as in the forward (``reference.granularity``).  For NVFP4 ``amax`` is the global amax.
  Output dtype = ``grad_out`` dtype.  (Matches the CUDA extension vectors of docs/measured.md §7.)
"""

from __future__ import annotations

import torch

from .granularity import broadcast_amax

STE_MODES = ("pass_through", "clipped")


def ste_backward(x: torch.Tensor, amax: torch.Tensor, grad_out: torch.Tensor, mode: str) -> torch.Tensor:
    """Input gradient of fake quant for ``grad_out``; see the module docstring."""
    if mode not in STE_MODES:
        raise ValueError(f"mode must be one of {STE_MODES}, got {mode!r}")
    if grad_out.shape != x.shape:
        raise ValueError(f"grad shape {tuple(grad_out.shape)} != input shape {tuple(x.shape)}")
    a = broadcast_amax(x, amax)
    if mode == "pass_through":
        return grad_out
    keep = x.to(torch.float32).abs() <= a
    return torch.where(keep, grad_out, torch.zeros((), dtype=grad_out.dtype, device=grad_out.device))
