"""Per-expert quantizer state of the expert model: calibration, the TP sync step, fake quant.

Three quantization formats, each a set of buffers (what a checkpoint stores per expert):

==========================  =========================================================  ===========
format id                   buffers (per expert; ``[out, in]`` weight)                 reference
==========================  =========================================================  ===========
``fp8_e4m3/per_expert``     ``_amax`` ``()``                                           ``fp8_e4m3``
``int8/per_channel``        ``_amax`` ``(out,)``                                       ``int8``
``nvfp4/static``            ``_amax`` ``(out, n_blocks)``, ``_global_amax`` ``()``       ``nvfp4`` ``modelopt_static``
==========================  =========================================================  ===========

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


@dataclass(frozen=True)
class QuantFormat:
    """A format as the checkpoint sees it: reference format, variant, buffers."""

    id: str
    fmt: str
    buffers: tuple[Buffer, ...]
    variant: Optional[str] = None

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


def calibrate(w: torch.Tensor, qf: QuantFormat) -> dict[str, torch.Tensor]:
    """Local max calibration of ``[n, out, in]`` expert weights: ``{buffer name: [n, ...] fp32}``."""
    by_gran = {
        "per_expert": lambda: max_calibrate(w, "per_expert"),
        "global": lambda: max_calibrate(w, "per_expert"),
        "per_channel": lambda: max_calibrate(w, "per_channel"),
        "per_block": lambda: max_calibrate(w, "per_block"),
    }
    return {b.name: by_gran[b.granularity]() for b in qf.buffers}


def sync_tp(
    state: dict[str, torch.Tensor], fc: str, qf: QuantFormat, group: Optional[dist.ProcessGroup], *, skip: frozenset[str] = frozenset()
) -> None:
    """The sync step: all-reduce MAX over the TP ``group`` of every buffer that needs it, in place.

    ``skip`` names buffers to leave unsynced (the negative control ``{"_global_amax"}``).
    ``group=None`` (TP=1) does nothing.
    """
    unknown = set(skip) - {b.name for b in qf.buffers}
    if unknown:
        raise ValueError(f"skip names buffers {sorted(unknown)} that {qf.id} does not have")
    if group is None:
        return
    for b in qf.buffers:
        if needs_tp_sync(fc, b.granularity) and b.name not in skip:
            dist.all_reduce(state[b.name], op=dist.ReduceOp.MAX, group=group)


def block_scales(block_amax: torch.Tensor, global_amax: torch.Tensor) -> torch.Tensor:
    """NVFP4 static E4M3 block scales (fp32) of ``[n, out, blocks]`` block amax, ``[n]`` global amax.

    Steps 1-3 of ``reference.nvfp4`` ``modelopt_static``: ``bs = RN(bamax * RN(1/6))`` quantized
    by the FP8 ``reciprocal`` variant with amax ``RN(g * RN(1/6))``.  Both sides of the layout
    invariance check compute them here, so an error in this helper cannot make layouts differ;
    the fake-quantized weights (computed by the reference itself) are compared as well.
    """
    sixth = torch.reciprocal(torch.tensor(6.0, device=block_amax.device))
    return fake_quant(block_amax.float() * sixth, global_amax.float() * sixth, "fp8_e4m3", "reciprocal")


def derived(state: dict[str, torch.Tensor], qf: QuantFormat) -> dict[str, torch.Tensor]:
    """Quantization parameters derived from the buffers (NVFP4: ``_block_scale``)."""
    if qf.fmt == "nvfp4":
        return {"_block_scale": block_scales(state["_amax"], state["_global_amax"])}
    return {}


def fake_quant_local(w: torch.Tensor, state: dict[str, torch.Tensor], qf: QuantFormat) -> torch.Tensor:
    """Fake-quantize ``[n, out, in]`` weights with their ``[n, ...]`` buffers (reference only)."""
    if qf.fmt == "nvfp4":
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
