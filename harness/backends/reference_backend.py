"""Built-in backend ``reference``: the golden reference run as a grouped (stacked) computation.

When every expert has the same shape the experts are stacked and quantized in one
``reference.fake_quant`` call on ``[N, out, in]`` (per-expert/per-channel amax broadcast); otherwise
the per-expert loop.  Comparing it against the per-expert expected values checks that the
reference's grouped path equals its loop bit for bit.
"""

from __future__ import annotations

from typing import Sequence

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


def _stackable(weights: Sequence[torch.Tensor]) -> bool:
    return bool(weights) and all(w.dim() == 2 and w.shape == weights[0].shape for w in weights) and weights[0].numel() > 0


class ReferenceBackend:
    """The reference as a backend (see the module docstring)."""

    name = "reference"

    @property
    def formats(self) -> set[str]:
        """Every registered format (``reference.FORMATS``, read at each call)."""
        return set(FORMATS)

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: str | None = None, **options) -> list[torch.Tensor]:
        if _stackable(weights) and "block_amax" not in options:
            reference.split_expert_amax(weights, amax)
            return list(reference.fake_quant(torch.stack(list(weights)), amax, fmt, variant, **options).unbind(0))
        return reference.fake_quant_experts(weights, amax, fmt, variant, **options)

    def fake_quant_stacked(self, weight: torch.Tensor, amax: torch.Tensor, fmt: str, variant: str | None = None, **options) -> torch.Tensor:
        return reference.fake_quant(weight, amax, fmt, variant, **options)

    def ste_backward(self, weights, amax, grads, fmt: str, mode: str, **options) -> list[torch.Tensor]:
        """STE does not depend on the format's options; they are accepted and not used."""
        return reference.ste_backward_experts(weights, amax, grads, mode)
