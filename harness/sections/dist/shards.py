"""Sharded state dicts of the expert model: keys, global shapes and which slice a rank holds.

A rank's state is kept in one canonical form, ``LocalState``: per fc, the weights
``[n_local, out', in']`` and each quantizer buffer ``[n_local, ...]`` of its local experts
(local order = global order, Megatron's rule in ``harness.sections.dist.layout``).  ``key_plan`` maps
it to checkpoint keys in one of two quantizer layouts (prefix ``decoder.experts.linear_{fc}.``):

* ``one_vector``  -- grouped: ``weight`` ``[E, out, in]`` and ``weight_quantizer.{buf}``
  ``[E, ...]``, each sharded on dim 0 over EP (offset ``ep_rank * n_local``) and on the TP axis;
* ``n_quantizer`` -- one entry per expert under the upstream per-expert keys: ``weight{g}``
  ``[out, in]`` and ``weight_quantizer_{g}.{buf}`` (``_amax``, ``_global_amax``; the MoE section's
  ``state_dict.UPSTREAM_KEYS``), on the TP sub-mesh of the EP rank that holds expert ``g``.

``index_mode="local"`` is the known bug kept as a negative control: quantizer keys use the
*local* expert index (``n_quantizer``) or a local ``[n_local, ...]`` vector with no EP offset
(``one_vector``), so every EP rank writes identical keys and checkpoint dedup keeps one rank's
experts.  Weights always use global offsets (Megatron's sharded state dict does).

The ``one_vector``/``global`` plan doubles as the canonical global placement used to assemble
what ranks hold into ``[E, ...]`` tensors (``harness.sections.dist.checks``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .layout import MESH_DIMS, Coords, Layout
from .model import FCS, TP_DIM, MoEConfig
from .quant import QuantFormat, buffer_shape, buffer_tp_axis

QLAYOUTS: tuple[str, ...] = ("n_quantizer", "one_vector")
INDEX_MODES: tuple[str, ...] = ("global", "local")
PREFIX = "decoder.experts."


@dataclass(frozen=True)
class ShardSpec:
    """One rank's piece of one checkpoint entry.

    * ``local``: the tensor this rank holds;
    * ``global_shape``: the entry's full shape;
    * ``mesh_dims``: the mesh dims the entry lives on (``("ep", "tp")`` or the TP sub-mesh ``("tp",)``);
    * ``placements``: ``(mesh_dim, tensor_dim)`` pairs: ``tensor_dim`` is split evenly over
      ``mesh_dim``; a mesh dim in ``mesh_dims`` but not here holds replicas.
    """

    key: str
    local: torch.Tensor = field(repr=False)
    global_shape: tuple[int, ...]
    mesh_dims: tuple[str, ...]
    placements: tuple[tuple[str, int], ...]

    def offsets(self, coords: Coords) -> tuple[int, ...]:
        """Global offset of ``local`` along every dim."""
        off = [0] * len(self.global_shape)
        for mesh_dim, tdim in self.placements:
            off[tdim] = coords.on(mesh_dim) * self.local.shape[tdim]
        return tuple(off)


@dataclass(frozen=True)
class KeyEntry:
    """Where one checkpoint key comes from in ``LocalState``.

    ``field`` is ``"weight"`` or a buffer name; ``local_index`` is the local expert for per-expert
    keys, ``None`` for a stacked entry covering all local experts.
    """

    key: str
    fc: str
    field: str
    local_index: Optional[int]
    global_shape: tuple[int, ...]
    mesh_dims: tuple[str, ...]
    placements: tuple[tuple[str, int], ...]


@dataclass
class LocalState:
    """A rank's tensors in canonical form: ``weights[fc]`` ``[n, out', in']``, ``quant[fc][buf]`` ``[n, ...]``."""

    weights: dict[str, torch.Tensor]
    quant: dict[str, dict[str, torch.Tensor]]

    def get(self, fc: str, name: str) -> torch.Tensor:
        return self.weights[fc] if name == "weight" else self.quant[fc][name]


def _check_modes(qlayout: str, index_mode: str) -> None:
    if qlayout not in QLAYOUTS:
        raise ValueError(f"qlayout must be one of {QLAYOUTS}, got {qlayout!r}")
    if index_mode not in INDEX_MODES:
        raise ValueError(f"index_mode must be one of {INDEX_MODES}, got {index_mode!r}")


DERIVED_FIELDS: dict[str, str] = {"fq": "weight", "_block_scale": "_amax"}
"""Fields that are not stored but checked: each is shaped and split like the field it maps to."""


def field_tp_axis(fc: str, field_name: str, qf: QuantFormat) -> Optional[int]:
    """Axis of one expert's ``field_name`` (``[out, in]`` for a weight) that TP splits, or ``None``."""
    name = DERIVED_FIELDS.get(field_name, field_name)
    if name == "weight":
        return TP_DIM[fc]
    return buffer_tp_axis(fc, qf.buffer(name).granularity)


def _fields(cfg: MoEConfig, fc: str, qf: QuantFormat) -> list[tuple[str, tuple[int, ...], Optional[int]]]:
    """``(field, per-expert shape, TP axis)`` of the weight and every buffer of ``fc``."""
    rows = [("weight", cfg.fc_shape(fc), field_tp_axis(fc, "weight", qf))]
    rows += [(b.name, buffer_shape(cfg, fc, b.granularity), field_tp_axis(fc, b.name, qf)) for b in qf.buffers]
    return rows


def _key(fc: str, field_name: str, qlayout: str, index: Optional[int]) -> str:
    base = f"{PREFIX}linear_{fc}."
    if field_name == "weight":
        return base + ("weight" if index is None else f"weight{index}")
    return base + ("weight_quantizer." if index is None else f"weight_quantizer_{index}.") + field_name


def key_plan(
    cfg: MoEConfig, layout: Layout, coords: Coords, qlayout: str, qf: QuantFormat, index_mode: str = "global"
) -> list[KeyEntry]:
    """Every checkpoint key this rank holds, in a fixed order (see the module docstring)."""
    _check_modes(qlayout, index_mode)
    cfg.check_layout(layout)
    n_local = layout.num_local_experts(cfg.num_experts)
    experts = layout.local_experts(cfg.num_experts, coords.ep)
    plan: list[KeyEntry] = []
    for fc in FCS:
        for name, shape, tp_axis in _fields(cfg, fc, qf):
            local_bug = index_mode == "local" and name != "weight"
            if qlayout == "one_vector":
                tp_part = () if tp_axis is None else (("tp", 1 + tp_axis),)
                if local_bug:
                    plan.append(KeyEntry(_key(fc, name, qlayout, None), fc, name, None, (n_local, *shape), MESH_DIMS, tp_part))
                else:
                    plan.append(KeyEntry(_key(fc, name, qlayout, None), fc, name, None, (cfg.num_experts, *shape), MESH_DIMS, (("ep", 0),) + tp_part))
                continue
            tp_part = () if tp_axis is None else (("tp", tp_axis),)
            for i, g in enumerate(experts):
                index = i if local_bug else g
                plan.append(KeyEntry(_key(fc, name, qlayout, index), fc, name, i, shape, ("tp",), tp_part))
    return plan


def expected_entries(
    cfg: MoEConfig, layout: Layout, qlayout: str, qf: QuantFormat, index_mode: str = "global"
) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """Every key a whole checkpoint written under ``layout`` holds (all ranks): ``key -> (shape, dtype)``.

    With ``index_mode="global"`` this does not depend on ``layout`` (the point of global keys);
    with ``"local"`` it is what the buggy writer produces: ``n_local`` experts' keys.
    """
    dtypes = field_dtypes(cfg, qf)
    out: dict[str, tuple[tuple[int, ...], torch.dtype]] = {}
    for _, coords in layout.all_coords():
        for e in key_plan(cfg, layout, coords, qlayout, qf, index_mode):
            out[e.key] = (e.global_shape, dtypes[e.field])
    return out


def local_shape(entry: KeyEntry, layout: Layout) -> tuple[int, ...]:
    """Shape of this rank's piece of ``entry``."""
    shape = list(entry.global_shape)
    for mesh_dim, tdim in entry.placements:
        shape[tdim] //= layout.size(mesh_dim)
    return tuple(shape)


def to_specs(state: LocalState, plan: list[KeyEntry]) -> list[ShardSpec]:
    """Cut a ``LocalState`` into the ``ShardSpec`` of every key of ``plan``."""
    specs = []
    for e in plan:
        t = state.get(e.fc, e.field)
        local = t if e.local_index is None else t[e.local_index]
        specs.append(ShardSpec(e.key, local.contiguous(), e.global_shape, e.mesh_dims, e.placements))
    return specs


def template_specs(plan: list[KeyEntry], layout: Layout, dtypes: dict[str, torch.dtype], device: torch.device) -> list[ShardSpec]:
    """Load targets for ``plan``: NaN-filled tensors (a piece a load never writes stays visible).

    ``dtypes`` maps a field (``"weight"`` or a buffer name) to its dtype.
    """
    return [
        ShardSpec(e.key, torch.full(local_shape(e, layout), float("nan"), dtype=dtypes[e.field], device=device), e.global_shape, e.mesh_dims, e.placements)
        for e in plan
    ]


def from_loaded(loaded: dict[str, torch.Tensor], plan: list[KeyEntry]) -> LocalState:
    """Rebuild the canonical ``LocalState`` from loaded key -> local tensor (inverse of ``to_specs``)."""
    parts: dict[tuple[str, str], dict[Optional[int], torch.Tensor]] = {}
    for e in plan:
        if e.key not in loaded:
            raise KeyError(f"loaded state has no key {e.key!r}")
        parts.setdefault((e.fc, e.field), {})[e.local_index] = loaded[e.key]
    weights: dict[str, torch.Tensor] = {}
    quant: dict[str, dict[str, torch.Tensor]] = {}
    for (fc, name), by_index in parts.items():
        t = by_index[None] if None in by_index else torch.stack([by_index[i] for i in sorted(by_index)])
        if name == "weight":
            weights[fc] = t
        else:
            quant.setdefault(fc, {})[name] = t
    return LocalState(weights, quant)


def field_dtypes(cfg: MoEConfig, qf: QuantFormat) -> dict[str, torch.dtype]:
    """Weights in the model dtype; quantizer buffers fp32 (what calibration returns)."""
    return {"weight": cfg.dtype, **{b.name: torch.float32 for b in qf.buffers}}
