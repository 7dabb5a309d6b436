"""The record every reference fake-quant variant returns."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch


@dataclass(frozen=True)
class FakeQuantResult:
    """Output of one fake quantization plus what is needed to explain a mismatch.

    * ``out``: the fake-quantized tensor, input dtype.
    * ``pre_round``: fp32, same shape as the input: the value handed to the format's grid
      rounding (``x*s`` for INT/FP8, ``x*encode_scale`` for NVFP4).  A kernel whose scale
      differs by one fp32 ulp lands in another bin only where this value is near a tie.
    * ``grid_round``: the rounding applied to ``pre_round`` (fp32 -> fp32 grid value),
      used to decide whether a mismatch is a *tie flip* (see ``harness.core.ulp``).
    """

    out: torch.Tensor
    pre_round: torch.Tensor
    grid_round: Callable[[torch.Tensor], torch.Tensor]
