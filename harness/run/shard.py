"""Sharded runs: ``--shard i/n`` runs a deterministic 1/n of the selected cases, balanced by bytes.

Assignment (longest processing time first, by bytes): the cases are ordered by input + output bytes,
largest first (ties by case id), and each goes to the shard with the fewest bytes so far (ties to
the lowest index).  It depends only on the selected cases, so every shard of a run computes the same
partition (``harness.core.partition.balance``); a shard runs its cases in the suite's order.  A report
section that can be split (``harness.sections.SPLIT_SECTIONS``) runs in every shard, shard ``i``
producing its part ``i/n`` (``merge`` puts the parts' rows back in the unsplit order); the other
sections run round-robin over the shards, in the order they were chosen (the ``k``-th of them in
shard ``k mod n + 1``).

Each shard's report carries ``meta.shard``: its index and count, the full selection's case ids (in
run order) and their digest, so ``moe-fq-parity merge`` can prove the shards partition one selection
(``moe_fq_parity.reports.merge``).
"""

from __future__ import annotations

import hashlib
import re
from typing import Optional, Sequence

from moe_fq_parity.cases import Case
from moe_fq_parity.harness import sections as report_sections
from moe_fq_parity.harness.core.memory import case_bytes
from moe_fq_parity.harness.core.partition import Part, balance

_SPEC = re.compile(r"^\s*(\d+)\s*/\s*(\d+)\s*$")

Shard = Part
"""Shard ``index`` (1-based) of ``count``: a part of the run (``harness.core.partition.Part``); a split
section's part in this shard is the same ``Part``."""


def parse_shard(text: str) -> Shard:
    """``"i/n"`` with ``1 <= i <= n`` -> ``Shard``; ``ValueError`` naming the expected form otherwise."""
    m = _SPEC.match(text or "")
    if not m:
        raise ValueError(f"--shard {text!r}: expected i/n with integers 1 <= i <= n (e.g. 1/2)")
    index, count = int(m.group(1)), int(m.group(2))
    if not 1 <= index <= count:
        raise ValueError(f"--shard {text!r}: expected i/n with 1 <= i <= n, got i={index}, n={count}")
    return Shard(index, count)


def assign(cases: Sequence[Case], count: int) -> list[int]:
    """The shard index (1-based) of each case (see the module docstring)."""
    return balance([case_bytes(c) for c in cases], count, order=[c.id for c in cases])


def select_shard(cases: Sequence[Case], shard: Shard) -> tuple[Case, ...]:
    """The cases of ``shard``, in their original order."""
    return tuple(c for c, s in zip(cases, assign(cases, shard.count)) if s == shard.index)


def sections_of_shard(sections: Sequence[str], shard: Optional[Shard]) -> tuple[str, ...]:
    """The report sections this shard runs (all of them without sharding): every split section (its
    part ``shard.index`` of ``shard.count``), and its round-robin share of the others."""
    if shard is None:
        return tuple(sections)
    split = report_sections.SPLIT_SECTIONS
    whole = [name for name in sections if name not in split]
    return tuple(name for name in sections if name in split or whole.index(name) % shard.count + 1 == shard.index)


def selection_digest(case_ids: Sequence[str]) -> str:
    """sha256 of the selection's case ids in run order (one per line)."""
    return hashlib.sha256("\n".join(case_ids).encode()).hexdigest()


def shard_meta(selection: Sequence[Case], shard: Shard, sections: Sequence[str]) -> dict:
    """``meta.shard`` of a shard's report."""
    ids = [c.id for c in selection]
    mine = select_shard(selection, shard)
    return {
        "index": shard.index, "count": shard.count, "selection": ids, "selection_digest": selection_digest(ids),
        "cases": len(mine), "bytes": sum(case_bytes(c) for c in mine), "sections": list(sections),
    }
