"""Incremental, atomic report writing.

``ReportWriter`` keeps the report in memory and rewrites ``report.json`` (tmp file + ``os.replace``)
as records arrive (at most every ``interval_s``), so a run that dies leaves the JSON of what finished,
marked ``complete: false``.  ``finish`` writes the final JSON and the HTML (built from that JSON).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Optional

from .schema import SCHEMA_VERSION, dumps


def now_iso() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def new_report(meta: dict[str, Any]) -> dict[str, Any]:
    """An empty, incomplete report around ``meta``."""
    return {"schema_version": SCHEMA_VERSION, "complete": False, "error": None, "meta": dict(meta), "records": [],
            "sections": [], "baseline": None}


def write_report(out_dir: str | Path, report: dict[str, Any]) -> tuple[Path, Path]:
    """Write a finished ``report`` as ``out_dir/report.json`` and ``out_dir/report.html`` (atomically each)."""
    from .html import render_html  # deferred: matplotlib and jinja2 load only when HTML is written

    out = Path(out_dir)
    json_path, html_path = out / "report.json", out / "report.html"
    atomic_write_text(json_path, dumps(report))
    atomic_write_text(html_path, render_html(json.loads(json_path.read_text())))
    return json_path, html_path


WRITE_SHARE = 0.05
"""Periodic rewrites of ``report.json`` take at most about this share of a run's time (the interval
between them grows with the report: at least ``1 / WRITE_SHARE`` x the last write's duration)."""


class ReportWriter:
    """Accumulates records and sections and writes ``out_dir/report.json`` (and ``report.html``).

    Periodic writes (while records arrive) are compact JSON; the final one is indented.
    ``write_s`` sums the time spent writing JSON.
    """

    def __init__(self, out_dir: str | Path, meta: dict[str, Any], *, interval_s: float = 2.0) -> None:
        self.out_dir = Path(out_dir)
        self.report = new_report(meta)
        self.interval_s = interval_s
        self._interval = interval_s
        self._last = 0.0
        self.write_s = 0.0
        self.json_path = self.out_dir / "report.json"
        self.html_path = self.out_dir / "report.html"

    def add(self, records: Iterable[dict[str, Any]]) -> None:
        self.report["records"].extend(records)
        if time.monotonic() - self._last >= self._interval:
            self.write_json(compact=True)

    def set_sections(self, sections: list[dict[str, Any]]) -> None:
        self.report["sections"] = sections
        self.write_json()

    def set_baseline(self, baseline: Optional[dict[str, Any]]) -> None:
        self.report["baseline"] = baseline

    def write_json(self, *, compact: bool = False) -> None:
        start = time.monotonic()
        atomic_write_text(self.json_path, dumps(self.report, indent=None if compact else 1))
        self._last = time.monotonic()
        took = self._last - start
        self.write_s += took
        self._interval = max(self.interval_s, took / WRITE_SHARE) if self.interval_s > 0 else 0.0  # 0: every add

    def finish(self, *, complete: bool, error: Optional[str] = None, html: bool = True) -> None:
        """Write the final JSON (``complete``/``error`` set) and, unless ``html=False``, the HTML."""
        self.report["complete"] = complete
        self.report["error"] = error
        self.report["meta"]["finished"] = now_iso()
        self.write_json()
        if html:
            self.write_html()

    def write_html(self) -> None:
        """``report.html`` of the JSON as written now (at the start of a run: an incomplete report with
        no records yet, so an HTML of an earlier run never stands beside this run's JSON)."""
        from .html import render_html  # deferred: as in write_report

        atomic_write_text(self.html_path, render_html(json.loads(self.json_path.read_text())))
