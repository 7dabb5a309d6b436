"""What every rank runs: one save job per save layout, one load job per load layout.

Both jobs do many checkpoints per process start (starting ranks costs seconds; a save or load
costs a tenth of one).  They return plain data for ``torch.load(weights_only=True)``:

* ``save_job`` -- builds this rank's experts, calibrates each format locally, runs the TP sync
  step and, for shared-expert formats, the EP sync step; reports the synced quantization
  parameters and fake-quantized weights, then saves every requested checkpoint.  Also reported,
  for the negative controls: a TP sync that skips ``_global_amax`` (TP > 1), shared formats
  without EP sync or without its ``_global_amax`` part, and per-expert formats *with* the EP
  sync (EP > 1);
* ``load_job`` -- for every requested checkpoint, builds the target layout's templates, loads
  through ``engines.load_checked`` and reports each loaded key's local tensor with its offsets
  and the fake-quantized local weights, or the error (class and message) when the load failed.

Nothing is compared on the ranks: the parent process does every check against its own oracles.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from .engines import ENGINES, SaveRefusedError, load_checked
from .launch import RankContext
from .model import FCS, MoEConfig, local_weights
from .quant import calibrate, fake_quant_local, quant_format, quant_params, sync_ep, sync_tp
from .safe_io import CheckpointError
from .shards import LocalState, expected_entries, field_dtypes, from_loaded, full_vectors, key_plan, template_specs, to_specs, tolerated_entries

NO_GLOBAL_SYNC = "no_global_sync"
"""Key of the negative-control calibration (sync forgets ``_global_amax``) in a save result."""
NO_EP_SYNC = "no_ep_sync"
"""Shared-expert formats under EP > 1: the EP sync step left out entirely (negative control)."""
NO_EP_GLOBAL_SYNC = "no_ep_global_amax_sync"
"""Shared-expert NVFP4 under EP > 1: the EP sync of ``_amax`` without ``_global_amax`` (the state
before Model-Optimizer's TP/EP global-amax fix; negative control)."""
EP_SYNC_ON_PER_EXPERT = "ep_sync_on_per_expert"
"""Per-expert formats under EP > 1: the EP all-reduce applied anyway (the cross-change hazard)."""


@dataclass(frozen=True)
class CkptTask:
    """One checkpoint to save or load: where, in which key layout, of which model and format.

    For a load, ``cfg``, ``qlayout``, ``qf_id`` and ``index_mode`` describe the *target* (a
    ``"local"`` reader expects the keys a local-index writer produces under the reader's layout).
    """

    ckpt_id: str
    path: str
    qlayout: str
    qf_id: str
    index_mode: str = "global"
    cfg: MoEConfig = field(default_factory=MoEConfig)


@dataclass(frozen=True)
class SavePayload:
    seed: int
    cfg: MoEConfig
    engine: str
    qf_ids: tuple[str, ...]
    tasks: tuple[CkptTask, ...]


@dataclass(frozen=True)
class LoadPayload:
    seed: int
    engine: str
    tasks: tuple[CkptTask, ...]


def _cpu(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu() for k, v in tensors.items()}


def save_job(ctx: RankContext, p: SavePayload) -> dict:
    """Calibrate, sync, report and save (see the module docstring)."""
    w = {fc: local_weights(p.cfg, p.seed, ctx.layout, ctx.coords, fc).to(ctx.device) for fc in FCS}
    tp_group, ep_group = ctx.group("tp"), ctx.group("ep")
    calib: dict[str, dict[str, dict[str, torch.Tensor]]] = {}
    states: dict[str, dict[str, dict[str, torch.Tensor]]] = {}

    def run_sync(qf, *, tp_skip=frozenset(), ep: bool, ep_skip=frozenset()) -> dict[str, dict[str, torch.Tensor]]:
        st = {fc: calibrate(w[fc], qf) for fc in FCS}
        for fc in FCS:
            sync_tp(st[fc], fc, qf, tp_group, skip=tp_skip)
            if ep:
                sync_ep(st[fc], qf, ep_group, skip=ep_skip)
        return st

    for qf_id in p.qf_ids:
        qf = quant_format(qf_id)
        shared = qf.experts == "shared"
        synced = run_sync(qf, ep=shared)
        states[qf_id] = synced
        calib[qf_id] = {"synced": _cpu(quant_params(w, synced, qf))}
        has_global = any(b.name == "_global_amax" for b in qf.buffers)
        if has_global and ctx.layout.tp > 1:
            calib[qf_id][NO_GLOBAL_SYNC] = _cpu(quant_params(w, run_sync(qf, tp_skip=frozenset({"_global_amax"}), ep=shared), qf))
        if ctx.layout.ep > 1 and shared:
            calib[qf_id][NO_EP_SYNC] = _cpu(quant_params(w, run_sync(qf, ep=False), qf))
            if has_global:
                calib[qf_id][NO_EP_GLOBAL_SYNC] = _cpu(quant_params(w, run_sync(qf, ep=True, ep_skip=frozenset({"_global_amax"})), qf))
        if ctx.layout.ep > 1 and not shared:
            calib[qf_id][EP_SYNC_ON_PER_EXPERT] = _cpu(quant_params(w, run_sync(qf, ep=True), qf))
    engine = ENGINES[p.engine]
    save_errors: dict[str, str] = {}
    for task in p.tasks:
        qf = quant_format(task.qf_id)
        plan = key_plan(p.cfg, ctx.layout, ctx.coords, task.qlayout, qf, task.index_mode)
        state = LocalState(w, states[task.qf_id])
        if task.qlayout == "vector_per_key":
            state = _gather_vectors(ctx, state, qf, task.index_mode)
        try:
            engine.save(to_specs(state, plan), task.path, ctx)
        except SaveRefusedError as exc:
            save_errors[task.ckpt_id] = f"{type(exc).__name__}: {str(exc)[:600]}"
    return {"coords": [ctx.coords.ep, ctx.coords.tp], "calib": calib, "save_errors": save_errors}




def _gather_vectors(ctx: RankContext, state: LocalState, qf, index_mode: str) -> LocalState:
    """The ``vector_per_key`` writer: each vector buffer's ``[n_local]`` values all-gathered over
    the EP group (in EP-rank order) into the ``[E]`` vector every rank writes."""
    local = full_vectors(state, qf, index_mode)
    group = ctx.group("ep")
    if group is None:
        return local
    vectors: dict[str, dict[str, torch.Tensor]] = {}
    for fc, bufs in local.vectors.items():
        for name, t in bufs.items():
            parts = [torch.empty_like(t) for _ in range(ctx.layout.ep)]
            dist.all_gather(parts, t.contiguous(), group=group)
            vectors.setdefault(fc, {})[name] = torch.cat(parts)
    return LocalState(state.weights, state.quant, vectors)


def _load_one(ctx: RankContext, task: CkptTask, engine_name: str) -> dict:
    qf = quant_format(task.qf_id)
    plan = key_plan(task.cfg, ctx.layout, ctx.coords, task.qlayout, qf, task.index_mode)
    dtypes = field_dtypes(task.cfg, qf)
    specs = template_specs(plan, ctx.layout, dtypes, ctx.device)
    expected = expected_entries(task.cfg, ctx.layout, task.qlayout, qf, task.index_mode)
    tolerated = tolerated_entries(task.cfg, ctx.layout, task.qlayout, qf)
    loaded = load_checked(ENGINES[engine_name], specs, expected, task.path, ctx, tolerated)
    raw = {s.key: {"offsets": list(s.offsets(ctx.coords)), "local": loaded[s.key].detach().cpu()} for s in specs}
    out: dict = {"ok": True, "raw": raw}
    try:
        state = from_loaded(loaded, plan)
        out["fq"] = _cpu({fc: fake_quant_local(state.weights[fc], state.quant[fc], qf) for fc in FCS})
    except (ValueError, TypeError) as exc:  # e.g. a NaN amax left by a piece never loaded
        out["fq_error"] = f"{type(exc).__name__}: {exc}"
    return out


def load_job(ctx: RankContext, p: LoadPayload) -> dict:
    """Load every task's checkpoint into this layout; report pieces or errors (see the module docstring)."""
    results: dict[str, dict] = {}
    for task in p.tasks:
        try:
            results[task.ckpt_id] = _load_one(ctx, task, p.engine)
        except (CheckpointError, ValueError) as exc:
            # CheckpointError: raised on every rank alike by load_checked / the engine.
            # ValueError: the target model does not fit this layout (raised before any collective).
            results[task.ckpt_id] = {"ok": False, "error": type(exc).__name__, "message": str(exc)}
    return {"coords": [ctx.coords.ep, ctx.coords.tp], "results": results}
