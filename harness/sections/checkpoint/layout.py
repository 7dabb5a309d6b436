"""Megatron-style parallel layouts: which rank holds which experts and which tensor slice.

A layout is ``(tp, ep)`` on ``world = tp * ep`` ranks, laid out as the device mesh
``(ep, tp)`` (``MESH_DIMS``) with tensor parallel varying fastest, as Megatron orders its groups::

    rank = ep_rank * tp + tp_rank

Experts (``megatron/core/transformer/moe/experts.py``)::

    num_local_experts = num_experts // ep
    global expert of local expert i on EP rank r = r * num_local_experts + i

Tensor parallel splits every tensor dimension it touches into ``tp`` equal contiguous chunks;
chunk ``k`` goes to TP rank ``k``.  Which dimension it touches is the model's business
(``harness.sections.checkpoint.model.TP_DIM``: fc1 on out, fc2 on in).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterator

MESH_DIMS: tuple[str, str] = ("ep", "tp")
"""Device mesh dimension names, outer to inner (``init_device_mesh(..., mesh_dim_names=MESH_DIMS)``)."""

TP_SIZES: tuple[int, ...] = (1, 2)
EP_SIZES: tuple[int, ...] = (1, 2, 4, 8)
"""The layout matrix: every ``(tp, ep)`` from these whose world size fits."""

_ID = re.compile(r"^tp(?P<tp>\d+)ep(?P<ep>\d+)$")


@dataclass(frozen=True)
class Coords:
    """A rank's position on the mesh."""

    ep: int
    tp: int

    def on(self, mesh_dim: str) -> int:
        """The coordinate along ``mesh_dim`` (``"ep"`` or ``"tp"``)."""
        if mesh_dim not in MESH_DIMS:
            raise ValueError(f"unknown mesh dim {mesh_dim!r}; known: {MESH_DIMS}")
        return self.ep if mesh_dim == "ep" else self.tp


@dataclass(frozen=True)
class Layout:
    """``tp`` tensor-parallel x ``ep`` expert-parallel ranks (see the module docstring)."""

    tp: int
    ep: int

    def __post_init__(self) -> None:
        for name, v in (("tp", self.tp), ("ep", self.ep)):
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")

    @property
    def world(self) -> int:
        return self.tp * self.ep

    @property
    def id(self) -> str:
        """``tp{tp}ep{ep}``, e.g. ``tp2ep4`` (parsed back by ``parse_layout``)."""
        return f"tp{self.tp}ep{self.ep}"

    def size(self, mesh_dim: str) -> int:
        """Number of ranks along ``mesh_dim``."""
        if mesh_dim not in MESH_DIMS:
            raise ValueError(f"unknown mesh dim {mesh_dim!r}; known: {MESH_DIMS}")
        return self.ep if mesh_dim == "ep" else self.tp

    def coords(self, rank: int) -> Coords:
        """``(ep_rank, tp_rank)`` of a global rank (TP fastest)."""
        if not 0 <= rank < self.world:
            raise ValueError(f"rank {rank} out of range for {self.id} (world {self.world})")
        return Coords(ep=rank // self.tp, tp=rank % self.tp)

    def all_coords(self) -> Iterator[tuple[int, Coords]]:
        """``(rank, coords)`` for every rank, in rank order."""
        for r in range(self.world):
            yield r, self.coords(r)

    def num_local_experts(self, num_experts: int) -> int:
        """``num_experts // ep``; ``ValueError`` when it does not divide."""
        if num_experts % self.ep:
            raise ValueError(f"num_experts={num_experts} is not divisible by ep={self.ep} ({self.id})")
        return num_experts // self.ep

    def global_expert(self, num_experts: int, ep_rank: int, local_index: int) -> int:
        """Megatron's global expert index ``ep_rank * num_local_experts + local_index``."""
        n_local = self.num_local_experts(num_experts)
        if not 0 <= local_index < n_local:
            raise ValueError(f"local expert {local_index} out of range (num_local_experts={n_local})")
        if not 0 <= ep_rank < self.ep:
            raise ValueError(f"ep_rank {ep_rank} out of range for ep={self.ep}")
        return ep_rank * n_local + local_index

    def local_experts(self, num_experts: int, ep_rank: int) -> list[int]:
        """Global indices of the experts held by EP rank ``ep_rank``, in local order."""
        return [self.global_expert(num_experts, ep_rank, i) for i in range(self.num_local_experts(num_experts))]


def tp_chunk(size: int, tp: int, tp_rank: int) -> slice:
    """The slice of a dimension of length ``size`` held by TP rank ``tp_rank`` of ``tp``."""
    if size % tp:
        raise ValueError(f"dimension of size {size} is not divisible by tp={tp}")
    step = size // tp
    return slice(tp_rank * step, (tp_rank + 1) * step)


def parse_layout(text: str) -> Layout:
    """``"tp2ep4"`` -> ``Layout(tp=2, ep=4)``."""
    m = _ID.match(text)
    if not m:
        raise ValueError(f"layout id must look like 'tp2ep4', got {text!r}")
    return Layout(tp=int(m["tp"]), ep=int(m["ep"]))


def matrix_layouts(max_world: int) -> list[Layout]:
    """Every ``(tp, ep)`` of ``TP_SIZES x EP_SIZES`` with ``world <= max_world``, smallest world first."""
    if max_world < 1:
        raise ValueError(f"max_world must be >= 1, got {max_world}")
    found = [Layout(tp, ep) for tp in TP_SIZES for ep in EP_SIZES if tp * ep <= max_world]
    return sorted(found, key=lambda lay: (lay.world, lay.tp))
