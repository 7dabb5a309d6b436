"""The round-trip matrix: save under every layout, load under every layout, judge every pair.

``run_plan(plan, workdir)`` runs, in order:

1. **truth** -- the model at TP=1/EP=1 in this process (``oracle.build_truth``);
2. **save** -- one ``run_ranks(save_job)`` per save layout (``run_layouts``: several at once where
   the CPUs allow): calibrate + sync, report parameters
   (-> ``invariance/{layout}/{format}`` rows, and for NVFP4 under TP>1 the negative control
   ``negative/no_global_amax_sync/{layout}``), save one checkpoint per (quantizer layout,
   format), plus local-index checkpoints under EP>1 (negative control);
3. **content** -- each checkpoint loaded whole by this process (``safe_io.load_full``), compared
   with the truth (``content/{ckpt}``; ``negative/local_index/content/{ckpt}``; and
   ``negative/payload_bitflip/content/{ckpt}``: one flipped bit in a stored weight, which DCP
   loads without complaint);
4. **bad inputs** -- checkpoints that must not load (``bad_inputs``);
5. **load** -- one ``run_ranks(load_job)`` per load layout (likewise), loading every checkpoint of every
   save layout (``roundtrip/{save}->{load}/{qlayout}/{format}``), the local-index checkpoints of
   the same layout with the local-index reader (``negative/local_index/{save}->{load}/...``),
   and every bad input (``bad_input/{kind}/{load}``).

A save or load layout whose ranks fail or hang gives ``fail`` rows for what it would have
checked, with the reason; the other layouts still run.

``run_plan_blocks(plan, workdir, part)`` gives the rows in keyed blocks and runs only ``part``'s
share of the work: the save layouts are cut into parts (``Part.owned``, weighted by world size) and
a part saves under its layouts, reads its checkpoints back whole, and loads them under every load
layout; the part that saves the first layout (the "keeper") also runs what reads that layout's
checkpoints (the wrong-size vector and bit-flip controls, the bad inputs, the global-rank loader).
So no work is repeated across parts but building the truth (well under a second).  Keys, sorted
into the order of an unsplit run: ``(0, 0, i)`` the save rows of save layout ``i``, ``(0, 1, i)`` its
content rows, ``(0, 2)`` the keeper's controls, ``(1, j, 0, i)`` the round trips of save layout
``i``'s checkpoints under load layout ``j``, ``(1, j, 1)`` the global-rank control and ``(1, j, 2)``
the bad inputs under ``j``.  A load layout whose ranks fail gives one ``fail`` row per part (ids
prefixed ``part{i}of{n}/`` when split).  Split, the keeper's controls read the first layout's
checkpoints only: where that save failed, an unsplit run would fall back to a later layout's.
"""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from dataclasses import KW_ONLY, dataclass, field
from typing import Iterator, Optional, Union

import torch

from moe_fq_parity.harness.sections import BlockKey, Part, SectionRow

from .bad_inputs import BadCase, flip_payload_bit, make_bad_cases
from .checks import Verdict, negative_control, verdict_from_diffs
from .engines import ENGINES
from .jobs import EP_SYNC_ON_PER_EXPERT, NO_EP_GLOBAL_SYNC, NO_EP_SYNC, NO_GLOBAL_SYNC, CkptTask, LoadPayload, SavePayload, load_job, save_job
from .judge import bad_input_verdict, canonical_diffs, granularity_verdict, invariance_verdict, roundtrip_verdict
from .launch import DEFAULT_TIMEOUT_S, run_layouts
from .layout import Coords, Layout
from .model import FCS, MoEConfig
from .oracle import Truth, build_truth, content_verdict, truth_entries
from .quant import QUANT_FORMATS, quant_format
from .safe_io import CheckpointError, load_full
from .shards import QLAYOUTS, from_loaded, key_plan, qlayout_applies, slice_full, vector_fields

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


NEGATIVE_WRITERS: dict[str, tuple[str, str]] = {
    "local": ("local_index", "amax keyed by local expert index"),
    "channel_vector": ("vector_channel", "per-channel amax forced into the [N_global] vector"),
}
"""Buggy writers: index mode -> (row name, what the bug is)."""


def _writes_channel_vector(qf_id: str) -> bool:
    return any(b.granularity == "per_channel" for b in quant_format(qf_id).buffers)


def _save_tasks(plan: DistPlan, lay: Layout, workdir: str) -> tuple[list[CkptTask], list[CkptTask]]:
    good, neg = [], []
    for ql in plan.qlayouts:
        for qf in plan.qf_ids:
            cid = f"{lay.id}/{ql}/{qf}"
            if plan.negative_controls and ql == "vector_per_key" and _writes_channel_vector(qf):
                nid = f"{cid}/vector_channel"
                neg.append(CkptTask(nid, _ckpt_dir(workdir, nid), ql, qf, "channel_vector", plan.cfg))
            if not qlayout_applies(ql, quant_format(qf)):
                continue
            good.append(CkptTask(cid, _ckpt_dir(workdir, cid), ql, qf, "global", plan.cfg))
            if plan.negative_controls and lay.ep > 1 and qf in NEGATIVE_FORMATS and ql != "vector_per_key":
                nid = f"{cid}/local_index"
                neg.append(CkptTask(nid, _ckpt_dir(workdir, nid), ql, qf, "local", plan.cfg))
    for t in good + neg:
        os.makedirs(t.path, exist_ok=True)
    return good, neg


def _stage_save(plan: DistPlan, truth: Truth, workdir: str, layouts: list[Layout]) -> list[tuple[list[SectionRow], list[_Saved]]]:
    """The ranks of each of ``layouts`` (``run_layouts``: at once where the CPUs allow), then each
    layout's rows and checkpoints, in layout order."""
    tasks = [_save_tasks(plan, lay, workdir) for lay in layouts]
    calls = [(save_job, SavePayload(plan.seed, plan.cfg, plan.engine, plan.qf_ids, tuple(good + neg)), lay)
             for lay, (good, neg) in zip(layouts, tasks)]
    runs = run_layouts(calls, device=plan.device, workdir=workdir, timeout_s=plan.timeout_s)
    out: list[tuple[list[SectionRow], list[_Saved]]] = []
    for lay, (good, neg), ranks in zip(layouts, tasks, runs):
        rows: list[SectionRow] = []
        out.append((rows, _judge_save(plan, lay, good, neg, ranks, truth, rows)))
    return out


def _judge_save(plan: DistPlan, lay: Layout, good: list[CkptTask], neg: list[CkptTask], ranks: Union[list[dict], Exception], truth: Truth,
                out: list[SectionRow]) -> list[_Saved]:
    if isinstance(ranks, Exception):
        out.append(Verdict(f"save/{lay.id}", "fail", {"save": lay.id, "engine": plan.engine}, f"save ranks failed: {ranks}"))
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
    errors = {k: v for r in ranks for k, v in r.get("save_errors", {}).items()}
    kept = []
    for t in good + neg:
        if t.ckpt_id not in errors:
            kept.append(_Saved(t, lay))
            continue
        fields = {"save": lay.id, "qlayout": t.qlayout, "format": t.qf_id, "index": t.index_mode, "engine": plan.engine}
        inner = Verdict(f"save/{t.ckpt_id}", "fail", fields, f"the engine refused to save it: {errors[t.ckpt_id]}")
        if t.index_mode in NEGATIVE_WRITERS:
            name, what = NEGATIVE_WRITERS[t.index_mode]
            out.append(negative_control(f"negative/{name}/save/{t.ckpt_id}", inner, what))
        else:
            out.append(inner)
    return kept


def _stage_content(saved: list[_Saved], truth: Truth, out: list[SectionRow], internal: tuple[str, ...]) -> None:
    for s in saved:
        fields = {"save": s.layout.id, "qlayout": s.task.qlayout, "format": s.task.qf_id, "index": s.task.index_mode}
        try:
            s.oracle = load_full(s.task.path, internal)
        except CheckpointError as exc:
            out.append(Verdict(f"content/{s.task.ckpt_id}", "fail", fields, f"single-process load failed: {exc}"))
            continue
        inner = content_verdict(f"content/{s.task.ckpt_id}", fields, s.oracle, truth_entries(truth, s.task.qlayout, s.task.qf_id, layout=s.layout))
        if s.task.index_mode in NEGATIVE_WRITERS:
            name, what = NEGATIVE_WRITERS[s.task.index_mode]
            out.append(negative_control(f"negative/{name}/content/{s.task.ckpt_id}", inner, what))
        else:
            out.append(inner)


def _vector_size_rows(saved: list[_Saved], truth: Truth, out: list[Verdict]) -> None:
    """The ``[N_global]``-vector loader on a vector of the wrong size (single process, every
    rank of the writer's layout): refused with a clear error by default; skipped and *reported*
    when the user opts in; and, as a negative control, a loader that skips silently leaves the
    expert uncalibrated, which the state check against the truth catches."""
    done: set[str] = set()
    for s in saved:
        t = s.task
        if t.qlayout != "vector_per_key" or t.index_mode != "global" or s.oracle is None or t.qf_id in done:
            continue
        done.add(t.qf_id)
        qf = quant_format(t.qf_id)
        if not vector_fields(qf):
            continue
        key = next(e.key for e in key_plan(truth.cfg, s.layout, Coords(0, 0), t.qlayout, qf) if e.vector_index is not None)
        short = {**s.oracle, key: s.oracle[key][:-1].clone()}
        fields = {"save": s.layout.id, "qlayout": t.qlayout, "format": t.qf_id}
        plans = [(c, key_plan(truth.cfg, s.layout, c, t.qlayout, qf)) for _, c in s.layout.all_coords()]
        try:
            for c, p in plans:
                from_loaded({e.key: slice_full(short, e, s.layout, c) for e in p}, p)
            out.append(Verdict(f"vector_size/refused/{t.ckpt_id}", "fail", fields,
                               f"a ({truth.cfg.num_experts - 1},) vector under {key!r} loaded without an error"))
        except ValueError as exc:
            ok = key in str(exc) and f"({truth.cfg.num_experts},)" in str(exc)
            out.append(Verdict(f"vector_size/refused/{t.ckpt_id}", "pass" if ok else "fail", fields, f"refused: {exc}"))
        states = [(c, from_loaded({e.key: slice_full(short, e, s.layout, c) for e in p}, p, allow_size_mismatch=True)) for c, p in plans]
        skipped = sorted({k for _, st in states for k in st.skipped})
        ok = skipped == [key]
        out.append(Verdict(f"vector_size/opt_in_skip/{t.ckpt_id}", "pass" if ok else "fail", {**fields, "skipped": skipped},
                           f"opted in: skipped and reported {skipped}" if ok else f"expected exactly [{key!r}] reported as skipped, got {skipped}"))
        named = [(c, {**{f"{fc}/weight": st.weights[fc] for fc in FCS}, **{f"{fc}/{b}": v for fc in FCS for b, v in st.quant[fc].items()}})
                 for c, st in states]
        inner = verdict_from_diffs(f"negative/vector_silent_skip/{t.ckpt_id}", fields,
                                   canonical_diffs("state:", named, truth.params[t.qf_id], s.layout, qf, truth.cfg.num_experts))
        out.append(negative_control(f"negative/vector_silent_skip/{t.ckpt_id}", inner, "a loader that skips a wrong-size vector silently"))


def _payload_bitflip(saved: list[_Saved], truth: Truth, workdir: str, out: list[Verdict], internal: tuple[str, ...]) -> None:
    """Negative control: one flipped bit in a weight's stored bytes loads silently (DCP has no
    checksums); the content check must see it."""
    src = next((s for s in saved if s.task.index_mode == "global" and s.oracle is not None), None)
    if src is None:
        return
    needle = truth.weights["fc1"][0, 0].contiguous().view(torch.int16).numpy().tobytes()
    fields = {"save": src.layout.id, "qlayout": src.task.qlayout, "format": src.task.qf_id}
    check_id = f"negative/payload_bitflip/content/{src.task.ckpt_id}"
    try:
        flipped = load_full(flip_payload_bit(src.task.path, os.path.join(workdir, "bitflip"), needle), internal)
    except (CheckpointError, ValueError) as exc:
        out.append(Verdict(check_id, "fail", fields, f"could not build the flipped checkpoint: {exc}"))
        return
    inner = content_verdict(check_id, fields, flipped, truth_entries(truth, src.task.qlayout, src.task.qf_id, layout=src.layout))
    out.append(negative_control(check_id, inner, "one flipped bit in a stored weight"))


def _global_rank_tasks(plan: DistPlan, saved: list[_Saved], lay: Layout) -> list[tuple[_Saved, CkptTask]]:
    """Negative control under TP > 1: the first save layout's ``vector_per_key`` checkpoints read
    by a loader that slices the vector at the global rank instead of the EP rank."""
    if not plan.negative_controls or lay.tp == 1:
        return []
    first = plan.save_layouts[0]
    return [(s, CkptTask(f"{s.task.ckpt_id}/global_rank", s.task.path, s.task.qlayout, s.task.qf_id, "global_rank", s.task.cfg))
            for s in saved if s.layout == first and s.task.qlayout == "vector_per_key" and s.task.index_mode == "global"
            and s.task.qf_id in NEGATIVE_FORMATS and _vector_loadable(s, lay)]


def _vector_loadable(s: _Saved, lay: Layout) -> bool:
    """``vector_per_key`` keys are local: a layout whose ranks hold more experts than the writer's
    finds keys missing."""
    n = s.task.cfg.num_experts
    if s.task.qlayout != "vector_per_key" or not vector_fields(quant_format(s.task.qf_id)):
        return True
    return lay.num_local_experts(n) <= s.layout.num_local_experts(n)


def _load_tasks(plan: DistPlan, saved: list[_Saved], lay: Layout, bad: list[BadCase]) -> list[CkptTask]:
    tasks = [s.task for s in saved if s.task.index_mode == "global"]
    tasks += [s.task for s in saved if s.task.index_mode != "global" and s.layout == lay]
    tasks += [t for _, t in _global_rank_tasks(plan, saved, lay)]
    return tasks + [b.task for b in bad]


LoadRows = dict[tuple[int, ...], list[SectionRow]]
"""One load layout's rows by sub-key: ``(0, i)`` the checkpoints of save layout ``i``, ``(1,)`` the
global-rank negative control, ``(2,)`` the bad inputs."""


def _stage_load(plan: DistPlan, saved: list[_Saved], bad: list[BadCase], truth: Truth, workdir: str, first_owned: int = 0,
                failed_prefix: str = "") -> list[LoadRows]:
    """The ranks of every load layout (``run_layouts``) reading ``saved`` and ``bad``, then the rows
    of each, in load-layout order; a layout whose ranks failed gives one row keyed with
    ``first_owned``, the part's first save layout (unique to the part, whatever it saved)."""
    calls = [(load_job, LoadPayload(plan.seed, plan.engine, tuple(_load_tasks(plan, saved, lay, bad))), lay) for lay in plan.load_layouts]
    runs = run_layouts(calls, device=plan.device, workdir=workdir, timeout_s=plan.timeout_s)
    return [_judge_load(plan, lay, saved, bad, ranks, truth, first_owned, failed_prefix) for lay, ranks in zip(plan.load_layouts, runs)]


def _judge_load(plan: DistPlan, lay: Layout, saved: list[_Saved], bad: list[BadCase], ranks: Union[list[dict], Exception], truth: Truth,
                first_owned: int = 0, failed_prefix: str = "") -> LoadRows:
    index = {sl: i for i, sl in enumerate(plan.save_layouts)}
    blocks: LoadRows = {}
    if isinstance(ranks, Exception):
        blocks[(0, first_owned)] = [Verdict(f"{failed_prefix}load/{lay.id}", "fail", {"load": lay.id, "engine": plan.engine}, f"load ranks failed: {ranks}")]
        return blocks
    coords = [Coords(*r["coords"]) for r in ranks]
    for s in saved:
        t = s.task
        if t.index_mode != "global" and s.layout != lay:
            continue
        out = blocks.setdefault((0, index[s.layout]), [])
        results = [r["results"][t.ckpt_id] for r in ranks]
        base = f"{s.layout.id}->{lay.id}/{t.qlayout}/{t.qf_id}"
        fields = {"save": s.layout.id, "load": lay.id, "qlayout": t.qlayout, "format": t.qf_id, "engine": plan.engine}
        if t.index_mode == "global" and not _vector_loadable(s, lay):
            n_save = s.layout.num_local_experts(t.cfg.num_experts)
            out.append(bad_input_verdict(f"refused/{base}", fields, results, "CheckpointMismatchError", (f"weight_quantizer_{n_save}.", "missing")))
            continue
        verdict = roundtrip_verdict(f"roundtrip/{base}", fields, results, coords, s.oracle, truth, lay, t.qlayout, t.qf_id, t.index_mode,
                                    save_layout=s.layout)
        if t.index_mode in NEGATIVE_WRITERS:
            name, what = NEGATIVE_WRITERS[t.index_mode]
            verdict = negative_control(f"negative/{name}/{base}", verdict, what)
        out.append(verdict)
    for s, t in _global_rank_tasks(plan, saved, lay):
        results = [r["results"][t.ckpt_id] for r in ranks]
        base = f"{s.layout.id}->{lay.id}/{t.qlayout}/{t.qf_id}"
        fields = {"save": s.layout.id, "load": lay.id, "qlayout": t.qlayout, "format": t.qf_id, "engine": plan.engine}
        inner = roundtrip_verdict(f"roundtrip/{base}/global_rank", fields, results, coords, s.oracle, truth, lay, t.qlayout, t.qf_id, t.index_mode,
                                  save_layout=s.layout)
        blocks.setdefault((1,), []).append(negative_control(f"negative/vector_global_rank/{base}", inner,
                                                             "the [N_global] vector sliced at the global rank instead of the EP rank"))
    for b in bad:
        results = [r["results"][b.task.ckpt_id] for r in ranks]
        fields = {"load": lay.id, "qlayout": b.task.qlayout, "format": b.task.qf_id, "engine": plan.engine}
        blocks.setdefault((2,), []).append(bad_input_verdict(f"bad_input/{b.kind}/{lay.id}", fields, results, b.error, b.must_mention))
    return blocks


@contextmanager
def one_thread() -> Iterator[None]:
    """Run this process's torch ops on one intra-op thread, then restore the setting.

    The judging is many tiny tensor ops, which several intra-op threads slow down by orders of
    magnitude on a small host (chosen by measurement: docs/measured.md §13).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def run_plan(plan: DistPlan, workdir: str) -> list[SectionRow]:
    """Run every stage of ``plan`` under ``workdir`` (checkpoints, rank results); see module doc."""
    return [r for _, block in run_plan_blocks(plan, workdir) for r in block]


def run_plan_blocks(plan: DistPlan, workdir: str, part: Optional[Part] = None) -> list[tuple[BlockKey, list[SectionRow]]]:
    """The rows of ``plan`` in keyed blocks, in key order; with ``part``, that part's blocks only
    (see the module docstring)."""
    with one_thread():
        return _run_plan(plan, workdir, part)


def _run_plan(plan: DistPlan, workdir: str, part: Optional[Part]) -> list[tuple[BlockKey, list[SectionRow]]]:
    plan.validate()
    os.makedirs(workdir, exist_ok=True)
    owned = part.owned([lay.world for lay in plan.save_layouts]) if part is not None else [True] * len(plan.save_layouts)
    mine = [i for i, own in enumerate(owned) if own]
    keeper = owned[0]  # the part that saves the first layout also runs what reads the first layout's checkpoints
    available, why = ENGINES[plan.engine].available(plan.device)
    if not available:
        return [((0,), [Verdict(f"engine/{plan.engine}", "skip", {"engine": plan.engine}, why)])] if keeper else []
    if not mine:
        return []
    truth = build_truth(plan.cfg, plan.seed, plan.qf_ids)
    blocks: list[tuple[BlockKey, list[SectionRow]]] = []
    saved: list[_Saved] = []
    for i, (rows, layout_saved) in zip(mine, _stage_save(plan, truth, workdir, [plan.save_layouts[i] for i in mine])):
        blocks.append(((0, 0, i), rows))
        saved += layout_saved
    for i in mine:
        rows = []
        _stage_content([s for s in saved if s.layout == plan.save_layouts[i]], truth, rows, ENGINES[plan.engine].internal_keys)
        blocks.append(((0, 1, i), rows))
    bad: list[BadCase] = []
    if keeper:
        rows = []
        if plan.negative_controls:
            _vector_size_rows(saved, truth, rows)
            _payload_bitflip(saved, truth, workdir, rows, ENGINES[plan.engine].internal_keys)
        blocks.append(((0, 2), rows))
        if plan.bad_inputs:
            good = {(s.task.qlayout, s.task.qf_id): s.task.path for s in reversed(saved) if s.task.index_mode == "global" and s.oracle is not None}
            bad = make_bad_cases(os.path.join(workdir, "bad"), plan.cfg, plan.seed, good)
    prefix = f"part{part.index}of{part.count}/" if part is not None and part.count > 1 else ""
    for j, load_rows in enumerate(_stage_load(plan, saved, bad, truth, workdir, mine[0], prefix)):
        blocks += [((1, j, *sub), rows) for sub, rows in sorted(load_rows.items())]
    return blocks
