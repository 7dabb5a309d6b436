"""The self-contained HTML report, built from the report JSON and nothing else.

Jinja2 with autoescaping (every string from the JSON is escaped), pictures embedded as base64 PNG,
no external resources: the file reads offline.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import jinja2

from .plots import bandwidth_vs_bytes_png, ulp_histogram_png
from .schema import CHECKS, hist_labels, overall_verdict

TEMPLATE_DIR = Path(__file__).with_name("templates")
MAX_HISTOGRAMS = 40
"""Per-case histograms drawn at most (records with non-exact elements, failing and largest ULP first)."""
MIN_HISTOGRAMS = 6
"""When fewer records have non-exact elements, exact ones fill the gallery up to this many."""
_ORDER = {"fail": 0, "skip": 1, "pass": 2}


def _env() -> jinja2.Environment:
    return jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)), autoescape=True,
                              undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)


_PATH = re.compile(r"(?:[A-Za-z]:)?(?:/[\w.+@~-]+){2,}/([\w.+@~-]+)")
"""An absolute path of two or more folders: shown by its last component."""
MAX_REASON = 220
"""Characters of a skip reason shown before it is cut (the whole text is in the line's title)."""


def short_reason(text: str) -> str:
    """A skip reason as a reader needs it: absolute paths shortened to their file name, one line,
    cut at ``MAX_REASON`` characters."""
    one = " ".join(_PATH.sub(r"\1", text or "no reason given").split())
    return one if len(one) <= MAX_REASON else one[: MAX_REASON - 1].rstrip() + "\u2026"


def _summary(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    table: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        table[r[key]][r["verdict"]] += 1
    order = list(CHECKS) if key == "check" else sorted(table)
    return [{"name": k, "pass": table[k]["pass"], "fail": table[k]["fail"], "skip": table[k]["skip"]} for k in order if k in table]


def _skip_groups(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Skipped records folded by (backend, reason): one entry per reason with its count and case ids,
    largest first."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["backend"], short_reason(r["message"]))].append(r)
    return [{"backend": b, "reason": why, "count": len(rs), "records": sorted(rs, key=lambda r: r["case_id"])}
            for (b, why), rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _section_skip_groups(section: dict[str, Any]) -> list[dict[str, Any]]:
    """A section's skipped rows folded by reason, largest first."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in section["rows"]:
        if row["verdict"] == "skip":
            groups[short_reason(row.get("message"))].append(row)
    return [{"reason": why, "count": len(rows), "rows": rows} for why, rows in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0]))]


def _check_tables(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per check: failing rows (shown), passing rows (folded), skipped rows folded per reason."""
    by_check: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_check[r["check"]].append(r)
    anchored: set[str] = set()
    tables = []
    for check in CHECKS:
        rows = by_check.get(check, [])
        if not rows:
            continue
        key = lambda r: (r["case_id"], r["backend"])  # noqa: E731
        failing = sorted((r for r in rows if r["verdict"] == "fail"), key=key)
        passing = sorted((r for r in rows if r["verdict"] == "pass"), key=key)
        for r in failing + passing:
            r["_anchor"] = r["case_id"] not in anchored
            anchored.add(r["case_id"])
        skipped = [r for r in rows if r["verdict"] == "skip"]
        tables.append({"check": check, "failing": failing, "passing": passing, "skip_groups": _skip_groups(skipped), "skipped": len(skipped)})
    return tables


MAX_FAILED_CASES = 5
"""Failing cases shown at the top before the rest is folded (every failing record is in its check's table too)."""
MAX_NOT_CHECKED = 12
"""Lines of the summary's "not checked" list shown before the rest is folded."""


def _not_checked(report: dict[str, Any], records: list[dict[str, Any]]) -> list[str]:
    """What this report did not check and why, largest first: backends that could not run, checks
    not run, skipped records per (check, backend, reason), skipped section rows."""
    meta = report["meta"]
    lines = [f"backend {b['spec']} did not run: {b['reason'] or 'unavailable'}" for b in meta.get("backends", []) if not b.get("available", True)]
    ran = set(meta.get("checks") or [])
    if ran:
        for check in CHECKS:
            if check not in ran:
                why = "not timed: timing is off on CPU unless --perf" if check == "perf" else "not requested (--checks)"
                lines.append(f"check {check}: {why}")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["verdict"] == "skip":
            groups[(r["backend"], short_reason(r["message"]))].append(r)
    for (backend, why), rs in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        checks = [c for c in CHECKS if any(r["check"] == c for r in rs)]
        n_cases = len({r["case_id"] for r in rs})
        lines.append(f"{len(rs)} record{'s' if len(rs) != 1 else ''} on {backend} ({n_cases} case{'s' if n_cases != 1 else ''}; "
                     f"{', '.join(checks)}): {why}")
    for sec in report.get("sections", []):
        reasons = Counter(short_reason(row.get("message")) for row in sec["rows"] if row["verdict"] == "skip")
        for why, n in reasons.most_common():
            lines.append(f"section {sec['name']}: {n} row{'s' if n != 1 else ''} skipped: {why}")
    return lines


def _failures(records: list[dict[str, Any]], sections: list[dict[str, Any]]) -> dict[str, Any]:
    """What failed, for the top of the report: failing records grouped by case (one cause often fails
    several checks of a case), then failing section rows."""
    by_case: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        if r["verdict"] == "fail":
            by_case[(r["case_id"], r["backend"])].append(r)
    order = {c: k for k, c in enumerate(CHECKS)}
    cases = [{"case_id": cid, "backend": b, "records": sorted(rs, key=lambda r: order.get(r["check"], len(order)))}
             for (cid, b), rs in sorted(by_case.items())]
    rows = [{"section": sec["name"], "title": sec["title"], **row} for sec in sections for row in sec["rows"] if row["verdict"] == "fail"]
    return {"cases": cases, "records": sum(len(c["records"]) for c in cases), "distinct": len({c["case_id"] for c in cases}), "section_rows": rows}


def _not_applicable(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The report's ``not_applicable`` counts, one entry per backend (absent in reports before it)."""
    return [{"backend": b, **v} for b, v in (report.get("not_applicable") or {}).items() if v.get("records")]


def _section_counts(section: dict[str, Any]) -> dict[str, int]:
    c = Counter(row["verdict"] for row in section["rows"])
    return {v: c[v] for v in ("pass", "fail", "skip")}


def _histograms(records: list[dict[str, Any]]) -> tuple[list[dict[str, str]], str | None]:
    fwd = [r for r in records if r["check"] == "forward" and r.get("histogram")]
    if not fwd:
        return [], None
    total = [sum(r["histogram"][k] for r in fwd) for k in range(len(fwd[0]["histogram"]))]
    aggregate = ulp_histogram_png(total, f"forward: elements of the {len(fwd)} records that compared outputs", small=False)
    inexact = [r for r in fwd if r["counts"].get("exact", 0) != r["numel"]]
    exact = [r for r in fwd if r["counts"].get("exact", 0) == r["numel"]]
    chosen = sorted(inexact, key=lambda r: (_ORDER[r["verdict"]], -r["max_ulp"], r["case_id"]))[:MAX_HISTOGRAMS]
    chosen += exact[: max(0, MIN_HISTOGRAMS - len(chosen))]
    pics = []
    for r in chosen:
        pics.append({"case_id": r["case_id"], "backend": r["backend"], "verdict": r["verdict"],
                     "png": ulp_histogram_png(r["histogram"], _histogram_title(r))})
    return pics, aggregate


def _histogram_title(r: dict[str, Any]) -> str:
    """``"triton: max 2 ULP, 49 tie flips, 2 +0/-0"``: what the bars do not show named beside them."""
    extra = [f"{r['counts'][k]} {label}" for k, label in (("tie_flip", "tie flips"), ("nan_bits", "NaN bits"), ("error", "errors"))
             if (r.get("counts") or {}).get(k) and (k != "error" or not r["max_ulp"])]
    if r.get("signed_zero"):
        extra.append(f"{r['signed_zero']} +0/-0")
    return f"{r['backend']}: max {r['max_ulp']} ULP" + "".join(f", {e}" for e in extra)


def _bandwidth(records: list[dict[str, Any]], copy_gbps: float | None, copy_curve: list | None = None) -> str | None:
    pts = [(r["backend"], _expert_shape(r["case_id"]), r["perf"]["bytes_moved"], r["perf"]["pct_of_copy"])
           for r in records if r["check"] == "perf" and r.get("perf")]  # fmt: skip
    return bandwidth_vs_bytes_png(pts, copy_gbps, copy_curve)


def _expert_shape(case_id: str) -> str:
    """The ``ROWSxCOLS`` part of a case id (``?`` when there is none)."""
    return next((p for p in case_id.split("/") if "x" in p and p.replace("x", "").isdigit()), "?")


def _memory_note(r: dict[str, Any]) -> str:
    """``"out of memory; peak 12.31 GB = 2.29x the case's 5.37 GB"`` (parts present in the record only)."""
    parts = ["out of memory (no parity verdict)"] if r.get("outcome") == "oom" else []
    peak, size = r.get("peak_bytes"), r.get("case_bytes") or 0
    if peak is not None:
        parts.append(f"peak GPU memory {peak / 1e9:.2f} GB" + (f" = {peak / size:.2f}x the case's {size / 1e9:.2f} GB input + output" if size else ""))
    return "; ".join(parts)


def _largest_peak(records: list[dict[str, Any]]) -> str:
    """One line naming the record with the largest peak relative to its case bytes (empty off CUDA)."""
    measured = [r for r in records if r.get("peak_bytes") is not None and r.get("case_bytes")]
    if not measured:
        return ""
    r = max(measured, key=lambda r: (r["peak_bytes"] / r["case_bytes"], r["peak_bytes"]))
    top = max(measured, key=lambda r: r["peak_bytes"])
    return (f"largest peak GPU memory of one check: {top['peak_bytes'] / 1e9:.2f} GB ({top['check']} on {top['backend']}, {top['case_id']}); "
            f"largest relative to its case: {r['peak_bytes'] / r['case_bytes']:.2f}x the input + output bytes ({r['check']} on {r['backend']}, {r['case_id']})")


def render_html(report: dict[str, Any]) -> str:
    """HTML text of ``report`` (a dict following the report schema)."""
    records = [dict(r) for r in report["records"]]
    for r in records:
        r["_memory"] = _memory_note(r)
    pics, aggregate = _histograms(records)
    forward = [r for r in records if r["check"] == "forward"]
    return _env().get_template("report.html").render(
        failures=_failures(records, report["sections"]),
        not_applicable=_not_applicable(report),
        section_counts={sec["name"]: _section_counts(sec) for sec in report["sections"]},
        forward_counts={"records": len(forward), "compared": sum(1 for r in forward if r.get("histogram")),
                        **{v: sum(1 for r in forward if r["verdict"] == v) for v in ("pass", "fail", "skip")}},
        report=report,
        meta=report["meta"],
        verdict=overall_verdict(report),
        by_check=_summary(records, "check"),
        by_format=_summary(records, "fmt"),
        by_backend=_summary(records, "backend"),
        tables=_check_tables(records),
        not_checked=_not_checked(report, records),
        max_not_checked=MAX_NOT_CHECKED,
        max_failed_cases=MAX_FAILED_CASES,
        histograms=pics,
        aggregate_png=aggregate,
        bandwidth_png=_bandwidth(records, report["meta"].get("copy_gbps"), report["meta"].get("copy_curve")),
        hist_labels=hist_labels(),
        sections=report["sections"],
        section_skips={sec["name"]: _section_skip_groups(sec) for sec in report["sections"]},
        baseline=report.get("baseline"),
        memory_line=_largest_peak(records),
    )
