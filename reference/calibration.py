"""Max calibration: amax = max |x| over the non-quantized axes, with a running max.

Numeric contract
================
* Reduction is exact (max of magnitudes); the result is returned as fp32 (exact for bf16/fp16
  inputs; Model-Optimizer keeps the weight dtype, which holds the same value).
* Granularity: ``per_tensor`` -> ``()``; ``per_expert`` -> ``x.shape[:-2]`` (``[N]`` for a stacked
  ``[N, out, in]``); ``per_channel`` -> ``x.shape[:-1]``; ``per_block`` -> NVFP4 block maxima.
* Empty tensors / empty experts have amax ``0``.  NaN in the data propagates into amax (and the
  fake-quant functions then reject that amax with ``ValueError``): never silently dropped.
* Running max: ``running = max(running, new)`` elementwise, NaN-propagating (``torch.maximum``).
"""

from __future__ import annotations

from typing import Sequence

import torch

from .constants import NVFP4_BLOCK
from .nvfp4 import block_amax


def max_calibrate(x: torch.Tensor, granularity: str = "per_tensor", *, block_size: int = NVFP4_BLOCK) -> torch.Tensor:
    """amax of ``x`` for ``granularity`` in {per_tensor, per_expert, per_channel, per_block} (fp32)."""
    xf = x.detach().to(torch.float32).abs()
    if granularity == "per_tensor":
        return xf.amax() if xf.numel() else torch.zeros((), device=x.device)
    if granularity == "per_expert":
        if x.dim() < 3:
            raise ValueError(f"per_expert calibration needs [N, out, in], got {tuple(x.shape)}")
        flat = xf.reshape(*x.shape[:-2], -1)
        return flat.amax(dim=-1) if flat.shape[-1] else torch.zeros(x.shape[:-2], device=x.device)
    if granularity == "per_channel":
        return xf.amax(dim=-1) if x.shape[-1] else torch.zeros(x.shape[:-1], device=x.device)
    if granularity == "per_block":
        return block_amax(x.detach(), block_size)
    raise ValueError(f"unknown granularity {granularity!r}")


def max_calibrate_experts(weights: Sequence[torch.Tensor], granularity: str = "per_expert") -> torch.Tensor:
    """Per-expert (``[N]``) or per-channel (``[N, out]``) amax of a list of N expert weights."""
    if granularity == "per_expert":
        return torch.stack([max_calibrate(w, "per_tensor") for w in weights]) if weights else torch.zeros(0)
    if granularity == "per_channel":
        return torch.stack([max_calibrate(w, "per_channel") for w in weights])
    raise ValueError(f"expert calibration granularity must be per_expert or per_channel, got {granularity!r}")


def update_running_amax(running: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
    """Running max across calibration batches (``None`` starts the run)."""
    new = new.to(torch.float32)
    if running is None:
        return new.clone()
    if running.shape != new.shape:
        raise ValueError(f"running amax shape {tuple(running.shape)} != new amax shape {tuple(new.shape)}")
    return torch.maximum(running, new)
