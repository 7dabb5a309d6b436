"""Sharded state dicts of the expert model: keys, global shapes and which slice a rank holds.

A rank's state is kept in one canonical form, ``LocalState``: per fc, the weights
``[n_local, out', in']`` and each quantizer buffer ``[n_local, ...]`` of its local experts
(local order = global order, Megatron's rule in ``harness.sections.checkpoint.layout``).  ``key_plan`` maps
it to checkpoint keys in one of two quantizer layouts (prefix ``decoder.experts.linear_{fc}.``):

* ``one_vector``  -- grouped: ``weight`` ``[E, out, in]`` and ``weight_quantizer.{buf}``
  ``[E, ...]``, each sharded on dim 0 over EP (offset ``ep_rank * n_local``) and on the TP axis;
* ``n_quantizer`` -- one entry per expert under the upstream per-expert keys: ``weight{g}``
  ``[out, in]`` and ``weight_quantizer_{g}.{buf}`` (``_amax``, ``_global_amax``; the MoE section's
  ``state_dict.UPSTREAM_KEYS``), on the TP sub-mesh of the EP rank that holds expert ``g``.

* ``vector_per_key`` -- the ``[N_global]``-vector format: every *local* per-expert quantizer key
  ``weight_quantizer_{i}.{buf}`` (``i < n_local``) of a per-expert scalar buffer (``_amax`` of a
  per-expert format, ``_global_amax``) holds the whole ``[E]`` vector of all experts (gathered
  over EP, replicated on every rank); the loader of local expert ``i`` on EP rank ``r`` takes
  element ``r * n_local + i`` (``slice_expert_vector``).  Weights and other buffers as
  ``n_quantizer``.  The keys are local, so a checkpoint holds only the writer's ``n_local`` keys:
  a layout whose ranks hold more experts than the writer's finds keys missing and is refused.
  A vector whose size is not ``E`` is refused with an error naming the key and both sizes;
  ``allow_size_mismatch=True`` opts in to skipping it (the expert stays uncalibrated, NaN here,
  and the key is listed in ``LocalState.skipped``), never silently.

``index_mode="local"`` is the known bug kept as a negative control: quantizer keys use the
*local* expert index (``n_quantizer``) or a local ``[n_local, ...]`` vector with no EP offset
(``one_vector``), so every EP rank writes identical keys and checkpoint dedup keeps one rank's
experts.  Weights always use global offsets (Megatron's sharded state dict does).  The
``vector_per_key`` layout's bugs, also negative controls: ``"global_rank"`` -- the loader slices
at ``global_rank * n_local + i`` instead of ``ep_rank * n_local + i`` (wrong once TP > 1);
``"channel_vector"`` -- the writer forces a per-channel amax into the ``[E]`` vector (max over
channels) and the loader broadcasts it back.

The ``one_vector``/``global`` plan doubles as the canonical global placement used to assemble
what ranks hold into ``[E, ...]`` tensors (``harness.sections.checkpoint.checks``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch

from .layout import MESH_DIMS, Coords, Layout
from .model import FCS, TP_DIM, MoEConfig
from .quant import QuantFormat, buffer_shape, buffer_tp_axis

QLAYOUTS: tuple[str, ...] = ("n_quantizer", "one_vector", "vector_per_key")
INDEX_MODES: tuple[str, ...] = ("global", "local", "global_rank", "channel_vector")
VECTOR_GRANULARITIES: tuple[str, ...] = ("per_expert", "global")
"""Buffers the ``vector_per_key`` layout stores as ``[E]`` vectors: one scalar per expert."""
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
    vector_index: Optional[int] = None
    piece_shape: tuple[int, ...] = ()
    """``vector_index``: the entry is an ``[E]`` vector and this rank's local expert is element
    ``vector_index``; ``piece_shape``: the shape that element is broadcast to (``channel_vector``)."""


@dataclass
class LocalState:
    """A rank's tensors in canonical form: ``weights[fc]`` ``[n, out', in']``, ``quant[fc][buf]`` ``[n, ...]``.

    ``vectors[fc][buf]``: ``[E]`` vectors of all experts (``vector_per_key`` writers only);
    ``skipped``: vector keys a load skipped because their size was not ``E`` (opt-in only).
    """

    weights: dict[str, torch.Tensor]
    quant: dict[str, dict[str, torch.Tensor]]
    vectors: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)

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


def qlayout_applies(qlayout: str, qf: QuantFormat) -> bool:
    """Which checkpoint layouts a format is written in: shared-expert state is Megatron
    SequentialMLP's, per-expert keys only (``n_quantizer``); ``one_vector`` and ``vector_per_key``
    are grouped-layer layouts of per-expert state, and ``vector_per_key`` needs a buffer it stores
    as a vector (a per-channel-only format would be ``n_quantizer`` under another name)."""
    if qlayout == "n_quantizer":
        return True
    if qf.experts != "per_expert":
        return False
    return qlayout == "one_vector" or bool(vector_fields(qf))


def vector_fields(qf: QuantFormat, index_mode: str = "global") -> tuple[str, ...]:
    """Buffers ``vector_per_key`` stores as ``[E]`` vectors (``channel_vector``: per-channel too)."""
    grans = VECTOR_GRANULARITIES + (("per_channel",) if index_mode == "channel_vector" else ())
    return tuple(b.name for b in qf.buffers if b.granularity in grans)


def vector_index(layout: Layout, coords: Coords, n_local: int, i: int, index_mode: str = "global") -> int:
    """Element of the ``[E]`` vector local expert ``i`` reads: ``ep_rank * n_local + i``
    (``global_rank``: the bug, ``global_rank * n_local + i``)."""
    rank = coords.ep * layout.tp + coords.tp if index_mode == "global_rank" else coords.ep
    return rank * n_local + i


def slice_expert_vector(
    key: str, vec: torch.Tensor, n_global: int, index: int, *, piece_shape: tuple[int, ...] = (), allow_size_mismatch: bool = False
) -> Optional[torch.Tensor]:
    """Local expert's value of an ``[E]`` vector entry: ``vec[index]`` broadcast to ``piece_shape``.

    A vector of another size raises ``ValueError`` naming the key, its size and ``n_global``
    (refused, never skipped silently), unless ``allow_size_mismatch`` (then ``None``: skipped).
    An ``index`` outside the vector raises ``ValueError`` as well.
    """
    if vec.dim() != 1 or vec.numel() != n_global:
        if allow_size_mismatch:
            return None
        raise ValueError(
            f"{key!r}: per-expert vector of shape {tuple(vec.shape)}, expected ({n_global},) (one entry per global expert); "
            "refusing to skip it (allow_size_mismatch=True leaves this expert's quantizer uncalibrated)"
        )
    if not 0 <= index < n_global:
        raise ValueError(f"{key!r}: expert index {index} outside the ({n_global},) vector")
    return vec[index].expand(piece_shape).clone()


def key_plan(
    cfg: MoEConfig, layout: Layout, coords: Coords, qlayout: str, qf: QuantFormat, index_mode: str = "global"
) -> list[KeyEntry]:
    """Every checkpoint key this rank holds, in a fixed order (see the module docstring)."""
    _check_modes(qlayout, index_mode)
    cfg.check_layout(layout)
    n_local = layout.num_local_experts(cfg.num_experts)
    experts = layout.local_experts(cfg.num_experts, coords.ep)
    vectors = vector_fields(qf, index_mode) if qlayout == "vector_per_key" else ()
    plan: list[KeyEntry] = []
    for fc in FCS:
        for name, shape, tp_axis in _fields(cfg, fc, qf):
            if name in vectors:
                piece = tuple(d // layout.tp if a == tp_axis else d for a, d in enumerate(shape))
                for i in range(n_local):
                    plan.append(KeyEntry(_key(fc, name, qlayout, i), fc, name, i, (cfg.num_experts,), MESH_DIMS, (),
                                         vector_index(layout, coords, n_local, i, index_mode), piece))
                continue
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


def tolerated_entries(cfg: MoEConfig, layout: Layout, qlayout: str, qf: QuantFormat) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``vector_per_key``: the vector keys ``weight_quantizer_{i}.{buf}`` with ``n_local <= i < E``
    that a checkpoint written by a layout with more local experts carries (each a copy of the
    same ``[E]`` vector; the target reads only ``i < n_local``).  Empty for the other layouts."""
    if qlayout != "vector_per_key":
        return {}
    n_local = layout.num_local_experts(cfg.num_experts)
    return {
        _key(fc, name, qlayout, i): ((cfg.num_experts,), torch.float32)
        for fc in FCS for name in vector_fields(qf) for i in range(n_local, cfg.num_experts)
    }


def local_shape(entry: KeyEntry, layout: Layout) -> tuple[int, ...]:
    """Shape of this rank's piece of ``entry``."""
    shape = list(entry.global_shape)
    for mesh_dim, tdim in entry.placements:
        shape[tdim] //= layout.size(mesh_dim)
    return tuple(shape)


def slice_full(full: dict[str, torch.Tensor], entry: KeyEntry, layout: Layout, coords: Coords) -> torch.Tensor:
    """The piece of ``entry`` rank ``coords`` loads, cut from a whole checkpoint (``safe_io.load_full``):
    replays an engine load in one process.  A tensor whose shape is not ``entry.global_shape``
    is returned whole (what a loader handed a misfit sees)."""
    t = full[entry.key]
    if tuple(t.shape) != tuple(entry.global_shape):
        return t
    local = local_shape(entry, layout)
    index = []
    for d, n in enumerate(local):
        off = 0
        for mesh_dim, tdim in entry.placements:
            if tdim == d:
                off = coords.on(mesh_dim) * n
        index.append(slice(off, off + n))
    return t[tuple(index)]


def to_specs(state: LocalState, plan: list[KeyEntry]) -> list[ShardSpec]:
    """Cut a ``LocalState`` into the ``ShardSpec`` of every key of ``plan``."""
    specs = []
    for e in plan:
        if e.vector_index is not None:
            local = state.vectors[e.fc][e.field]
        else:
            t = state.get(e.fc, e.field)
            local = t if e.local_index is None else t[e.local_index]
        specs.append(ShardSpec(e.key, local.contiguous(), e.global_shape, e.mesh_dims, e.placements))
    return specs


def full_vectors(state: LocalState, qf: QuantFormat, index_mode: str = "global") -> LocalState:
    """``state`` of *all* experts with ``vectors`` set from its own buffers (the writer's
    all-gather, done; ``channel_vector``: per-channel amax reduced to one value per expert)."""
    vec: dict[str, dict[str, torch.Tensor]] = {}
    for fc, bufs in state.quant.items():
        for name in vector_fields(qf, index_mode):
            t = bufs[name]
            vec.setdefault(fc, {})[name] = t.reshape(t.shape[0], -1).amax(dim=1) if t.dim() > 1 else t
    return LocalState(state.weights, state.quant, vec)


def template_specs(plan: list[KeyEntry], layout: Layout, dtypes: dict[str, torch.dtype], device: torch.device) -> list[ShardSpec]:
    """Load targets for ``plan``: NaN-filled tensors (a piece a load never writes stays visible).

    ``dtypes`` maps a field (``"weight"`` or a buffer name) to its dtype.
    """
    return [
        ShardSpec(e.key, torch.full(local_shape(e, layout), float("nan"), dtype=dtypes[e.field], device=device), e.global_shape, e.mesh_dims, e.placements)
        for e in plan
    ]


def from_loaded(loaded: dict[str, torch.Tensor], plan: list[KeyEntry], *, allow_size_mismatch: bool = False) -> LocalState:
    """Rebuild the canonical ``LocalState`` from loaded key -> local tensor (inverse of ``to_specs``).

    ``vector_per_key`` entries are sliced (``slice_expert_vector``); with ``allow_size_mismatch``
    a vector of the wrong size leaves a NaN piece and its key in ``LocalState.skipped``.
    """
    parts: dict[tuple[str, str], dict[Optional[int], torch.Tensor]] = {}
    skipped: list[str] = []
    for e in plan:
        if e.key not in loaded:
            raise KeyError(f"loaded state has no key {e.key!r}")
        t = loaded[e.key]
        if e.vector_index is not None:
            piece = slice_expert_vector(e.key, t, e.global_shape[0], e.vector_index, piece_shape=e.piece_shape,
                                        allow_size_mismatch=allow_size_mismatch)
            if piece is None:
                skipped.append(e.key)
                piece = torch.full(e.piece_shape, float("nan"), dtype=t.dtype, device=t.device)
            t = piece
        parts.setdefault((e.fc, e.field), {})[e.local_index] = t
    weights: dict[str, torch.Tensor] = {}
    quant: dict[str, dict[str, torch.Tensor]] = {}
    for (fc, name), by_index in parts.items():
        t = by_index[None] if None in by_index else torch.stack([by_index[i] for i in sorted(by_index)])
        if name == "weight":
            weights[fc] = t
        else:
            quant.setdefault(fc, {})[name] = t
    return LocalState(weights, quant, skipped=skipped)


def field_dtypes(cfg: MoEConfig, qf: QuantFormat) -> dict[str, torch.dtype]:
    """Weights in the model dtype; quantizer buffers fp32 (what calibration returns)."""
    return {"weight": cfg.dtype, **{b.name: torch.float32 for b in qf.buffers}}
