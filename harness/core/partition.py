"""One partition rule for every split of work into parts: the cases of a sharded run, the GPU groups
of ``pytest -n G``, and the blocks of a report section split across shards.

Longest processing time first: the items are taken by weight, largest first (ties by ``order``,
default the item's index), and each goes to the part with the least weight so far (ties to the
lowest part).  The result depends only on the weights and the order keys, so every process that
computes it for the same items gets the same partition.  Its largest part exceeds the smallest by at
most the largest weight.  Weights are >= 0; parts beyond the number of items are empty, and memory
and time are O(items x min(count, items)) whatever ``count`` is.

``Part(index, count)`` names one part (1-based): a shard of a run (``harness.run.shard``), a part of
a split report section (``harness.sections``); ``Part.owned`` says which items are its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence


def balance(weights: Sequence[float], count: int, order: Optional[Sequence[Any]] = None) -> list[int]:
    """The part (1-based, ``1..count``) of each item (see the module docstring)."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    if order is not None and len(order) != len(weights):
        raise ValueError(f"order has {len(order)} keys for {len(weights)} weights")
    if any(w < 0 for w in weights):
        raise ValueError("weights must be >= 0")
    keys = order if order is not None else range(len(weights))
    # Parts past the item count stay empty (an empty lower part always wins the tie), so only
    # min(count, items) parts are kept: memory and time do not grow with count.
    load = [0.0] * min(count, len(weights))
    out = [0] * len(weights)
    for k in sorted(range(len(weights)), key=lambda k: (-weights[k], keys[k])):
        best = min(range(len(load)), key=lambda s: (load[s], s))
        load[best] += weights[k]
        out[k] = best + 1
    return out


@dataclass(frozen=True)
class Part:
    """Part ``index`` (1-based) of ``count``; ``ValueError`` unless ``1 <= index <= count``.
    ``str`` gives ``"index/count"``."""

    index: int
    count: int

    def __post_init__(self) -> None:
        if not 1 <= self.index <= self.count:
            raise ValueError(f"part {self.index}/{self.count}: expected 1 <= index <= count")

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def owned(self, weights: Sequence[float], order: Optional[Sequence[Any]] = None) -> list[bool]:
        """Which of the items of these weights (in their unsplit order) are this part's (``balance``
        with the same ``order`` keys: every part computes the same partition)."""
        return [p == self.index for p in balance(weights, self.count, order)]
