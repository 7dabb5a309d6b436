"""The self-contained HTML report, built from the report JSON and nothing else.

Jinja2 with autoescaping (every string from the JSON is escaped), pictures embedded as base64 PNG,
no external resources: the file reads offline.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import jinja2

from .plots import bandwidth_vs_n_png, ulp_histogram_png
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


def _summary(records: list[dict[str, Any]], key: str) -> list[dict[str, Any]]:
    table: dict[str, Counter] = defaultdict(Counter)
    for r in records:
        table[r[key]][r["verdict"]] += 1
    order = list(CHECKS) if key == "check" else sorted(table)
    return [{"name": k, "pass": table[k]["pass"], "fail": table[k]["fail"], "skip": table[k]["skip"]} for k in order if k in table]


def _check_tables(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_check: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        by_check[r["check"]].append(r)
    anchored: set[str] = set()
    tables = []
    for check in CHECKS:
        rows = sorted(by_check.get(check, []), key=lambda r: (_ORDER[r["verdict"]], r["case_id"], r["backend"]))
        for r in rows:
            r["_anchor"] = r["case_id"] not in anchored
            anchored.add(r["case_id"])
        if rows:
            tables.append({"check": check, "shown": [r for r in rows if r["verdict"] != "pass"], "passing": [r for r in rows if r["verdict"] == "pass"]})
    return tables


def _histograms(records: list[dict[str, Any]]) -> tuple[list[dict[str, str]], str | None]:
    fwd = [r for r in records if r["check"] == "forward" and r.get("histogram")]
    if not fwd:
        return [], None
    total = [sum(r["histogram"][k] for r in fwd) for k in range(len(fwd[0]["histogram"]))]
    aggregate = ulp_histogram_png(total, f"forward, all {len(fwd)} records", small=False)
    inexact = [r for r in fwd if r["counts"].get("exact", 0) != r["numel"]]
    exact = [r for r in fwd if r["counts"].get("exact", 0) == r["numel"]]
    chosen = sorted(inexact, key=lambda r: (_ORDER[r["verdict"]], -r["max_ulp"], r["case_id"]))[:MAX_HISTOGRAMS]
    chosen += exact[: max(0, MIN_HISTOGRAMS - len(chosen))]
    pics = []
    for r in chosen:
        pics.append({"case_id": r["case_id"], "backend": r["backend"], "verdict": r["verdict"],
                     "png": ulp_histogram_png(r["histogram"], f"{r['backend']}: max {r['max_ulp']} ULP")})
    return pics, aggregate


def _bandwidth(records: list[dict[str, Any]], copy_gbps: float | None) -> str | None:
    pts = [(r["backend"], r["fmt"], r["n"], r["perf"]["gbps"]) for r in records if r["check"] == "perf" and r.get("perf")]
    return bandwidth_vs_n_png(pts, copy_gbps)


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
    return _env().get_template("report.html").render(
        report=report,
        meta=report["meta"],
        verdict=overall_verdict(report),
        by_check=_summary(records, "check"),
        by_format=_summary(records, "fmt"),
        by_backend=_summary(records, "backend"),
        tables=_check_tables(records),
        histograms=pics,
        aggregate_png=aggregate,
        bandwidth_png=_bandwidth(records, report["meta"].get("copy_gbps")),
        hist_labels=hist_labels(),
        sections=report["sections"],
        baseline=report.get("baseline"),
        memory_line=_largest_peak(records),
    )
