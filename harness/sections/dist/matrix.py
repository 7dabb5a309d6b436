"""The round-trip matrix: save under every layout, load under every layout, judge every pair.

``run_plan(plan, workdir)`` runs, in order:

1. **truth** -- the model at TP=1/EP=1 in this process (``oracle.build_truth``);
2. **save** -- one ``run_ranks(save_job)`` per save layout: calibrate + sync, report parameters
   (-> ``invariance/{layout}/{format}`` rows, and for NVFP4 under TP>1 the negative control
   ``negative/no_global_amax_sync/{layout}``), save one checkpoint per (quantizer layout,
   format), plus local-index checkpoints under EP>1 (negative control);
3. **content** -- each checkpoint loaded whole by this process (``safe_io.load_full``), compared
   with the truth (``content/{ckpt}``; ``negative/local_index/content/{ckpt}``; and
   ``negative/payload_bitflip/content/{ckpt}``: one flipped bit in a stored weight, which DCP
   loads without complaint);
4. **bad inputs** -- checkpoints that must not load (``bad_inputs``);
5. **load** -- one ``run_ranks(load_job)`` per load layout, loading every checkpoint of every
   save layout (``roundtrip/{save}->{load}/{qlayout}/{format}``), the local-index checkpoints of
   the same layout with the local-index reader (``negative/local_index/{save}->{load}/...``),
   and every bad input (``bad_input/{kind}/{load}``).

A save or load layout whose ranks fail or hang gives ``fail`` rows for what it would have
checked, with the reason; the other layouts still run.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Iterator, Optional

import torch

from .bad_inputs import BadCase, flip_payload_bit, make_bad_cases
from .checks import Verdict, negative_control
from .engines import ENGINES
from .jobs import EP_SYNC_ON_PER_EXPERT, NO_EP_GLOBAL_SYNC, NO_EP_SYNC, NO_GLOBAL_SYNC, CkptTask, LoadPayload, SavePayload, load_job, save_job
from .judge import bad_input_verdict, granularity_verdict, invariance_verdict, roundtrip_verdict
from .launch import DEFAULT_TIMEOUT_S, RankFailure, RankTimeout, run_ranks
from .layout import Coords, Layout
from .model import MoEConfig
from .oracle import Truth, build_truth, content_verdict, truth_entries
from .quant import QUANT_FORMATS, quant_format
from .safe_io import CheckpointError, load_full
from .shards import QLAYOUTS

NEGATIVE_FORMATS: tuple[str, ...] = ("fp8_e4m3/per_expert", "nvfp4/static")
"""Formats the local-index negative control is written in (the bug is in keys, not formats)."""


@dataclass(frozen=True)
class DistPlan:
    """What to run: the seed and the layouts positionally, everything else by keyword; checked up
    front (``validate``) with an error naming each bad argument.

    * ``device``: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, one GPU per rank);
    * ``engine``: a key of ``engines.ENGINES``;
    * ``cfg``: the expert model; ``qlayouts``/``qf_ids``: quantizer layouts and formats;
    * ``negative_controls``: also write the local-index checkpoints, the unsynced NVFP4 global
      amax and the bit-flipped copy, and check that each is caught;
    * ``bad_inputs``: also load the checkpoints of ``bad_inputs`` under every load layout;
    * ``timeout_s``: wall-clock limit of each ``run_ranks`` call.
    """

    seed: int
    save_layouts: tuple[Layout, ...]
    load_layouts: tuple[Layout, ...]
    _: KW_ONLY
    device: str = "cpu"
    engine: str = "dcp"
    cfg: MoEConfig = field(default_factory=MoEConfig)
    qlayouts: tuple[str, ...] = QLAYOUTS
    qf_ids: tuple[str, ...] = tuple(QUANT_FORMATS)
    negative_controls: bool = True
    bad_inputs: bool = True
    timeout_s: float = DEFAULT_TIMEOUT_S

    def validate(self) -> None:
        problems = []
        if self.device not in ("cpu", "cuda"):
            problems.append(f"device={self.device!r} (cpu or cuda)")
        if self.engine not in ENGINES:
            problems.append(f"engine={self.engine!r} (known: {sorted(ENGINES)})")
        problems += [f"qlayouts has {q!r} (known: {QLAYOUTS})" for q in self.qlayouts if q not in QLAYOUTS]
        problems += [f"qf_ids has {q!r} (known: {sorted(QUANT_FORMATS)})" for q in self.qf_ids if q not in QUANT_FORMATS]
        if not self.save_layouts or not self.load_layouts:
            problems.append("save_layouts and load_layouts must not be empty")
        for lay in set(self.save_layouts) | set(self.load_layouts):
            try:
                self.cfg.check_layout(lay)
            except ValueError as exc:
                problems.append(str(exc))
        if problems:
            raise ValueError("invalid DistPlan: " + "; ".join(problems))


@dataclass
class _Saved:
    """A checkpoint written by the save stage."""

    task: CkptTask
    layout: Layout
    oracle: Optional[dict[str, torch.Tensor]] = None


def _ckpt_dir(workdir: str, ckpt_id: str) -> str:
    return os.path.join(workdir, "ckpt", re.sub(r"[^A-Za-z0-9_.-]+", "-", ckpt_id))


def _save_tasks(plan: DistPlan, lay: Layout, workdir: str) -> tuple[list[CkptTask], list[CkptTask]]:
    good, neg = [], []
    for ql in plan.qlayouts:
        for qf in plan.qf_ids:
            cid = f"{lay.id}/{ql}/{qf}"
            good.append(CkptTask(cid, _ckpt_dir(workdir, cid), ql, qf, "global", plan.cfg))
            if plan.negative_controls and lay.ep > 1 and qf in NEGATIVE_FORMATS:
                nid = f"{cid}/local_index"
                neg.append(CkptTask(nid, _ckpt_dir(workdir, nid), ql, qf, "local", plan.cfg))
    for t in good + neg:
        os.makedirs(t.path, exist_ok=True)
    return good, neg


def _stage_save(plan: DistPlan, lay: Layout, truth: Truth, workdir: str, out: list[Verdict]) -> list[_Saved]:
    good, neg = _save_tasks(plan, lay, workdir)
    payload = SavePayload(plan.seed, plan.cfg, plan.engine, plan.qf_ids, tuple(good + neg))
    try:
        ranks = run_ranks(save_job, payload, lay, device=plan.device, workdir=workdir, timeout_s=plan.timeout_s)
    except (RankFailure, RankTimeout) as exc:
        out.append(Verdict(f"save/{lay.id}", "fail", {"save": lay.id, "engine": plan.engine}, f"save ranks failed: {exc}"))
        return []
    for qf in plan.qf_ids:
        fields = {"save": lay.id, "format": qf, "engine": plan.engine}
        out.append(invariance_verdict(f"invariance/{lay.id}/{qf}", fields, ranks, qf, "synced", lay, truth))
        if quant_format(qf).experts == "per_expert":
            out.append(granularity_verdict(f"granularity/{lay.id}/{qf}", fields, ranks, qf, "synced", lay, truth))
        if not plan.negative_controls:
            continue
        calib = ranks[0]["calib"][qf]
        if NO_GLOBAL_SYNC in calib:
            inner = invariance_verdict(f"invariance/{lay.id}/{qf}/{NO_GLOBAL_SYNC}", fields, ranks, qf, NO_GLOBAL_SYNC, lay, truth)
            out.append(negative_control(f"negative/no_global_amax_sync/{lay.id}/{qf}", inner, "a TP sync that skips _global_amax"))
        for which, what in ((NO_EP_SYNC, "shared expert amax without the EP sync"),
                            (NO_EP_GLOBAL_SYNC, "an EP sync of shared expert amax that skips _global_amax")):
            if which in calib:
                inner = invariance_verdict(f"invariance/{lay.id}/{qf}/{which}", fields, ranks, qf, which, lay, truth)
                out.append(negative_control(f"negative/{which}/{lay.id}/{qf}", inner, what))
        if EP_SYNC_ON_PER_EXPERT in calib:
            inner = granularity_verdict(f"granularity/{lay.id}/{qf}/{EP_SYNC_ON_PER_EXPERT}", fields, ranks, qf, EP_SYNC_ON_PER_EXPERT, lay, truth)
            out.append(negative_control(f"hazard/{EP_SYNC_ON_PER_EXPERT}/{lay.id}/{qf}", inner, "an EP all-reduce of per-expert quantizer state"))
    return [_Saved(t, lay) for t in good + neg]


def _stage_content(saved: list[_Saved], truth: Truth, out: list[Verdict]) -> None:
    for s in saved:
        fields = {"save": s.layout.id, "qlayout": s.task.qlayout, "format": s.task.qf_id, "index": s.task.index_mode}
        try:
            s.oracle = load_full(s.task.path)
        except CheckpointError as exc:
            out.append(Verdict(f"content/{s.task.ckpt_id}", "fail", fields, f"single-process load failed: {exc}"))
            continue
        inner = content_verdict(f"content/{s.task.ckpt_id}", fields, s.oracle, truth_entries(truth, s.task.qlayout, s.task.qf_id))
        if s.task.index_mode == "local":
            out.append(negative_control(f"negative/local_index/content/{s.task.ckpt_id}", inner, "amax keyed by local expert index"))
        else:
            out.append(inner)


def _payload_bitflip(saved: list[_Saved], truth: Truth, workdir: str, out: list[Verdict]) -> None:
    """Negative control: one flipped bit in a weight's stored bytes loads silently (DCP has no
    checksums); the content check must see it."""
    src = next((s for s in saved if s.task.index_mode == "global" and s.oracle is not None), None)
    if src is None:
        return
    needle = truth.weights["fc1"][0, 0].contiguous().view(torch.int16).numpy().tobytes()
    fields = {"save": src.layout.id, "qlayout": src.task.qlayout, "format": src.task.qf_id}
    check_id = f"negative/payload_bitflip/content/{src.task.ckpt_id}"
    try:
        flipped = load_full(flip_payload_bit(src.task.path, os.path.join(workdir, "bitflip"), needle))
    except (CheckpointError, ValueError) as exc:
        out.append(Verdict(check_id, "fail", fields, f"could not build the flipped checkpoint: {exc}"))
        return
    inner = content_verdict(check_id, fields, flipped, truth_entries(truth, src.task.qlayout, src.task.qf_id))
    out.append(negative_control(check_id, inner, "one flipped bit in a stored weight"))


def _load_tasks(saved: list[_Saved], lay: Layout, bad: list[BadCase]) -> list[CkptTask]:
    tasks = [s.task for s in saved if s.task.index_mode == "global"]
    tasks += [s.task for s in saved if s.task.index_mode == "local" and s.layout == lay]
    return tasks + [b.task for b in bad]


def _stage_load(plan: DistPlan, lay: Layout, saved: list[_Saved], bad: list[BadCase], truth: Truth, workdir: str, out: list[Verdict]) -> None:
    tasks = _load_tasks(saved, lay, bad)
    try:
        ranks = run_ranks(load_job, LoadPayload(plan.seed, plan.engine, tuple(tasks)), lay, device=plan.device, workdir=workdir, timeout_s=plan.timeout_s)
    except (RankFailure, RankTimeout) as exc:
        out.append(Verdict(f"load/{lay.id}", "fail", {"load": lay.id, "engine": plan.engine}, f"load ranks failed: {exc}"))
        return
    coords = [Coords(*r["coords"]) for r in ranks]
    for s in saved:
        t = s.task
        if t.index_mode == "local" and s.layout != lay:
            continue
        results = [r["results"][t.ckpt_id] for r in ranks]
        base = f"{s.layout.id}->{lay.id}/{t.qlayout}/{t.qf_id}"
        fields = {"save": s.layout.id, "load": lay.id, "qlayout": t.qlayout, "format": t.qf_id, "engine": plan.engine}
        verdict = roundtrip_verdict(f"roundtrip/{base}", fields, results, coords, s.oracle, truth, lay, t.qlayout, t.qf_id, t.index_mode)
        if t.index_mode == "local":
            verdict = negative_control(f"negative/local_index/{base}", verdict, "amax keyed by local expert index")
        out.append(verdict)
    for b in bad:
        results = [r["results"][b.task.ckpt_id] for r in ranks]
        fields = {"load": lay.id, "qlayout": b.task.qlayout, "format": b.task.qf_id, "engine": plan.engine}
        out.append(bad_input_verdict(f"bad_input/{b.kind}/{lay.id}", fields, results, b.error, b.must_mention))


@contextmanager
def one_thread() -> Iterator[None]:
    """Run this process's torch ops on one intra-op thread, then restore the setting.

    The judging is many tiny tensor ops; with 2 threads, ``torch.round`` on a few thousand
    elements took 12 ms instead of 8 us on a 2-core machine (torch 2.13 CPU).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_plan(plan: DistPlan, workdir: str) -> list[Verdict]:
    """Run every stage of ``plan`` under ``workdir`` (checkpoints, rank results); see module doc."""
    with one_thread():
        return _run_plan(plan, workdir)


def _run_plan(plan: DistPlan, workdir: str) -> list[Verdict]:
    plan.validate()
    os.makedirs(workdir, exist_ok=True)
    available, why = ENGINES[plan.engine].available(plan.device)
    if not available:
        return [Verdict(f"engine/{plan.engine}", "skip", {"engine": plan.engine}, why)]
    truth = build_truth(plan.cfg, plan.seed, plan.qf_ids)
    out: list[Verdict] = []
    saved: list[_Saved] = []
    for lay in plan.save_layouts:
        saved += _stage_save(plan, lay, truth, workdir, out)
    _stage_content(saved, truth, out)
    if plan.negative_controls:
        _payload_bitflip(saved, truth, workdir, out)
    bad: list[BadCase] = []
    if plan.bad_inputs:
        good = {(s.task.qlayout, s.task.qf_id): s.task.path for s in reversed(saved) if s.task.index_mode == "global" and s.oracle is not None}
        bad = make_bad_cases(os.path.join(workdir, "bad"), plan.cfg, plan.seed, good)
    for lay in plan.load_layouts:
        _stage_load(plan, lay, saved, bad, truth, workdir, out)
    return out
