"""Compare two reports: regressions (exit non-zero), improvements and other changes.

A regression is: a record that passed and now fails; a record that was exact and is not (even if it
still passes under ``1-ulp``); a failing record that is new; a check that ran out of memory (outcome
``oom``: no verdict, named as such); a section row that passed and now fails; a slowdown beyond
``tolerances.SLOWDOWN_THRESHOLD`` (median time, same backend and case).  Lost coverage is a regression
too, so a run that died early or checked less cannot pass the gate: a new report that is incomplete
(``complete: false``: interrupted, terminated or died), a report of another suite than the baseline,
a record or section row of the baseline missing from the new report, a record or row that passed and
is now skipped.  A new report of fewer cases than the baseline (``run --formats/--cases``: its
``meta.cases`` lists them) misses the baseline's other records, each a regression; with ``subset=True``
(``compare --subset``, ``run --baseline-subset``: the user declares the new run a deliberate subset)
only its cases are compared, and a warning at the top counts the cases and records left out.

Every entry is counted in its class (``Diff.totals``: records and rows, never listed lines); each
class lists its first ``MAX_LISTED`` entries and one ``... and N more <class>`` line.  Warnings come
first: reports of other backends, suites, modes or NaN policies, and the subset left out.

When the new report is one shard of a sharded run (``meta.shard``) and the old one is not, only the
old records of the shard's cases are compared, and of the sections those the shard ran: a whole
section row for row, a section split across the shards on the rows of the shard's part (a part
cannot tell which of the baseline's rows were its own; the merged report can).  Merged reports (``moe-fq-parity merge``) compare like
any report.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from moe_fq_parity.cases import Case

from moe_fq_parity.harness.core.tolerances import SLOWDOWN_THRESHOLD

from .shard import Shard, select_shard


MAX_LISTED = 50
"""Entries listed one by one per class of change (the rest of the class counted in one line); the
totals count every record and row."""

REGRESSIONS, IMPROVEMENTS, CHANGES = "regressions", "improvements", "changes"
KINDS = (REGRESSIONS, IMPROVEMENTS, CHANGES)


@dataclass
class Diff:
    """The outcome of a comparison: per kind (``KINDS``) the listed lines (at most ``MAX_LISTED`` per
    class, then ``... and N more <class>``), the true count of every class (``totals``), and
    ``warnings`` about how the two reports differ that a reader must see first (other backends,
    suite, mode or NaN policy; baseline cases outside the new run's selection)."""

    regressions: list[str] = field(default_factory=list)
    improvements: list[str] = field(default_factory=list)
    changes: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    totals: dict[str, dict[str, int]] = field(default_factory=lambda: {k: {} for k in KINDS})

    def add(self, kind: str, cls: str, text: str) -> None:
        """Count one ``cls`` entry of ``kind``; list ``text`` while the class has at most ``MAX_LISTED``."""
        totals = self.totals[kind]
        totals[cls] = totals.get(cls, 0) + 1
        if totals[cls] <= MAX_LISTED:
            getattr(self, kind).append(text)
        elif totals[cls] == MAX_LISTED + 1:
            getattr(self, kind).append("")  # placeholder, filled by ``close``
            self._cut.setdefault(kind, {})[cls] = len(getattr(self, kind)) - 1

    def close(self) -> "Diff":
        """Fill each cut class's ``... and N more`` line (its place: where the first unlisted entry was)."""
        for kind, cut in self._cut.items():
            for cls, pos in cut.items():
                getattr(self, kind)[pos] = f"... and {self.totals[kind][cls] - MAX_LISTED} more {cls}"
        self._cut = {}
        return self

    def __post_init__(self) -> None:
        self._cut: dict[str, dict[str, int]] = {}

    def count(self, kind: str) -> int:
        """How many entries of ``kind`` there are (listed or not)."""
        return sum(self.totals[kind].values())

    def to_json(self, path: str) -> dict[str, Any]:
        return {"path": path, "regressions": self.regressions, "improvements": self.improvements, "changes": self.changes,
                "warnings": self.warnings, "totals": self.totals}


def _exact(r: dict[str, Any]) -> bool:
    return r["verdict"] == "pass" and all(v == 0 for k, v in r.get("counts", {}).items() if k != "exact")


def _section_rows(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{s['name']}:{row['id']}": row for s in report.get("sections", []) for row in s["rows"]}


def planned_cases(shard: dict[str, Any]) -> set[str]:
    """Case ids a shard was assigned (from its ``meta.shard``: the selection and its index/count)."""
    selection = [Case.from_id(cid) for cid in shard["selection"]]
    return {c.id for c in select_shard(selection, Shard(shard["index"], shard["count"]))}


def _ran(report: dict[str, Any]) -> dict[str, Any]:
    """What a report ran, as the warnings compare it: suite, mode, NaN policy, backends with records."""
    meta = report.get("meta", {})
    return {"suite": meta.get("suite"), "mode": meta.get("mode"), "nan_bits": meta.get("nan_bits", "any"),
            "backends": sorted({str(r.get("backend")) for r in report["records"]})}


def _warn_differences(d: Diff, old: dict[str, Any], new: dict[str, Any]) -> None:
    o, n = _ran(old), _ran(new)
    for key in ("suite", "mode", "nan_bits"):
        if o[key] != n[key]:
            d.warnings.append(f"the reports ran different {key.replace('_', '-')}: baseline {o[key]!r}, new {n[key]!r}")
    if o["backends"] != n["backends"]:
        only_old = sorted(set(o["backends"]) - set(n["backends"]))
        only_new = sorted(set(n["backends"]) - set(o["backends"]))
        d.warnings.append(f"the reports ran different backends: only in the baseline {only_old}, only in the new report {only_new}")


def diff_reports(old: dict[str, Any], new: dict[str, Any], *, slowdown: float = SLOWDOWN_THRESHOLD, subset: bool = False) -> Diff:
    """What changed from ``old`` to ``new`` (both report dicts).

    ``subset``: the new report is a deliberate selection (``run --cases/--formats``): the baseline's
    cases outside its ``meta.cases`` are left out of the comparison, with a warning that counts
    them.  Without it they are missing records (regressions), as for any report that checked less."""
    d = Diff()
    _warn_differences(d, old, new)
    if not new.get("complete", True):
        d.add(REGRESSIONS, "incomplete report",
              f"the new report is incomplete ({new.get('error') or 'no reason recorded'}): a run that did not finish cannot pass")
    old_suite, new_suite = old.get("meta", {}).get("suite"), new.get("meta", {}).get("suite")
    if old_suite != new_suite:
        d.add(REGRESSIONS, "other suite", f"the new report is of suite {new_suite!r}, the baseline of suite {old_suite!r}: not the same cases")
    if old["records"] and not new["records"]:
        d.add(REGRESSIONS, "no records", f"the new report has no records (the baseline has {len(old['records'])})")
    old_r = {r["key"]: r for r in old["records"]}
    new_r = {r["key"]: r for r in new["records"]}
    planned = new.get("meta", {}).get("cases")
    shard = new.get("meta", {}).get("shard")
    if planned is not None and not shard:  # a run of selected cases
        chosen = set(planned)
        outside = {k for k, r in old_r.items() if r["case_id"] not in chosen}
        cases = len({old_r[k]["case_id"] for k in outside})
        if outside and subset:
            d.warnings.append(f"SUBSET: {cases} baseline cases ({len(outside)} records) are outside the new run's selection "
                              "and were NOT compared (--subset)")
            old_r = {k: r for k, r in old_r.items() if k not in outside}
        elif outside:
            d.warnings.append(f"{cases} baseline cases ({len(outside)} records) are outside the new run's selection: they count as "
                              "missing records (to compare the selection only: compare --subset, run --baseline-subset)")
    elif subset:
        d.warnings.append("--subset has no effect: the new report " + ("is a shard (compared on its own cases)" if shard else "lists no selection"))
    if shard and not old.get("meta", {}).get("shard"):
        mine = planned_cases(shard)
        old_r = {k: r for k, r in old_r.items() if r["case_id"] in mine}
        d.add(CHANGES, "shard", f"compared shard {shard['index']}/{shard['count']} ({len(mine)} cases) with the old report's records of those cases")
    for key, n in new_r.items():
        o = old_r.get(key)
        if n.get("outcome") == "oom":
            if o is not None and o.get("outcome") == "oom":
                d.add(CHANGES, "still out of memory", f"still out of memory: {key}")
            else:
                d.add(REGRESSIONS, "out of memory", f"out of memory (no verdict): {key} ({n['message']})")
            continue
        if o is None:
            if n["verdict"] == "fail":
                d.add(REGRESSIONS, "new fail", f"new fail: {key} ({n['message']})")
            else:
                d.add(CHANGES, f"new {n['verdict']}", f"new {n['verdict']}: {key}")
            continue
        if o["verdict"] == "pass" and n["verdict"] == "fail":
            d.add(REGRESSIONS, "pass -> fail", f"pass -> fail: {key} ({n['message']})")
        elif o["verdict"] == "fail" and n["verdict"] == "pass":
            d.add(IMPROVEMENTS, "fail -> pass", f"fail -> pass: {key}")
        elif o["verdict"] == "pass" and n["verdict"] == "skip":
            d.add(REGRESSIONS, "pass -> skip", f"pass -> skip (coverage lost): {key} ({n['message']})")
        elif _exact(o) and n["verdict"] == "pass" and not _exact(n):
            d.add(REGRESSIONS, "exact -> not exact", f"exact -> not exact: {key} (max {n['max_ulp']} ULP, {n['counts']})")
        elif o["verdict"] != n["verdict"]:
            d.add(CHANGES, f"{o['verdict']} -> {n['verdict']}", f"{o['verdict']} -> {n['verdict']}: {key}")
        if o.get("perf") and n.get("perf") and o["perf"]["time_us"] > 0:
            ratio = n["perf"]["time_us"] / o["perf"]["time_us"]
            text = f"{key}: {o['perf']['time_us']:.1f} us -> {n['perf']['time_us']:.1f} us ({(ratio - 1) * 100:+.1f}%)"
            if ratio > 1 + slowdown:
                d.add(REGRESSIONS, "slowdown", f"slowdown beyond {slowdown:.0%}: {text}")
            elif ratio < 1 - slowdown:
                d.add(IMPROVEMENTS, "speedup", f"speedup: {text}")
    gone = old_r.keys() - new_r.keys()
    unchecked = {k for k in gone if old_r[k]["verdict"] == "skip"}  # a skip checked nothing: no coverage lost
    for key in sorted(unchecked):
        d.add(CHANGES, "baseline skip not in the new report",
              f"skipped in the baseline, not in the new report (now not applicable to its backend, or no longer planned): {key}")
    for key in sorted(gone - unchecked):
        d.add(REGRESSIONS, "missing record", f"missing in new report (coverage lost): {key}")
    old_s, new_s = _section_rows(old), _section_rows(new)
    if shard and not old.get("meta", {}).get("shard"):  # a shard runs only its share of the sections
        ran = {s["name"] for s in new.get("sections", []) if not s.get("part")}
        old_s = {k: r for k, r in old_s.items() if k.split(":", 1)[0] in ran or k in new_s}  # a part: the rows it has
    for key, n in new_s.items():
        o = old_s.get(key)
        if n["verdict"] == "fail" and (o is None or o["verdict"] != "fail"):
            cls = f"section {'new fail' if o is None else o['verdict'] + ' -> fail'}"
            d.add(REGRESSIONS, cls, f"{cls}: {key} ({n.get('message', '')})")
        elif o is not None and o["verdict"] == "fail" and n["verdict"] == "pass":
            d.add(IMPROVEMENTS, "section fail -> pass", f"section fail -> pass: {key}")
        elif o is not None and o["verdict"] == "pass" and n["verdict"] == "skip":
            d.add(REGRESSIONS, "section pass -> skip", f"section pass -> skip (coverage lost): {key} ({n.get('message', '')})")
    for key in sorted(k for k in old_s.keys() - new_s.keys() if old_s[k]["verdict"] != "skip"):  # skips first out, then the cut
        d.add(REGRESSIONS, "missing section row", f"section row missing in new report (coverage lost): {key}")
    return d.close()


def format_diff(d: Diff) -> str:
    """Human-readable listing for the terminal: the warnings first, a headline with the true count of
    every class, then the listed entries."""
    lines = [f"WARNING: {w}" for w in d.warnings]
    heads = []
    for kind, word in ((REGRESSIONS, "regressions"), (IMPROVEMENTS, "improvements"), (CHANGES, "other changes")):
        by_class = ", ".join(f"{n} {cls}" for cls, n in d.totals[kind].items())
        heads.append(f"{d.count(kind)} {word}" + (f" ({by_class})" if by_class else ""))
    lines.append(", ".join(heads))
    for title, items in (("REGRESSIONS", d.regressions), ("improvements", d.improvements), ("changes", d.changes)):
        if items:
            lines.append(f"{title}:")
            lines += [f"  {it}" for it in items]
    return "\n".join(lines)
