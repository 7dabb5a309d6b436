"""Merge the reports of a sharded run (``moe-fq-parity run --shard i/n``) into one report.

The shards must be one run cut in pieces: every report carries ``meta.shard`` (index, count, the
whole selection's case ids and their digest, the chosen sections), all shards ``1..n`` are present
once, and suite, seed, mode, NaN policy (``nan_bits``), checks, backends, timeout and shard count agree.
The shards' own case lists (``meta.cases``) partition the selection, and a complete shard holds its
whole share: for every case of its list and every available backend, a record of every check of
``meta.checks`` (or the one ``forward`` failure of a case whose inputs could not be built); a
complete shard whose records were emptied, cut or edited is refused.  Reports of different
commits merge only when their case selections are identical (same digest); otherwise the merge is
refused, naming both commits.  ``MergeError`` says which report and field disagree.

The merged report has the records of every shard in the order of an unsharded run (the selection's
case order; within a case, the shard's own order), the sections in the order they were chosen (a
section split across the shards -- its JSON has ``part: {index, count, blocks}`` -- is rebuilt from
every shard's part: the blocks of all parts sorted by key, which is the unsplit section's row order;
its verdict is recomputed from the rows, its ``seconds`` is the slowest part's; a part missing from
an incomplete shard becomes one ``fail`` row naming it, and from a complete shard refuses the merge),
``complete`` only when every shard completed, and ``meta.merged`` listing the shards (path, commit,
device, start/finish, completeness).  ``meta.copy_gbps`` is shard 1's; each shard's is in
``meta.merged.shards``.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from .schema import SCHEMA_VERSION, section_verdict

_SAME = ("suite", "seed", "mode", "nan_bits", "checks", "timeout_s")
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


def _check_coverage(items: Sequence[tuple[str, dict[str, Any]]]) -> None:
    """The shards' case lists partition the selection; each record is of its shard's cases; a complete
    shard has every record of its share (see the module docstring)."""
    selection = items[0][1]["meta"]["shard"]["selection"]
    owner: dict[str, str] = {}
    for path, rep in items:
        meta = rep["meta"]
        cases = meta.get("cases")
        if cases is None:
            raise MergeError(f"{path}: no meta.cases (the shard's own cases): cannot prove it holds its share")
        if len(cases) != meta["shard"]["cases"]:
            raise MergeError(f"{path}: meta.cases lists {len(cases)} cases, meta.shard.cases says {meta['shard']['cases']}")
        for cid in cases:
            if cid in owner:
                raise MergeError(f"case {cid} is in the share of {owner[cid]} and of {path}")
            owner[cid] = path
        mine = set(cases)
        for r in rep["records"]:
            if r["case_id"] not in mine:
                raise MergeError(f"{path}: record {r['key']} is of a case outside this shard's share")
        if not rep["complete"]:
            continue  # an incomplete shard merges into an incomplete report, saying so
        checks = set(meta.get("checks") or ())
        held: dict[tuple[str, str], list[dict[str, Any]]] = {}
        for r in rep["records"]:
            held.setdefault((r["case_id"], r["backend"]), []).append(r)
        available = [b["spec"] for b in meta.get("backends", []) if b.get("available")]
        for cid in cases:
            for spec in available:
                recs = held.get((cid, spec), [])
                got = {r["check"] for r in recs}
                unbuilt = len(recs) == 1 and recs[0]["check"] == "forward" and recs[0]["verdict"] == "fail"
                if got != checks and not unbuilt:
                    lost = sorted(checks - got)
                    raise MergeError(f"{path}: shard {meta['shard']['index']}/{meta['shard']['count']} is complete but lacks "
                                     f"{'every record' if not recs else 'the records of checks ' + str(lost)} of case {cid} on "
                                     f"{spec}: its records were cut or emptied")
    missing = [cid for cid in selection if cid not in owner]
    if missing:
        raise MergeError(f"{len(missing)} selected cases are in no shard's share (first: {missing[0]})")


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


def join_parts(name: str, parts: dict[int, tuple[str, dict[str, Any]]], count: int,
               missing: Callable[[int], dict[str, Any]]) -> dict[str, Any]:
    """One section from its parts (``{part index: (where it came from, section JSON)}``, of ``count``;
    see the module docstring): the blocks of all parts sorted by key, a ``missing(index)`` row for
    each part not given, the verdict recomputed from the rows, ``seconds`` the slowest part's.
    ``MergeError`` when the parts do not fit together.  Used by ``merge`` (the shards' parts) and by
    a run that splits a section over processes of its own (``harness.sections.processes``)."""
    blocks: list[tuple[list[int], int, list[dict[str, Any]]]] = []
    for index, (path, sec) in sorted(parts.items()):
        rows, pos = sec["rows"], 0
        for key, n in sec["part"]["blocks"]:
            blocks.append((list(key), index, rows[pos:pos + n]))
            pos += n
        if pos != len(rows):
            raise MergeError(f"{path}: section {name} part {index}/{count} has {len(rows)} rows but its blocks hold {pos}")
    blocks.sort(key=lambda b: b[0])
    for (k1, i1, _), (k2, i2, _) in zip(blocks, blocks[1:]):
        if k1 == k2:
            raise MergeError(f"section {name}: block {k1} is in parts {i1}/{count} and {i2}/{count}: not parts of one split")
    rows = [r for _, _, block in blocks for r in block]
    rows += [missing(index) for index in range(1, count + 1) if index not in parts]
    # title and columns from the first part that ran (a part that broke is a one-row section titled by its name)
    first = next((sec for _, sec in (parts[i] for i in sorted(parts)) if sec.get("columns")), parts[min(parts)][1])
    notes = list(dict.fromkeys(sec.get("notes", "") for _, sec in (parts[i] for i in sorted(parts))))
    out = {k: v for k, v in first.items() if k not in ("part", "rows", "verdict", "notes", "seconds")}
    out.update(rows=rows, notes=" | ".join(n for n in notes if n), verdict=section_verdict(r["verdict"] for r in rows))
    seconds = [sec["seconds"] for _, sec in parts.values() if "seconds" in sec]
    if seconds:
        out["seconds"] = max(seconds)
    return out


def _merge_split(name: str, parts: dict[int, tuple[str, dict[str, Any]]], items: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One section from the shards' parts; a part a complete shard lacks is an error, one an
    unfinished shard lacks a failing row."""
    count = items[0][1]["meta"]["shard"]["count"]
    complete = {rep["meta"]["shard"]["index"]: (path, rep["complete"]) for path, rep in items}

    def missing(index: int) -> dict[str, Any]:
        path, done = complete[index]
        if done:
            raise MergeError(f"{path}: shard {index}/{count} is complete but has no part of section {name}")
        return {"id": f"{name}/part{index}of{count}", "verdict": "fail", "fields": {}, "repro": "",
                "message": f"part {index}/{count} of section {name} is missing: shard {index}/{count} ({path}) did not finish"}

    return join_parts(name, parts, count, missing)


def merge_sections(items: Sequence[tuple[str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """The sections of the shards: whole ones as they are (each in one shard), split ones rebuilt."""
    count = items[0][1]["meta"]["shard"]["count"]
    whole: dict[str, tuple[str, dict[str, Any]]] = {}
    split: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {}
    for path, rep in items:
        index = rep["meta"]["shard"]["index"]
        for sec in rep.get("sections", []):
            name, part = sec["name"], sec.get("part")
            if part is None:
                if name in whole or name in split:
                    raise MergeError(f"section {name} is in {(whole.get(name) or next(iter(split[name].values())))[0]} and {path}")
                whole[name] = (path, sec)
                continue
            if name in whole:
                raise MergeError(f"section {name} is whole in {whole[name][0]} and a part in {path}")
            if (part["index"], part["count"]) != (index, count):
                raise MergeError(f"{path}: shard {index}/{count} holds part {part['index']}/{part['count']} of section {name}")
            if index in split.get(name, {}):
                raise MergeError(f"{path}: section {name} part {index}/{count} given twice")
            split.setdefault(name, {})[index] = (path, sec)
    return [sec for _, sec in whole.values()] + [_merge_split(name, parts, items) for name, parts in split.items()]


def merge_reports(items: Sequence[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One report from ``(path, report)`` pairs of the shards of one run (see the module docstring)."""
    if not items:
        raise MergeError("no reports to merge")
    for path, rep in items:
        if not rep.get("meta", {}).get("shard"):
            raise MergeError(f"{path}: not a shard report (no meta.shard); run each part with --shard i/n")
    _check_same(items)
    _check_indices(items)
    _check_coverage(items)
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
    sections = sorted(merge_sections(items), key=lambda s: rank.get(s["name"], len(rank)))
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
            "records": [r for _, _, r in records], "sections": sections, "baseline": None,
            "not_applicable": merge_not_applicable([rep.get("not_applicable") or {} for _, rep in items])}


def merge_not_applicable(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The ``not_applicable`` counts of the shards, summed per backend and reason (shards hold disjoint cases)."""
    out: dict[str, Any] = {}
    for part in parts:
        for backend, v in part.items():
            o = out.setdefault(backend, {"records": 0, "cases": 0, "reasons": {}})
            o["records"] += v["records"]
            o["cases"] += v["cases"]
            for r in v["reasons"]:
                acc = o["reasons"].setdefault(r["reason"], {"reason": r["reason"], "records": 0, "cases": 0})
                acc["records"] += r["records"]
                acc["cases"] += r["cases"]
    for o in out.values():
        o["reasons"] = sorted(o["reasons"].values(), key=lambda r: (-r["records"], r["reason"]))
    return dict(sorted(out.items()))
