"""Compare two reports: regressions (exit non-zero), improvements and other changes.

A regression is: a record that passed and now fails; a record that was exact and is not (even if it
still passes under ``1-ulp``); a failing record that is new; a check that ran out of memory (outcome
``oom``: no verdict, named as such); a section row that passed and now fails; a slowdown beyond
``tolerances.SLOWDOWN_THRESHOLD`` (median time, same backend and case).  Lost coverage is a regression
too, so a run that died early or checked less cannot pass the gate: a new report that is incomplete
(``complete: false``: interrupted, terminated or died), a report of another suite than the baseline,
a record or section row of the baseline missing from the new report, a record or row that passed and
is now skipped.  A new report that lists its cases (``meta.cases``: a run of selected cases) is compared
on those cases only, the others named as a change.

When the new report is one shard of a sharded run (``meta.shard``) and the old one is not, only the
old records of the shard's cases are compared, and of the sections those the shard ran: a whole
section row for row, a section split across the shards on the rows of the shard's part (a part
cannot tell which of the baseline's rows were its own; the merged report can).  Merged reports (``moe-fq-parity merge``) compare like
any report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moe_fq_parity.harness.core.tolerances import SLOWDOWN_THRESHOLD


MAX_LISTED = 50
"""Missing records listed one by one (the rest counted in one line)."""


@dataclass(frozen=True)
class Diff:
    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)

    def to_json(self, path: str) -> dict[str, Any]:
        return {"path": path, "regressions": self.regressions, "improvements": self.improvements, "changes": self.changes}


def _exact(r: dict[str, Any]) -> bool:
    return r["verdict"] == "pass" and all(v == 0 for k, v in r.get("counts", {}).items() if k != "exact")


def _section_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{s['name']}:{row['id']}": row for s in report.get("sections", []) for row in s["rows"]}


def planned_cases(shard: dict[str, Any]) -> set[str]:
    """Case ids a shard was assigned (from its ``meta.shard``: the selection and its index/count)."""
    from moe_fq_parity.cases import Case

    from .shard import Shard, select_shard

    selection = [Case.from_id(cid) for cid in shard["selection"]]
    return {c.id for c in select_shard(selection, Shard(shard["index"], shard["count"]))}


def diff_reports(old: dict[str, Any], new: dict[str, Any], *, slowdown: float = SLOWDOWN_THRESHOLD) -> Diff:
    """What changed from ``old`` to ``new`` (both report dicts)."""
    d = Diff()
    if not new.get("complete", True):
        d.regressions.append(f"the new report is incomplete ({new.get('error') or 'no reason recorded'}): a run that did not finish cannot pass")
    old_suite, new_suite = old.get("meta", {}).get("suite"), new.get("meta", {}).get("suite")
    if old_suite != new_suite:
        d.regressions.append(f"the new report is of suite {new_suite!r}, the baseline of suite {old_suite!r}: not the same cases")
    if old["records"] and not new["records"]:
        d.regressions.append(f"the new report has no records (the baseline has {len(old['records'])})")
    old_r = {r["key"]: r for r in old["records"]}
    new_r = {r["key"]: r for r in new["records"]}
    planned = new.get("meta", {}).get("cases")
    if planned is not None and not new.get("meta", {}).get("shard"):  # a run of selected cases: compare those
        chosen = set(planned)
        outside = {r["case_id"] for r in old_r.values()} - chosen
        if outside:
            d.changes.append(f"{len(outside)} baseline cases are outside the new run's selection and not compared")
        old_r = {k: r for k, r in old_r.items() if r["case_id"] in chosen}
    shard = new.get("meta", {}).get("shard")
    if shard and not old.get("meta", {}).get("shard"):
        mine = planned_cases(shard)
        old_r = {k: r for k, r in old_r.items() if r["case_id"] in mine}
        d.changes.append(f"compared shard {shard['index']}/{shard['count']} ({len(mine)} cases) with the old report's records of those cases")
    for key, n in new_r.items():
        o = old_r.get(key)
        if n.get("outcome") == "oom":
            if o is not None and o.get("outcome") == "oom":
                d.changes.append(f"still out of memory: {key}")
            else:
                d.regressions.append(f"out of memory (no verdict): {key} ({n['message']})")
            continue
        if o is None:
            (d.regressions if n["verdict"] == "fail" else d.changes).append(f"new {n['verdict']}: {key}" + (f" ({n['message']})" if n["verdict"] == "fail" else ""))
            continue
        if o["verdict"] == "pass" and n["verdict"] == "fail":
            d.regressions.append(f"pass -> fail: {key} ({n['message']})")
        elif o["verdict"] == "fail" and n["verdict"] == "pass":
            d.improvements.append(f"fail -> pass: {key}")
        elif o["verdict"] == "pass" and n["verdict"] == "skip":
            d.regressions.append(f"pass -> skip (coverage lost): {key} ({n['message']})")
        elif _exact(o) and n["verdict"] == "pass" and not _exact(n):
            d.regressions.append(f"exact -> not exact: {key} (max {n['max_ulp']} ULP, {n['counts']})")
        elif o["verdict"] != n["verdict"]:
            d.changes.append(f"{o['verdict']} -> {n['verdict']}: {key}")
        if o.get("perf") and n.get("perf") and o["perf"]["time_us"] > 0:
            ratio = n["perf"]["time_us"] / o["perf"]["time_us"]
            text = f"{key}: {o['perf']['time_us']:.1f} us -> {n['perf']['time_us']:.1f} us ({(ratio - 1) * 100:+.1f}%)"
            if ratio > 1 + slowdown:
                d.regressions.append(f"slowdown beyond {slowdown:.0%}: {text}")
            elif ratio < 1 - slowdown:
                d.improvements.append(f"speedup: {text}")
    gone = old_r.keys() - new_r.keys()
    unchecked = {k for k in gone if old_r[k]["verdict"] == "skip"}  # a skip checked nothing: no coverage lost
    if unchecked:
        d.changes.append(f"{len(unchecked)} skipped records of the baseline are not in the new report (now not applicable to their "
                         f"backend, or no longer planned)")
    missing = sorted(gone - unchecked)
    for key in missing[:MAX_LISTED]:
        d.regressions.append(f"missing in new report (coverage lost): {key}")
    if len(missing) > MAX_LISTED:
        d.regressions.append(f"... and {len(missing) - MAX_LISTED} more records missing in the new report")
    old_s, new_s = _section_rows(old), _section_rows(new)
    if shard and not old.get("meta", {}).get("shard"):  # a shard runs only its share of the sections
        ran = {s["name"] for s in new.get("sections", []) if not s.get("part")}
        old_s = {k: r for k, r in old_s.items() if k.split(":", 1)[0] in ran or k in new_s}  # a part: the rows it has
    for key, n in new_s.items():
        o = old_s.get(key)
        if n["verdict"] == "fail" and (o is None or o["verdict"] != "fail"):
            d.regressions.append(f"section {'new fail' if o is None else o['verdict'] + ' -> fail'}: {key} ({n.get('message', '')})")
        elif o is not None and o["verdict"] == "fail" and n["verdict"] == "pass":
            d.improvements.append(f"section fail -> pass: {key}")
        elif o is not None and o["verdict"] == "pass" and n["verdict"] == "skip":
            d.regressions.append(f"section pass -> skip (coverage lost): {key} ({n.get('message', '')})")
    for key in sorted(old_s.keys() - new_s.keys())[:MAX_LISTED]:
        if old_s[key]["verdict"] != "skip":
            d.regressions.append(f"section row missing in new report (coverage lost): {key}")
    return d


def format_diff(d: Diff) -> str:
    """Human-readable listing for the terminal."""
    lines = [f"{len(d.regressions)} regressions, {len(d.improvements)} improvements, {len(d.changes)} other changes"]
    for title, items in (("REGRESSIONS", d.regressions), ("improvements", d.improvements), ("changes", d.changes)):
        if items:
            lines.append(f"{title}:")
            lines += [f"  {it}" for it in items]
    return "\n".join(lines)
