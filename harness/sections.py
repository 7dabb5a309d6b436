"""Extra report sections (MoE calibration, distributed checkpoints, self-test, external backends).

A section is produced by a runner ``run(suite: str, seed: int, device: str) -> Section`` named in
``SECTION_RUNNERS`` as ``"module:function"`` (imported lazily, so a section whose dependencies are
missing is reported as skipped with the reason instead of breaking the run).  The report renders
each section as one table; a section fails when any of its rows fails.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

VERDICTS = ("pass", "fail", "skip")


@dataclass(frozen=True)
class SectionRow:
    """One checked item: a stable id, its verdict, the values shown, how to rerun it."""

    id: str
    verdict: str
    fields: dict[str, Any] = field(default_factory=dict)
    repro: str = ""
    message: str = ""

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")


@dataclass(frozen=True)
class Section:
    """A titled table of rows; ``columns`` lists the keys of ``fields`` to show, in order."""

    name: str
    title: str
    columns: list[str]
    rows: list[SectionRow]
    notes: str = ""

    @property
    def verdict(self) -> str:
        if any(r.verdict == "fail" for r in self.rows):
            return "fail"
        if self.rows and all(r.verdict == "skip" for r in self.rows):
            return "skip"
        return "pass"

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["verdict"] = self.verdict
        return d


SECTION_RUNNERS: dict[str, str] = {
    "moe": "harness.moe.section:run",
    "dist": "harness.dist.section:run",
    "selftest": "harness.selftest.section:run",
    "external": "harness.external.section:run",
}
"""Section name -> runner.  Each runner decides what it does for a suite (smoke/ci/nightly/ultra)."""
