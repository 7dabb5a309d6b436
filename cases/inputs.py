"""Materialize a ``Case`` into tensors: weights, amax, output gradients (deterministic per seed).

Seeds: ``case_seed = (global_seed + crc32(case.id)) mod 2**63``; all data comes from one explicit
``torch.Generator`` in a fixed order, so the bits do not depend on the test order or the xdist worker.

Small cases are built on the CPU (CPU generator) and moved to ``device``: their bits do not depend on
the device either.  Cases of ``DEVICE_GENERATION_MIN`` elements or more that are built for a CUDA
device are generated there, from a CUDA generator with the same seed (CPU generation of the nightly
suite's 11G elements alone would take minutes): their bits are reproducible on any CUDA device, not
equal to a CPU build of the same case.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Optional

import torch

from .amax import expert_amax
from .case import Case
from .distributions import TORCH_DTYPES, generate
from .rules import validate

DEVICE_GENERATION_MIN = 1 << 26
"""Cases this large (elements) built for CUDA are generated on the device (see the module docstring)."""

DEFAULT_SEED = 1234
"""The global seed when none is given (CLI ``--seed``, pytest ``--parity-seed``)."""


def seed_for_id(case_id: str, global_seed: int = DEFAULT_SEED) -> int:
    """``(global_seed + crc32(case_id)) mod 2**63``: the one seed rule, for any string id."""
    return (int(global_seed) + zlib.crc32(case_id.encode())) % (2**63)


def case_seed(case: Case, global_seed: int = DEFAULT_SEED) -> int:
    """``seed_for_id(case.id, global_seed)``."""
    return seed_for_id(case.id, global_seed)


@dataclass(frozen=True)
class CaseInputs:
    """The tensors of one case.

    * ``weights``: N tensors ``[out_i, in_i]`` of the case dtype (views of ``stacked`` when the layout
      is ``stacked``);
    * ``amax``: fp32 ``[N]`` (per expert) or ``[N, out]`` (per channel); ``None`` (``from_data``);
    * ``grads``: N output gradients like ``weights`` (for the backward checks);
    * ``stacked``: the ``[N, out, in]`` tensor for the stacked layout, else ``None``.
    """

    case: Case
    seed: int
    weights: list[torch.Tensor]
    amax: Optional[torch.Tensor]
    grads: list[torch.Tensor]
    stacked: Optional[torch.Tensor]

    @property
    def device(self) -> torch.device:
        """The device of the case's tensors."""
        return self.amax.device if self.amax is not None else self.weights[0].device

    @property
    def nbytes(self) -> int:
        """Bytes a fake quant reads plus writes (input + output of every expert)."""
        return 2 * sum(w.numel() * w.element_size() for w in self.weights)


def make_inputs(case: Case, global_seed: int = DEFAULT_SEED, device: str | torch.device = "cpu") -> CaseInputs:
    """Build the tensors of ``case`` (see the module docstring); ``ValueError`` if ``cases.rules``
    rejects the case."""
    validate(case)
    seed = case_seed(case, global_seed)
    dev = torch.device(device)
    where = dev if dev.type == "cuda" and case.numel >= DEVICE_GENERATION_MIN else torch.device("cpu")
    gen = torch.Generator(device=where).manual_seed(seed)
    dtype = TORCH_DTYPES[case.dtype]
    shapes = case.expert_shapes
    with torch.device(where):  # factory functions in the distributions follow the generator's device
        gen_out = generate(case, gen, shapes)
        design = gen_out.design_amax or [None] * len(shapes)
        per = [expert_amax(case, i, x, d) for i, (x, d) in enumerate(zip(gen_out.values, design))]
        amax = None if case.amax == "none" else torch.stack(per)
        grads = [torch.randn(s, generator=gen).to(dtype) for s in shapes]
    if case.layout == "stacked":
        stacked = torch.stack([v.to(dtype) for v in gen_out.values]).to(dev)
        weights = list(stacked.unbind(0))
    else:
        stacked = None
        weights = [v.to(dtype).to(dev) for v in gen_out.values]
    amax = None if amax is None else amax.to(torch.float32).to(dev)
    return CaseInputs(case, seed, weights, amax, [g.to(dev) for g in grads], stacked)
