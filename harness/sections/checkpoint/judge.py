"""Turn what the ranks reported into verdicts (runs in the parent; ranks never judge themselves).

* ``invariance_verdict`` -- quantization parameters computed under a layout after the sync step,
  assembled into ``[E, ...]``, against the TP=1/EP=1 truth, bit for bit (replicas must agree);
* ``roundtrip_verdict`` -- one checkpoint loaded under a layout, three ways:
  ``load:`` every loaded key against the single-process copy of the checkpoint (the engine
  resharded correctly), ``state:`` the rank's canonical experts against the truth (every expert's
  amax and weight sits where Megatron's rule says), ``fq:`` the ranks' fake-quantized weights
  against the fake quant of the single-process copy;
* ``granularity_verdict`` -- every expert's scales are its own (per-expert granularity), else
  the experts whose scales changed, by buffer;
* ``bad_input_verdict`` -- every rank refused the checkpoint with the expected error class and a
  message naming the key and both shapes.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from moe_fq_parity.harness.core.equality import same_bits
from moe_fq_parity.harness.sections import SectionRow

from .checks import TensorDiff, Verdict, assemble, canonical_pieces, diff_bits, missing, verdict_from_diffs
from .layout import Coords, Layout
from .model import FCS, MoEConfig
from .oracle import TRUTH_LAYOUT, Truth, oracle_state
from .quant import QuantFormat, fake_quant_local, quant_format
from .shards import field_tp_axis, from_loaded, key_plan, tolerated_entries

Report = tuple[Coords, dict[str, torch.Tensor]]
"""One rank's ``"{fc}/{field}" -> [n_local, ...]`` tensors with its mesh coordinates."""


def canonical_diffs(
    prefix: str, reports: list[Report], expected: dict[str, torch.Tensor], layout: Layout, qf: QuantFormat, num_experts: int
) -> list[TensorDiff]:
    """Assemble each field of ``reports`` into ``[E, ...]`` and compare it with ``expected``."""
    diffs = []
    for name in reports[0][1]:
        fc, fld = name.split("/", 1)
        pieces: list[tuple[tuple[int, ...], torch.Tensor]] = []
        shape: tuple[int, ...] = ()
        for coords, tensors in reports:
            shape, offsets = canonical_pieces(tensors[name], field_tp_axis(fc, fld, qf), layout, coords, num_experts)
            pieces.append((offsets, tensors[name]))
        full, problems = assemble(pieces, shape, pieces[0][1].dtype)
        if name not in expected:
            diffs.append(missing(f"{prefix}{name}", "no expected value"))
            continue
        diffs.append(diff_bits(f"{prefix}{name}", expected[name], full, note="; ".join(problems)))
    return diffs


def invariance_verdict(
    check_id: str, fields: dict[str, Any], ranks: list[dict], qf_id: str, which: str, layout: Layout, truth: Truth
) -> SectionRow:
    """``ranks[r]["calib"][qf_id][which]`` assembled vs ``truth.params[qf_id]``."""
    qf = quant_format(qf_id)
    reports = [(Coords(*r["coords"]), r["calib"][qf_id][which]) for r in ranks]
    diffs = canonical_diffs("", reports, truth.params[qf_id], layout, qf, truth.cfg.num_experts)
    return verdict_from_diffs(check_id, fields, diffs)


def changed_experts(expected: torch.Tensor, got: torch.Tensor) -> list[int]:
    """Indices along dim 0 (experts) where any element's bits differ (or the shapes differ: all)."""
    if expected.shape != got.shape or expected.dtype != got.dtype:
        return list(range(expected.shape[0]))
    bad = ~same_bits(expected.contiguous(), got.contiguous())
    return [int(i) for i in torch.nonzero(bad.reshape(bad.shape[0], -1).any(dim=1)).flatten()]


def granularity_verdict(
    check_id: str, fields: dict[str, Any], ranks: list[dict], qf_id: str, which: str, layout: Layout, truth: Truth
) -> SectionRow:
    """Every expert's *scales* (the format's buffers) after ``which`` sync equal its own truth.

    Fails as a **per-expert granularity violation** naming, per buffer, the experts whose scales
    changed: what an EP all-reduce does to per-expert quantizers (local expert ``i`` of every EP
    rank is merged into one value).
    """
    qf = quant_format(qf_id)
    problems, changed_all = [], set()
    for fc in FCS:
        for b in qf.buffers:
            name = f"{fc}/{b.name}"
            pieces: list[tuple[tuple[int, ...], torch.Tensor]] = []
            shape: tuple[int, ...] = ()
            for r in ranks:
                t = r["calib"][qf_id][which][name]
                shape, offsets = canonical_pieces(t, field_tp_axis(fc, b.name, qf), layout, Coords(*r["coords"]), truth.cfg.num_experts)
                pieces.append((offsets, t))
            full, notes = assemble(pieces, shape, pieces[0][1].dtype)
            changed = changed_experts(truth.params[qf_id][name], full)
            changed_all.update(changed)
            if changed or notes:
                problems.append(f"{name}: experts {changed}" + (f" ({'; '.join(notes)})" if notes else ""))
    fields = {**fields, "experts_changed": sorted(changed_all)}
    if problems:
        return Verdict(check_id, "fail", fields, f"per-expert granularity violation: scales changed for experts {sorted(changed_all)} "
                       f"of {truth.cfg.num_experts}: " + " | ".join(problems))
    return Verdict(check_id, "pass", fields, f"every expert's scales are its own ({len(FCS) * len(qf.buffers)} buffers)")


def _rank_errors(results: list[dict]) -> list[str]:
    return [f"rank {r}: {res['error']}: {res['message']}" for r, res in enumerate(results) if not res["ok"]]


def _engine_diffs(results: list[dict], oracle: dict[str, torch.Tensor], redundant: frozenset[str] = frozenset()) -> tuple[list[TensorDiff], list[str]]:
    by_key: dict[str, list[tuple[tuple[int, ...], torch.Tensor]]] = {}
    for res in results:
        for key, piece in res["raw"].items():
            by_key.setdefault(key, []).append((tuple(piece["offsets"]), piece["local"]))
    diffs = []
    for key, pieces in by_key.items():
        if key not in oracle:
            diffs.append(missing(f"load:{key}", "not in the single-process copy"))
            continue
        full, problems = assemble(pieces, tuple(oracle[key].shape), oracle[key].dtype)
        diffs.append(diff_bits(f"load:{key}", oracle[key], full, note="; ".join(problems)))
    unloaded = [f"key {k!r} loaded by no rank" for k in oracle if k not in by_key and k not in redundant]
    return diffs, unloaded


def _oracle_fq(oracle: dict[str, torch.Tensor], cfg: MoEConfig, qlayout: str, qf_id: str, save_layout: Layout) -> tuple[dict[str, torch.Tensor], list[str]]:
    qf = quant_format(qf_id)
    try:
        st = oracle_state(oracle, cfg, qlayout, qf_id, save_layout if qlayout == "vector_per_key" else TRUTH_LAYOUT)
        return {f"{fc}/fq": fake_quant_local(st.weights[fc], st.quant[fc], qf) for fc in FCS}, []
    except (KeyError, ValueError, TypeError) as exc:
        return {}, [f"fake quant of the single-process copy impossible: {type(exc).__name__}: {exc}"]


def roundtrip_verdict(
    check_id: str,
    fields: dict[str, Any],
    results: list[dict],
    coords: list[Coords],
    oracle: Optional[dict[str, torch.Tensor]],
    truth: Truth,
    layout: Layout,
    qlayout: str,
    qf_id: str,
    index_mode: str = "global",
    save_layout: Layout = TRUTH_LAYOUT,
) -> Verdict:
    """One checkpoint (written under ``save_layout``) loaded under ``layout`` (``results[r]``:
    rank r's report for it); see module doc."""
    errors = _rank_errors(results)
    if errors:
        return Verdict(check_id, "fail", fields, "load failed: " + " | ".join(errors[:2]))
    if oracle is None:
        return Verdict(check_id, "fail", fields, "no single-process copy of the checkpoint to compare with")
    cfg, qf = truth.cfg, quant_format(qf_id)
    diffs, problems = _engine_diffs(results, oracle, frozenset(tolerated_entries(cfg, layout, qlayout, qf)))
    states = []
    for c, res in zip(coords, results):
        try:
            st = from_loaded({k: p["local"] for k, p in res["raw"].items()}, key_plan(cfg, layout, c, qlayout, qf, index_mode))
        except (KeyError, ValueError) as exc:  # e.g. a vector index outside the vector
            problems.append(f"rank at {c}: loaded state unreadable: {type(exc).__name__}: {exc}")
            continue
        named = {f"{fc}/weight": st.weights[fc] for fc in FCS}
        named.update({f"{fc}/{b}": t for fc in FCS for b, t in st.quant[fc].items()})
        states.append((c, named))
    if len(states) == len(coords):
        diffs += canonical_diffs("state:", states, truth.params[qf_id], layout, qf, cfg.num_experts)
    expected_fq, fq_problems = _oracle_fq(oracle, cfg, qlayout, qf_id, save_layout)
    problems += fq_problems + [f"rank {r}: {res['fq_error']}" for r, res in enumerate(results) if "fq_error" in res]
    if expected_fq and not any("fq_error" in res for res in results):
        fq_reports = [(c, {f"{fc}/fq": res["fq"][fc] for fc in FCS}) for c, res in zip(coords, results)]
        diffs += canonical_diffs("fq:", fq_reports, expected_fq, layout, qf, cfg.num_experts)
    return verdict_from_diffs(check_id, fields, diffs, problems)


def bad_input_verdict(check_id: str, fields: dict[str, Any], results: list[dict], error: str, must_mention: tuple[str, ...]) -> SectionRow:
    """Every rank failed with ``error`` (a class name) and a message containing ``must_mention``."""
    problems = []
    for r, res in enumerate(results):
        if res["ok"]:
            problems.append(f"rank {r} loaded it without an error")
            continue
        if res["error"] != error:
            problems.append(f"rank {r} raised {res['error']} instead of {error}: {res['message'][:200]}")
        absent = [m for m in must_mention if m not in res["message"]]
        if absent:
            problems.append(f"rank {r}: message does not mention {absent}: {res['message'][:300]}")
    fields = {**fields, "error": error}
    if problems:
        return Verdict(check_id, "fail", fields, " | ".join(problems[:4]))
    first = results[0]["message"]
    return Verdict(check_id, "pass", fields, f"refused on every rank: {first[:400]}")
