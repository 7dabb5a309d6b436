"""Per-expert quantizer state of the expert model: calibration, the TP sync step, fake quant.

Three quantization formats, each a set of buffers (what a checkpoint stores per expert):

==========================  =========================================================  ===========
format id                   buffers (per expert; ``[out, in]`` weight)                 reference
==========================  =========================================================  ===========
``fp8_e4m3/per_expert``     ``_amax`` ``()``                                           ``fp8_e4m3``
``int8/per_channel``        ``_amax`` ``(out,)``                                       ``int8``
``nvfp4/static``            ``_amax`` ``(out, n_blocks)``, ``_global_amax`` ``()``       ``nvfp4`` ``modelopt_static``
``fp8_e4m3/shared_experts`` as ``fp8_e4m3/per_expert``, one value for all experts      ``fp8_e4m3``
``nvfp4/static_shared_experts`` as ``nvfp4/static``, one state for all experts         ``nvfp4`` ``modelopt_static``
==========================  =========================================================  ===========

``*_shared_experts`` formats (``QuantFormat.experts == "shared"``, Megatron SequentialMLP with
its weight amax synced across experts) take the max over the rank's local experts at
calibration and then run the **EP sync step** (``sync_ep``: all-reduce MAX over the EP group of
``_amax`` *and* ``_global_amax``).  Per-expert formats must never see the EP sync: local expert
``i`` of every EP rank would be merged into one scale (``judge.granularity_verdict`` names the
experts it changes).

Every buffer is max calibration (``reference.max_calibrate``) of the weight over some of its
dims (``REDUCES``).  Under tensor parallelism a rank sees only its slice, so a buffer that
reduces over the TP-split dim is a *partial* max until the **sync step** takes the max over the
TP group (``sync_tp``); one that does not (fc1's per-channel amax, block amax of block-aligned
shards) is split along with the weight and must not be synced.  Forgetting ``_global_amax`` in
the sync (what upstream did before its fix) leaves TP ranks with different NVFP4 global scales.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch
import torch.distributed as dist

from moe_fq_parity.reference import fake_quant, max_calibrate
from moe_fq_parity.reference.constants import NVFP4_BLOCK
from moe_fq_parity.reference.formats import format_spec
from moe_fq_parity.reference.nvfp4 import static_block_scales

from .model import TP_DIM, MoEConfig

GRANULARITIES: tuple[str, ...] = ("per_expert", "per_channel", "per_block", "global")

REDUCES: dict[str, tuple[int, ...]] = {
    "per_expert": (0, 1),
    "per_channel": (1,),
    "per_block": (),
    "global": (0, 1),
}
"""Weight dims (of ``[out, in]``) a buffer's max runs over.  ``per_block`` runs over 16 elements
inside one row, and TP shards hold whole blocks (``MoEConfig.check_layout``), so no whole dim."""


@dataclass(frozen=True)
class Buffer:
    """One quantizer buffer: its state-dict name and granularity."""

    name: str
    granularity: str

    def __post_init__(self) -> None:
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}")


EXPERT_SCOPES: tuple[str, ...] = ("per_expert", "shared")
"""``per_expert``: every expert has its own quantizer state (Model-Optimizer's per-expert grouped
quantizers, plain per-expert modules).  ``shared``: all experts of a layer quantize with one state
(Megatron SequentialMLP with weight amax synced across experts: the max over the rank's local
experts, then an all-reduce MAX over the EP group); stored per expert, every copy equal."""


@dataclass(frozen=True)
class QuantFormat:
    """A format as the checkpoint sees it: reference format, variant, buffers, expert scope."""

    id: str
    fmt: str
    buffers: tuple[Buffer, ...]
    variant: Optional[str] = None
    experts: str = "per_expert"

    def __post_init__(self) -> None:
        if self.experts not in EXPERT_SCOPES:
            raise ValueError(f"experts must be one of {EXPERT_SCOPES}, got {self.experts!r}")

    @property
    def block_scaled(self) -> bool:
        """Two-level block scaling (``FormatSpec.block``, NVFP4): a global amax above per-block amax,
        from which the block scales derive."""
        return format_spec(self.fmt).block is not None

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(f"{self.id} has no buffer {name!r}; it has {[b.name for b in self.buffers]}")


QUANT_FORMATS: dict[str, QuantFormat] = {
    q.id: q
    for q in (
        QuantFormat("fp8_e4m3/per_expert", "fp8_e4m3", (Buffer("_amax", "per_expert"),)),
        QuantFormat("int8/per_channel", "int8", (Buffer("_amax", "per_channel"),)),
        QuantFormat("nvfp4/static", "nvfp4", (Buffer("_amax", "per_block"), Buffer("_global_amax", "global")), "modelopt_static"),
        QuantFormat("fp8_e4m3/shared_experts", "fp8_e4m3", (Buffer("_amax", "per_expert"),), experts="shared"),
        QuantFormat("nvfp4/static_shared_experts", "nvfp4", (Buffer("_amax", "per_block"), Buffer("_global_amax", "global")),
                    "modelopt_static", experts="shared"),
    )
}


def quant_format(qf_id: str) -> QuantFormat:
    """Look up a format id, with an error listing the known ones."""
    if qf_id not in QUANT_FORMATS:
        raise ValueError(f"unknown quant format {qf_id!r}; known: {sorted(QUANT_FORMATS)}")
    return QUANT_FORMATS[qf_id]


def buffer_shape(cfg: MoEConfig, fc: str, granularity: str) -> tuple[int, ...]:
    """Per-expert shape of a buffer of the full (unsplit) ``fc`` weight."""
    out, inp = cfg.fc_shape(fc)
    if granularity in ("per_expert", "global"):
        return ()
    if granularity == "per_channel":
        return (out,)
    if granularity == "per_block":
        return (out, -(-inp // NVFP4_BLOCK))
    raise ValueError(f"unknown granularity {granularity!r}")


def buffer_tp_axis(fc: str, granularity: str) -> Optional[int]:
    """Axis of the per-expert buffer that TP splits, or ``None`` (replicated on the TP group).

    Buffer axes follow the weight's: ``per_channel`` ``(out,)``, ``per_block`` ``(out, blocks)``.
    """
    d = TP_DIM[fc]
    return None if d in REDUCES[granularity] else d


def needs_tp_sync(fc: str, granularity: str) -> bool:
    """True when the buffer reduces over the dim TP splits (a per-rank partial max)."""
    return TP_DIM[fc] in REDUCES[granularity]


def calibrate(w: torch.Tensor, qf: QuantFormat, *, experts: Optional[str] = None) -> dict[str, torch.Tensor]:
    """Local max calibration of ``[n, out, in]`` expert weights: ``{buffer name: [n, ...] fp32}``.

    ``experts`` (default ``qf.experts``): ``shared`` replaces every expert's buffer by the max
    over the ``n`` local experts (the within-rank sync; the EP part is ``sync_ep``).
    """
    by_gran = {
        "per_expert": lambda: max_calibrate(w, "per_expert"),
        "global": lambda: max_calibrate(w, "per_expert"),
        "per_channel": lambda: max_calibrate(w, "per_channel"),
        "per_block": lambda: max_calibrate(w, "per_block"),
    }
    state = {b.name: by_gran[b.granularity]() for b in qf.buffers}
    if (experts or qf.experts) == "shared":
        state = {k: v.amax(dim=0, keepdim=True).expand_as(v).contiguous() for k, v in state.items()}
    return state


def _check_skip(qf: QuantFormat, skip: frozenset[str]) -> None:
    """``ValueError`` when ``skip`` names a buffer ``qf`` does not have (a typo would silently sync all)."""
    unknown = set(skip) - {b.name for b in qf.buffers}
    if unknown:
        raise ValueError(f"skip names buffers {sorted(unknown)} that {qf.id} does not have")


def sync_ep(
    state: dict[str, torch.Tensor], qf: QuantFormat, group: Optional[dist.ProcessGroup], *, skip: frozenset[str] = frozenset()
) -> None:
    """The EP sync step (Megatron SequentialMLP, with ``_global_amax`` as Model-Optimizer's TP/EP
    global-amax fix adds it): all-reduce MAX over the EP ``group`` of every buffer, in place.

    Local expert ``i`` of one EP rank meets local expert ``i`` of every other rank, so this is
    right only for ``shared`` state (every local copy already equal); applied to ``per_expert``
    state it merges different experts' scales (``granularity_violations`` names them).
    ``skip`` names buffers to leave unsynced (negative controls); ``group=None`` (EP=1) does nothing.
    """
    _check_skip(qf, skip)
    if group is None:
        return
    for b in qf.buffers:
        if b.name not in skip:
            dist.all_reduce(state[b.name], op=dist.ReduceOp.MAX, group=group)


def sync_tp(
    state: dict[str, torch.Tensor], fc: str, qf: QuantFormat, group: Optional[dist.ProcessGroup], *, skip: frozenset[str] = frozenset()
) -> None:
    """The sync step: all-reduce MAX over the TP ``group`` of every buffer that needs it, in place.

    ``skip`` names buffers to leave unsynced (the negative control ``{"_global_amax"}``).
    ``group=None`` (TP=1) does nothing.
    """
    _check_skip(qf, skip)
    if group is None:
        return
    for b in qf.buffers:
        if needs_tp_sync(fc, b.granularity) and b.name not in skip:
            dist.all_reduce(state[b.name], op=dist.ReduceOp.MAX, group=group)


def block_scales(block_amax: torch.Tensor, global_amax: torch.Tensor) -> torch.Tensor:
    """NVFP4 static E4M3 block scales (fp32) of ``[n, out, blocks]`` block amax, ``[n]`` global amax.

    Steps 1-6 of ``reference.nvfp4`` ``modelopt_static`` (``reference.nvfp4.static_block_scales``).
    Both sides of the layout invariance check compute them here, so an error in this helper cannot
    make layouts differ; the fake-quantized weights (computed by the reference itself) are compared as well.
    """
    return static_block_scales(block_amax, global_amax.reshape(-1, 1, 1))


def derived(state: dict[str, torch.Tensor], qf: QuantFormat) -> dict[str, torch.Tensor]:
    """Quantization parameters derived from the buffers (block-scaled formats: ``_block_scale``)."""
    if qf.block_scaled:
        return {"_block_scale": block_scales(state["_amax"], state["_global_amax"])}
    return {}


def fake_quant_local(w: torch.Tensor, state: dict[str, torch.Tensor], qf: QuantFormat) -> torch.Tensor:
    """Fake-quantize ``[n, out, in]`` weights with their ``[n, ...]`` buffers (reference only)."""
    if qf.block_scaled:
        return fake_quant(w, state["_global_amax"], qf.fmt, qf.variant, block_amax=state["_amax"])
    return fake_quant(w, state["_amax"], qf.fmt, qf.variant)


def quant_params(w: dict[str, torch.Tensor], state: dict[str, dict[str, torch.Tensor]], qf: QuantFormat) -> dict[str, torch.Tensor]:
    """``"{fc}/{field}"`` -> tensor for every fc: the buffers, ``derived`` parameters and the
    fake-quantized weights (``"fq"``): everything the layout invariance check compares."""
    out = {}
    for fc, w_fc in w.items():
        fields = {**state[fc], **derived(state[fc], qf), "fq": fake_quant_local(w_fc, state[fc], qf)}
        for name, t in fields.items():
            out[f"{fc}/{name}"] = t
    return out
