"""How a failing record reads in a terminal: its message, the offender table and the repro command.

One formatter for both entry points: a failing pytest parity test (``harness.run.pytest_plugin``)
and a failing ``moe-fq-parity run``, which prints the first ``FAILURES_SHOWN`` failing records this
way after its counts, so a CI log shows what failed and how to rerun it without the report.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

from .equality import MAX_OFFENDERS
from .records import CheckRecord

OFFENDER_COLUMNS = ("expert", "row", "col", "input", "expected", "got", "pre_round", "ulp", "cls")
"""Columns of the offender table, in order (fields of ``records.Offender``)."""

FAILURES_SHOWN = 5
"""A failing ``run`` prints this many failing records in full (each at most ``MAX_OFFENDERS``
offender rows: about 15 lines a record); the rest are counted in one line."""


def offender_table(offenders: Iterable[Any], limit: int = MAX_OFFENDERS) -> list[str]:
    """The first ``limit`` offenders as aligned text rows under a header (values as Python reprs,
    so a bf16 value prints exactly)."""
    rows = [OFFENDER_COLUMNS] + [tuple("-" if getattr(o, c) is None else repr(getattr(o, c)) if isinstance(getattr(o, c), float)
                                       else str(getattr(o, c)) for c in OFFENDER_COLUMNS) for o in list(offenders)[:limit]]
    widths = [max(len(r[k]) for r in rows) for k in range(len(OFFENDER_COLUMNS))]
    return ["  ".join(v.rjust(w) for v, w in zip(r, widths)) for r in rows]


def failure_lines(rec: CheckRecord) -> list[str]:
    """A failing record as text: what failed and why, its offender table (when it has offenders) and
    the command that reruns exactly this case and check."""
    if rec.outcome == "oom":
        lines = [f"{rec.check} ran out of memory for {rec.case_id} on {rec.backend}: {rec.message}"]
    elif rec.outcome in ("crash", "timeout"):  # the backend's process ended: say so first, the message says how
        lines = [f"{rec.check} failed ({rec.outcome}) for {rec.case_id} on {rec.backend}: {rec.message}"]
    else:
        lines = [f"{rec.check} failed for {rec.case_id} on {rec.backend}: {rec.message}"]
    if rec.offenders:
        lines.append(f"first {min(len(rec.offenders), MAX_OFFENDERS)} offenders:")
        lines += ["  " + ln for ln in offender_table(rec.offenders)]
    lines.append(f"repro: {rec.repro}")
    return lines


def failures_summary(records: Sequence[dict[str, Any]], limit: int = FAILURES_SHOWN) -> list[str]:
    """The first ``limit`` failing records of a report (``records[]`` JSON) as ``failure_lines``, then
    one line counting the failing records not shown; empty when none failed."""
    failing = [r for r in records if r["verdict"] == "fail"]
    lines: list[str] = []
    for k, r in enumerate(failing[:limit]):
        lines += [f"FAIL {k + 1}/{len(failing)}: " + "\n  ".join(failure_lines(CheckRecord.from_json(r)))]
    if len(failing) > limit:
        lines.append(f"... and {len(failing) - limit} more failing records (all of them in the report)")
    return lines
