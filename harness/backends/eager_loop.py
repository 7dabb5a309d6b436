"""Built-in backend ``eager-loop``: one reference call per expert (the eager per-expert baseline).

This is what a framework without a grouped kernel does (N small launches); it is the speed baseline
of the performance records and the definition of the grouped result.
"""

from __future__ import annotations

from typing import Sequence

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


class EagerLoopBackend:
    """Per-expert loop over ``reference.fake_quant`` / ``reference.ste_backward``."""

    name = "eager-loop"

    @property
    def formats(self) -> set[str]:
        """Every registered format (``reference.FORMATS``, read at each call)."""
        return set(FORMATS)

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: str | None = None, **options) -> list[torch.Tensor]:
        per = reference.split_expert_amax(weights, amax, fmt=fmt)
        return [reference.fake_quant(w, a, fmt, variant, **options) for w, a in zip(weights, per)]

    def ste_backward(self, weights, amax, grads, fmt: str, mode: str, **options) -> list[torch.Tensor]:
        per = reference.split_expert_amax(weights, amax, fmt=fmt)
        return [reference.ste_backward(w, a, g, mode) for w, a, g in zip(weights, per, grads)]
