"""A match case (``Case``: the inputs of one comparison) and the helpers every case builder shares
(``match_cases``, ``int_group_cases``): the per-element amax of a case, rows of random values below
a given block amax, a value's neighbours in a dtype."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from moe_fq_parity import reference


@dataclass(frozen=True)
class Case:
    """Inputs of one comparison, all on the CPU."""

    name: str
    weights: list[torch.Tensor]
    amax: Optional[torch.Tensor]
    """``[N]`` per expert or ``[N, out]`` per channel, as the backend contract takes it; ``None`` for
    a format whose scales come from the data."""
    stacked: Optional[torch.Tensor]
    """The same data as one tensor the reference evaluates at once, or ``None`` (then the
    reference runs expert by expert)."""
    stacked_amax: Optional[torch.Tensor]
    elem_amax: torch.Tensor
    """fp32 amax of every element (its block's amax where scales come from the data), in the flat order of ``torch.cat([w.reshape(-1) for w in weights])``."""

    @property
    def numel(self) -> int:
        return sum(w.numel() for w in self.weights)

    def flat_input(self) -> torch.Tensor:
        return torch.cat([w.reshape(-1) for w in self.weights])


def make_case(name: str, weights: list[torch.Tensor], amax: torch.Tensor,
              stacked: Optional[torch.Tensor] = None, stacked_amax: Optional[torch.Tensor] = None) -> Case:
    """A ``Case`` with its per-element amax filled in."""
    per = reference.split_expert_amax(weights, amax)
    elem = torch.cat([torch.broadcast_to(a.reshape(-1, 1) if a.dim() else a, w.shape).reshape(-1) for w, a in zip(weights, per)])
    return Case(name, weights, amax, stacked, stacked_amax, elem.to(torch.float32))


def make_block_case(name: str, weights: list[torch.Tensor], block: int) -> Case:
    """A case of a format whose scales come from the data (``amax=None``): ``elem_amax`` is each
    element's block amax (``max |x|`` over its ``block`` along the last dim), what the offenders show."""
    elem = []
    for w in weights:
        rows = w.to(torch.float32).reshape(-1, block)
        elem.append(rows.abs().amax(dim=1, keepdim=True).expand(-1, block).reshape(-1))
    return Case(name, weights, None, None, None, torch.cat(elem))


def blocks_below(amax: torch.Tensor, block: int, dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """``[len(amax), block]`` of ``dtype``: row ``i`` has ``+-amax[i]`` at a random position and
    random values of magnitude below it elsewhere (each the amax times ``U[0, 1)``, rounded toward
    zero to ``dtype`` so none exceeds it)."""
    n = amax.numel()
    a = amax.to(torch.float32).reshape(-1, 1)
    fill = (a * torch.rand(n, block, generator=gen)) * torch.where(torch.rand(n, block, generator=gen) < 0.5, -1.0, 1.0)
    if dtype == torch.bfloat16:
        fill = (fill.view(torch.int32) & ~0xFFFF).view(torch.float32)  # truncation: |fill| stays <= amax
    where = torch.randint(0, block, (n,), generator=gen)
    sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
    fill[torch.arange(n), where] = a.reshape(-1) * sign
    return fill.to(dtype)


def neighbours(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``v`` (exact in ``dtype``) and its next values down and up in ``dtype``, finite and > 0."""
    v = v.to(dtype)
    it = torch.int16 if dtype == torch.bfloat16 else torch.int32
    bits = v.view(it)
    out = torch.cat([v, (bits - 1).view(dtype), (bits + 1).view(dtype)]).to(torch.float32)
    return out[torch.isfinite(out) & (out > 0)].unique()
