"""Built-in backend ``reference``: the golden reference run as a grouped (stacked) computation.

When every expert has the same shape the experts are stacked and quantized through
``reference.fake_quant`` on ``[k, out, in]`` stacks of consecutive experts (per-expert/per-channel amax
broadcast); otherwise the per-expert loop.  Comparing it against the per-expert expected values checks
that the reference's grouped path equals its loop bit for bit.

Memory: the reference evaluates its formula in fp32 with several tensor-sized temporaries, so the
stack is evaluated in chunks of whole experts of at most ``CHUNK_ELEMENTS`` elements (at least one
expert per chunk): the fp32 temporaries are those of one chunk, never of the whole stack (at the
Ultra case, N=32 x [5120, 8192], one expert per chunk: 168 MB per fp32 temporary instead of 5.4 GB).
Every element's result depends on its own expert's amax only, so chunking gives the same bits as one
call over the whole stack (``tests/harness/test_memory.py`` proves it for every format).
"""

from __future__ import annotations

from typing import Iterator, Sequence

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS

CHUNK_ELEMENTS = 1 << 25
"""Largest chunk of the stack evaluated at once, in elements (32 Mi: 128 MiB per fp32 temporary)."""


def _stackable(weights: Sequence[torch.Tensor]) -> bool:
    return bool(weights) and all(w.dim() == 2 and w.shape == weights[0].shape for w in weights) and weights[0].numel() > 0


def expert_chunks(n: int, expert_numel: int, chunk_elements: int) -> Iterator[tuple[int, int]]:
    """``(start, stop)`` ranges over ``n`` experts: whole experts, at most ``chunk_elements`` each (at least one)."""
    per = max(1, chunk_elements // max(1, expert_numel))
    for start in range(0, n, per):
        yield start, min(n, start + per)


def _amax_rows(amax: torch.Tensor | None, start: int, stop: int) -> torch.Tensor | None:
    """The amax of experts ``start:stop`` (a per-tensor scalar amax applies to every expert; ``None``,
    a format without amax, to every expert too)."""
    return amax if amax is None or amax.dim() == 0 else amax[start:stop]


class ReferenceBackend:
    """The reference as a backend (see the module docstring).

    ``chunk_elements``: largest chunk evaluated at once (default ``CHUNK_ELEMENTS``; tests use small
    values to force many chunks).
    """

    name = "reference"

    @property
    def formats(self) -> set[str]:
        """Every registered format (``reference.FORMATS``, read at each call)."""
        return set(FORMATS)

    def __init__(self, chunk_elements: int = CHUNK_ELEMENTS) -> None:
        if not isinstance(chunk_elements, int) or isinstance(chunk_elements, bool) or chunk_elements < 1:
            raise ValueError(f"chunk_elements must be a positive int, got {chunk_elements!r}")
        self.chunk_elements = chunk_elements

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: str | None = None, **options) -> list[torch.Tensor]:
        if _stackable(weights) and "block_amax" not in options:
            reference.split_expert_amax(weights, amax, fmt=fmt)
            out: list[torch.Tensor] = []
            for start, stop in expert_chunks(len(weights), weights[0].numel(), self.chunk_elements):
                chunk = torch.stack(list(weights[start:stop]))
                out += reference.fake_quant(chunk, _amax_rows(amax, start, stop), fmt, variant, **options).unbind(0)
                del chunk
            return out
        return reference.fake_quant_experts(weights, amax, fmt, variant, **options)

    def fake_quant_stacked(self, weight: torch.Tensor, amax: torch.Tensor, fmt: str, variant: str | None = None, **options) -> torch.Tensor:
        """``reference.fake_quant`` on ``[N, out, in]``, chunk by chunk of experts into one output tensor.

        ``block_amax`` (NVFP4 static blocks) is passed to a single call over the whole stack.
        """
        whole = (weight.dim() != 3 or weight.shape[0] == 0 or "block_amax" in options
                 or (amax is not None and (not isinstance(amax, torch.Tensor) or (amax.dim() > 0 and amax.shape[0] != weight.shape[0]))))
        if whole:  # one call: the reference's own checks (and errors) for shapes it does not chunk
            return reference.fake_quant(weight, amax, fmt, variant, **options)
        chunks = list(expert_chunks(weight.shape[0], weight[0].numel(), self.chunk_elements))
        if len(chunks) == 1:
            return reference.fake_quant(weight, amax, fmt, variant, **options)
        out = torch.empty_like(weight)
        for start, stop in chunks:
            out[start:stop] = reference.fake_quant(weight[start:stop], _amax_rows(amax, start, stop), fmt, variant, **options)
        return out

    def ste_backward(self, weights, amax, grads, fmt: str, mode: str, **options) -> list[torch.Tensor]:
        """STE does not depend on the format's options; they are accepted and not used (per expert)."""
        return reference.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)
