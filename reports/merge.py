"""Merge the reports of a sharded run (``moe-fq-parity run --shard i/n``) into one report.

The shards must be one run cut in pieces: every report carries ``meta.shard`` (index, count, the
whole selection's case ids and their digest, the chosen sections), all shards ``1..n`` are present
once, and suite, seed, mode, checks, backends, timeout and shard count agree.  Reports of different
commits merge only when their case selections are identical (same digest); otherwise the merge is
refused, naming both commits.  ``MergeError`` says which report and field disagree.

The merged report has the records of every shard in the order of an unsharded run (the selection's
case order; within a case, the shard's own order), the sections in the order they were chosen,
``complete`` only when every shard completed, and ``meta.merged`` listing the shards (path, commit,
device, start/finish, completeness).  ``meta.copy_gbps`` is shard 1's; each shard's is in
``meta.merged.shards``.
"""

from __future__ import annotations

from typing import Any, Sequence

from .schema import SCHEMA_VERSION

_SAME = ("suite", "seed", "mode", "checks", "timeout_s")
"""``meta`` fields every shard must share (with the backends' specs, the shard count and the sections)."""


class MergeError(ValueError):
    """The reports are not the shards of one run (the message names the report and the field)."""


def _backends(meta: dict[str, Any]) -> list[str]:
    return [b["spec"] for b in meta.get("backends", [])]


def _check_same(items: Sequence[tuple[str, dict[str, Any]]]) -> None:
    first_path, first = items[0]
    fm = first["meta"]
    for path, rep in items[1:]:
        m = rep["meta"]
        for key in _SAME:
            if m.get(key) != fm.get(key):
                raise MergeError(f"{path}: {key} {m.get(key)!r} differs from {first_path}'s {fm.get(key)!r}: not shards of one run")
        if _backends(m) != _backends(fm):
            raise MergeError(f"{path}: backends {_backends(m)} differ from {first_path}'s {_backends(fm)}: not shards of one run")
        s, fs = m["shard"], fm["shard"]
        if s["count"] != fs["count"]:
            raise MergeError(f"{path}: shard {s['index']}/{s['count']} is not one of {fs['count']} shards like {first_path}")
        if s["selection_digest"] != fs["selection_digest"]:
            if m.get("git_commit") != fm.get("git_commit"):
                raise MergeError(f"{path} (commit {m.get('git_commit')}) and {first_path} (commit {fm.get('git_commit')}) were run on "
                                 f"different case sets ({len(s['selection'])} vs {len(fs['selection'])} cases): refusing to merge")
            raise MergeError(f"{path} and {first_path} selected different cases ({len(s['selection'])} vs {len(fs['selection'])} cases; "
                             "same --suite/--cases/--formats/--case needed)")
        if s.get("sections") != fs.get("sections"):
            raise MergeError(f"{path}: sections {s.get('sections')} differ from {first_path}'s {fs.get('sections')}")


def _check_indices(items: Sequence[tuple[str, dict[str, Any]]]) -> None:
    count = items[0][1]["meta"]["shard"]["count"]
    seen: dict[int, str] = {}
    for path, rep in items:
        i = rep["meta"]["shard"]["index"]
        if i in seen:
            raise MergeError(f"shard {i}/{count} given twice: {seen[i]} and {path}")
        seen[i] = path
    missing = [i for i in range(1, count + 1) if i not in seen]
    if missing:
        raise MergeError(f"shard(s) {', '.join(f'{i}/{count}' for i in missing)} missing: merge needs all {count} shards")


def merge_reports(items: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One report from ``(path, report)`` pairs of the shards of one run (see the module docstring)."""
    if not items:
        raise MergeError("no reports to merge")
    for path, rep in items:
        if not rep.get("meta", {}).get("shard"):
            raise MergeError(f"{path}: not a shard report (no meta.shard); run each part with --shard i/n")
    _check_same(items)
    _check_indices(items)
    items = sorted(items, key=lambda pr: pr[1]["meta"]["shard"]["index"])
    shard0 = items[0][1]["meta"]["shard"]
    order = {cid: k for k, cid in enumerate(shard0["selection"])}
    records: list[tuple[int, int, dict[str, Any]]] = []
    keys: dict[str, str] = {}
    for path, rep in items:
        for r in rep["records"]:
            if r["case_id"] not in order:
                raise MergeError(f"{path}: record {r['key']} is of a case outside the selection")
            if r["key"] in keys:
                raise MergeError(f"record {r['key']} is in {keys[r['key']]} and {path}")
            keys[r["key"]] = path
            records.append((order[r["case_id"]], len(records), r))
    records.sort(key=lambda t: (t[0], t[1]))
    rank = {name: k for k, name in enumerate(shard0.get("sections") or [])}
    sections = sorted((s for _, rep in items for s in rep.get("sections", [])), key=lambda s: rank.get(s["name"], len(rank)))
    metas = [rep["meta"] for _, rep in items]
    meta = {k: v for k, v in metas[0].items() if k != "shard"}
    commits = list(dict.fromkeys(m.get("git_commit") for m in metas))
    devices = list(dict.fromkeys(m.get("device", "") for m in metas))
    finished = [m.get("finished") for m in metas]
    meta.update(
        git_commit=commits[0] if len(commits) == 1 else ",".join(str(c) for c in commits),
        git_dirty=any(bool(m.get("git_dirty")) for m in metas) if any(m.get("git_dirty") is not None for m in metas) else None,
        device="; ".join(devices),
        formats=sorted({f for m in metas for f in m.get("formats", [])}),
        started=min(m["started"] for m in metas),
        finished=None if None in finished else max(finished),
        cases_planned=len(shard0["selection"]),
        cases=list(shard0["selection"]),  # the whole selection (a shard's meta.cases is its share)
        merged={
            "count": shard0["count"], "selection_digest": shard0["selection_digest"], "cases": len(shard0["selection"]),
            "shards": [{"path": path, "index": rep["meta"]["shard"]["index"], "cases": rep["meta"]["shard"]["cases"],
                        "git_commit": rep["meta"].get("git_commit"), "device": rep["meta"].get("device", ""),
                        "copy_gbps": rep["meta"].get("copy_gbps"), "started": rep["meta"]["started"],
                        "finished": rep["meta"].get("finished"), "complete": rep["complete"], "error": rep.get("error")}
                       for path, rep in items],
        },
    )
    incomplete = [(path, rep) for path, rep in items if not rep["complete"]]
    error = "; ".join(f"shard {rep['meta']['shard']['index']}/{shard0['count']} ({path}) is incomplete: {rep.get('error') or 'no reason given'}"
                      for path, rep in incomplete) or None
    return {"schema_version": SCHEMA_VERSION, "complete": not incomplete, "error": error, "meta": meta,
            "records": [r for _, _, r in records], "sections": sections, "baseline": None}
