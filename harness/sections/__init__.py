"""Extra report sections (MoE calibration, distributed checkpoints, self-test, external backends):
their registry and types.  Running them (each in a process of its own, started ahead of its turn) is
``harness.sections.processes``.

A section is produced by a runner ``run(suite: str, seed: int, device: str) -> Section`` named in
``SECTION_RUNNERS`` as ``"module:function"`` (imported lazily, so a section whose dependencies are
missing is reported as skipped with the reason instead of breaking the run).  The report renders
each section as one table; a section fails when any of its rows fails.  A runner's module may
also define ``prepare()``: the slow start-up of the section (imports, a process server), which a run
calls in the section's own process while its cases still run (``processes.start_sections``);
``prepare()`` must not initialise CUDA (the cases may need the whole GPU).  It may define
``host_only(device)`` too: true when, on a run on ``device``, it uses no GPU (then it starts beside
a GPU run's cases instead of after them).

``harness.sections.processes`` reads ``SECTION_RUNNERS``, ``SPLIT_SECTIONS`` and ``PARALLEL_MIN_CPUS``
from this module each time it starts sections, so replacing one of them here takes effect.

A section named in ``SPLIT_SECTIONS`` can be split across the shards of a run: its runner also takes
``part=Part(i, n)`` and then runs only its share of the work, returning its rows in keyed blocks
(``section_from_blocks``).  The keys order the blocks of the unsplit section, so ``merge`` rebuilds
the unsplit table by sorting every part's blocks by key; a runner builds its unsplit section the same
way (all blocks, sorted), so the merged rows equal the unsplit ones by construction.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

from moe_fq_parity.harness.core.partition import Part
from moe_fq_parity.reports.schema import VERDICTS, section_verdict


BlockKey = tuple[int, ...]
"""Orders the blocks of a split section: the unsplit section is its blocks sorted by key."""


@dataclass(frozen=True)
class SectionRow:
    """One checked item of any section (the one row type of MoE, dist, self-test and external rows):
    a stable id, its verdict, the values shown, how to rerun it, why it failed, and the comparisons
    behind it (``diffs``: dataclasses such as the dist section's ``TensorDiff``; kept in process and in
    a section's own JSON, not in the report's rows)."""

    id: str
    verdict: str
    fields: dict[str, Any] = field(default_factory=dict)
    repro: str = ""
    message: str = ""
    diffs: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")

    @property
    def failed(self) -> bool:
        return self.verdict == "fail"

    def to_json(self, *, diffs: bool = True) -> dict[str, Any]:
        d = {"id": self.id, "verdict": self.verdict, "fields": self.fields, "repro": self.repro, "message": self.message}
        if diffs:
            d["diffs"] = [asdict(x) if hasattr(x, "__dataclass_fields__") else x for x in self.diffs]
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SectionRow":
        """The row of ``to_json`` (``diffs`` come back as dicts)."""
        return cls(d["id"], d["verdict"], dict(d.get("fields", {})), d.get("repro", ""), d.get("message", ""), tuple(d.get("diffs", ())))


@dataclass(frozen=True)
class Section:
    """A titled table of rows; ``columns`` lists the keys of ``fields`` to show, in order."""

    name: str
    title: str
    columns: list[str]
    rows: list[SectionRow]
    notes: str = ""
    part: Optional[Part] = None
    """Set when this is one part of a split section; ``blocks`` then gives its rows' blocks."""
    blocks: tuple[tuple[BlockKey, int], ...] = ()
    """``(key, number of rows)`` of each block of ``rows``, in order (parts only)."""

    @property
    def verdict(self) -> str:
        return section_verdict(r.verdict for r in self.rows)

    def to_json(self) -> dict[str, Any]:
        d = {"name": self.name, "title": self.title, "columns": list(self.columns), "rows": [r.to_json(diffs=False) for r in self.rows],
             "notes": self.notes, "verdict": self.verdict}
        if self.part is not None:
            d["part"] = {"index": self.part.index, "count": self.part.count, "blocks": [[list(k), n] for k, n in self.blocks]}
        return d


def section_from_blocks(name: str, title: str, columns: list[str], blocks: Iterable[tuple[BlockKey, list[SectionRow]]], notes: str = "",
                        part: Optional[Part] = None) -> Section:
    """A section whose rows are ``blocks`` sorted by key (keys unique): the unsplit section when
    ``part`` is None, else that part of it (with its blocks, for ``merge``).  ``notes`` must not
    depend on the part: every part of a section carries the notes of the unsplit one."""
    ordered = sorted(blocks, key=lambda b: b[0])
    keys = [k for k, _ in ordered]
    if len(set(keys)) != len(keys):
        raise ValueError(f"section {name}: block keys repeat: {sorted(k for k in set(keys) if keys.count(k) > 1)}")
    rows = [r for _, block in ordered for r in block]
    sizes = tuple((k, len(block)) for k, block in ordered) if part is not None else ()
    return Section(name=name, title=title, columns=columns, rows=rows, notes=notes, part=part, blocks=sizes)


SECTION_RUNNERS: dict[str, str] = {
    "moe": "moe_fq_parity.harness.sections.moe.section:run",
    "dist": "moe_fq_parity.harness.sections.checkpoint.section:run",
    "selftest": "moe_fq_parity.harness.sections.selftest.section:run",
    "external": "moe_fq_parity.harness.sections.external.section:run",
    "atlas": "moe_fq_parity.harness.sections.atlas:run",
}
"""Section name -> runner.  Each runner decides what it does for a suite (smoke/ci/nightly/ultra)."""

SPLIT_SECTIONS: frozenset[str] = frozenset({"moe", "dist"})
"""Sections whose runner takes ``part=Part(i, n)`` (see the module docstring): a sharded run gives each
shard its part of them instead of giving each of them to one shard (chosen by measurement:
docs/measured.md §13; ``dist``'s gloo ranks are CPU work, and shards on one host share the CPUs)."""


SECTION_PROCESSES: dict[str, int] = {"moe": 3}
"""An unsharded run whose sections each get a process gives these sections up to this many, each a
part (``Part(i, k)``), one per ``PARALLEL_MIN_CPUS`` CPUs; their rows are joined as ``merge`` joins a
sharded run's parts.  ``moe`` drives the GPU from one busy Python thread after the cases, on the
nightly's critical path (docs/measured.md section 12b)."""


def _single(name: str, verdict: str, message: str, part: Optional[Part] = None) -> Section:
    """A section of one row (a runner that could not run, or broke); as a part, one block keyed
    ``(-1, part.index)`` (first in the merged table) with an id naming the part."""
    if part is None:
        return Section(name=name, title=name, columns=[], rows=[SectionRow(id=name, verdict=verdict, message=message)])
    row = SectionRow(id=f"{name}/part{part.index}of{part.count}", verdict=verdict, message=f"part {part}: {message}")
    return section_from_blocks(name, name, [], [((-1, part.index), [row])], part=part)


PARALLEL_MIN_CPUS = 4
"""Sections run at once only on hosts where this process's share of the CPUs is at least this many
(``processes.start_sections``)."""
