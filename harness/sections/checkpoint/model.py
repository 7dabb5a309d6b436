"""The small MoE expert model the distributed checks save and load.

``E`` experts, each an MLP of two linears stored Megatron-style as ``[out, in]``:

* ``fc1``: ``[ffn, hidden]``, column parallel: TP splits dim 0 (out);
* ``fc2``: ``[hidden, ffn]``, row parallel: TP splits dim 1 (in).

Weights are drawn per *global* expert from a CPU ``torch.Generator`` seeded with
``(seed + crc32("dist/{fc}/e{g}")) mod 2**63``, so a rank builds exactly its own experts and
slices, and the bits do not depend on the layout, the device or the order anything ran in.
Expert ``g`` is ``randn * 2**u_g * 2**r_row`` with ``u_g`` uniform in ``[-4, 4]`` and a row factor
``r_row`` uniform in ``[-2, 2]``, so every expert's and every channel's amax differs (a swapped
expert or row is visible); every third expert has an all-zero fc1 row and an all-zero fc2 block
(amax 0 per channel and per block is part of what must round-trip).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_fq_parity.cases.inputs import seed_for_id
from moe_fq_parity.reference.constants import NVFP4_BLOCK

from .layout import Coords, Layout, tp_chunk

FCS: tuple[str, str] = ("fc1", "fc2")
TP_DIM: dict[str, int] = {"fc1": 0, "fc2": 1}
"""Dimension of the ``[out, in]`` weight that tensor parallel splits: fc1 on out, fc2 on in."""


def derived_seed(seed: int, name: str) -> int:
    """``cases.inputs.seed_for_id(name, seed)``: the project's one seed rule, ``(seed + crc32(name)) mod 2**63``."""
    return seed_for_id(name, seed)


@dataclass(frozen=True)
class MoEConfig:
    """Geometry of the expert model (defaults: tiny, so gloo runs on 2 cores stay cheap)."""

    num_experts: int = 8
    hidden: int = 48
    ffn: int = 64
    dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        for name in ("num_experts", "hidden", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def id(self) -> str:
        return f"E{self.num_experts}/h{self.hidden}/f{self.ffn}"

    def fc_shape(self, fc: str) -> tuple[int, int]:
        """``(out, in)`` of one expert's ``fc``."""
        if fc == "fc1":
            return (self.ffn, self.hidden)
        if fc == "fc2":
            return (self.hidden, self.ffn)
        raise ValueError(f"unknown fc {fc!r}; known: {FCS}")

    def check_layout(self, layout: Layout) -> None:
        """``ValueError`` naming every way the model cannot be split under ``layout``.

        Experts must divide by EP; each TP-split dimension by TP; and row-parallel shards must hold
        whole NVFP4 blocks (``in / tp`` a multiple of the block size), so block amax needs no sync.
        """
        problems = []
        if self.num_experts % layout.ep:
            problems.append(f"num_experts={self.num_experts} not divisible by ep={layout.ep}")
        for fc in FCS:
            size = self.fc_shape(fc)[TP_DIM[fc]]
            if size % layout.tp:
                problems.append(f"{fc} dim {TP_DIM[fc]} of size {size} not divisible by tp={layout.tp}")
            elif TP_DIM[fc] == 1 and (size // layout.tp) % NVFP4_BLOCK:
                problems.append(f"{fc} in-shard {size // layout.tp} is not a whole number of {NVFP4_BLOCK}-blocks")
        if problems:
            raise ValueError(f"model {self.id} does not fit layout {layout.id}: " + "; ".join(problems))


def expert_weight(cfg: MoEConfig, seed: int, fc: str, g: int) -> torch.Tensor:
    """Full ``[out, in]`` weight of global expert ``g`` (CPU, ``cfg.dtype``)."""
    if not 0 <= g < cfg.num_experts:
        raise ValueError(f"expert {g} out of range for {cfg.num_experts} experts")
    out, inp = cfg.fc_shape(fc)
    gen = torch.Generator().manual_seed(derived_seed(seed, f"dist/{fc}/e{g}"))
    w = torch.randn(out, inp, generator=gen)
    expert_exp = torch.rand((), generator=gen) * 8 - 4
    row_exp = torch.rand(out, 1, generator=gen) * 4 - 2
    w = w * torch.exp2(expert_exp) * torch.exp2(row_exp)
    if g % 3 == 0:
        if fc == "fc1":
            w[out // 2] = 0
        else:
            w[out // 2, : NVFP4_BLOCK] = 0
    return w.to(cfg.dtype)


def full_weights(cfg: MoEConfig, seed: int, fc: str) -> torch.Tensor:
    """All experts of ``fc`` stacked: ``[E, out, in]`` (CPU)."""
    return torch.stack([expert_weight(cfg, seed, fc, g) for g in range(cfg.num_experts)])


def local_weights(cfg: MoEConfig, seed: int, layout: Layout, coords: Coords, fc: str) -> torch.Tensor:
    """This rank's ``[num_local_experts, out/tp or out, in or in/tp]`` slice of ``fc`` (CPU)."""
    cfg.check_layout(layout)
    out, inp = cfg.fc_shape(fc)
    rows = tp_chunk(out, layout.tp, coords.tp) if TP_DIM[fc] == 0 else slice(0, out)
    cols = tp_chunk(inp, layout.tp, coords.tp) if TP_DIM[fc] == 1 else slice(0, inp)
    experts = layout.local_experts(cfg.num_experts, coords.ep)
    return torch.stack([expert_weight(cfg, seed, fc, g)[rows, cols] for g in experts])
