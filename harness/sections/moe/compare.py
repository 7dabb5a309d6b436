"""Helpers of the MoE checks (amax as a format sees it, distinct counts) and the row collector every
MoE check writes to.

The checks compare with ``harness.core.equality.bit_diff``: bit patterns under the harness's
comparison policy (``+0 != -0``; NaN payload and sign not compared), *every* mismatch counted, the
first offenders kept, never stopping at the first difference.  ``RowSink.guard`` turns an exception inside a check into a failing
row carrying the exception type, message and location, instead of losing it.
"""

from __future__ import annotations

import traceback
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import torch

from moe_fq_parity.harness.sections import SectionRow
from moe_fq_parity.harness.core.equality import BitDiff
from moe_fq_parity.harness.core.repro import moe_section_command
from moe_fq_parity.reference.formats import FORMATS, format_spec

from .roles import Role

POWER_OF_TWO_BLIND: tuple[str, ...] = tuple(f for f in FORMATS if format_spec(f).power_of_two_blind)
"""Formats whose fake quant does not change (outside subnormals and saturation) when amax is
multiplied by ``2**k`` (``FormatSpec.power_of_two_blind``: FP8 and NVFP4): the scale, the scaled
values and the dequantization all shift by the same exact power of two.  For them, amax that
differ only by a power of two are no evidence that a per-expert check can tell experts apart."""


def visible_amax(a: torch.Tensor, fmt: str) -> torch.Tensor:
    """What of an fp32 amax ``fmt`` can see: the mantissa bits for ``POWER_OF_TWO_BLIND``, else the bits."""
    bits = a.detach().to(torch.float32).contiguous().view(torch.int32)
    return bits & 0x7FFFFF if format_spec(fmt).power_of_two_blind else bits


def count_distinct(tensors: Sequence[torch.Tensor], fmt: str | None = None) -> int:
    """Number of distinct tensors in the list: bitwise, or as ``fmt`` sees them (``visible_amax``)."""
    seen: list[torch.Tensor] = []
    for t in tensors:
        key = visible_amax(t, fmt) if fmt else t.detach().to(torch.float32).contiguous().view(torch.int32)
        if not any(torch.equal(key, s) for s in seen):
            seen.append(key)
    return len(seen)


def elementwise_max(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``torch.maximum`` folded over the list (exact; NaN-propagating)."""
    acc = tensors[0]
    for t in tensors[1:]:
        acc = torch.maximum(acc, t)
    return acc


def short(values: Sequence[torch.Tensor], limit: int = 8) -> str:
    """``[v0, v1, ...]`` of scalar (or first-element) values, at most ``limit`` shown."""
    vals = [f"{float(v.reshape(-1)[0]) if v.numel() else float('nan'):.6g}" for v in values[:limit]]
    more = f", ... ({len(values)} total)" if len(values) > limit else ""
    return "[" + ", ".join(vals) + more + "]"


@dataclass
class RowSink:
    """Collects ``SectionRow`` s under one id prefix (``{backend}/{spec}/{shape}``) and seed."""

    prefix: str
    suite: str
    seed: int
    device: str
    base_fields: dict[str, Any] = field(default_factory=dict)
    rows: list[SectionRow] = field(default_factory=list)

    def row_id(self, role: Role | str, check: str) -> str:
        rid = role.id if isinstance(role, Role) else role
        return f"{self.prefix}/{rid}/{check}/s{self.seed}"

    def repro(self, row_id: str) -> str:
        return moe_section_command(self.suite, self.seed, self.device, row_id)

    def add(self, role: Role | str, check: str, *, ok: bool, expected: str, measured: str, mismatches: int | str = "", detail: str = "") -> None:
        rid = self.row_id(role, check)
        fields = dict(self.base_fields)
        fields.update(role=role.id if isinstance(role, Role) else role, check=check, expected=expected, measured=measured, mismatches=mismatches, detail=detail)
        self.rows.append(SectionRow(id=rid, verdict="pass" if ok else "fail", fields=fields, repro=self.repro(rid), message="" if ok else detail))

    def add_diff(self, role: Role | str, check: str, diff: BitDiff, *, expect_equal: bool = True, what: str = "bitwise equal") -> None:
        ok = diff.equal if expect_equal else not diff.equal
        self.add(
            role, check, ok=ok,
            expected=what if expect_equal else f"not {what}",
            measured=("equal" if diff.equal else f"{diff.mismatches}/{diff.numel} differ") + (" (shape/dtype problems)" if diff.problems else ""),
            mismatches=diff.mismatches, detail=diff.summary(),
        )

    @contextmanager
    def guard(self, role: Role | str, check: str) -> Iterator[None]:
        """Run a check body; an exception becomes a failing row (type, message, innermost frame)."""
        try:
            yield
        except Exception as exc:  # recorded in full below, never swallowed silently
            tb = traceback.extract_tb(exc.__traceback__)[-1]
            self.add(role, check, ok=False, expected="no exception", measured=type(exc).__name__,
                     detail=f"{type(exc).__name__}: {exc} (at {tb.filename}:{tb.lineno})")
