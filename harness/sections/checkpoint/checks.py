"""Comparisons the parent process runs on what the ranks report: bitwise, with every offender counted.

* ``diff_bits`` -- one expected/got pair through ``harness.core.equality.bit_diff`` (the one bitwise
  comparison: ``+0 != -0``, NaN payload and sign not compared), first offenders listed with their index;
* ``assemble`` -- pieces with global offsets -> one tensor, reporting pieces that overlap with
  different bits (replicas that disagree: what an unsynced amax looks like) and elements no
  piece covers;
* ``canonical_pieces`` -- where a rank's ``[n_local, ...]`` tensor of one field sits in the
  canonical ``[E, ...]`` tensor (Megatron's expert rule and the field's TP axis);
* ``Verdict`` -- builds the row a check returns (a ``harness.sections.SectionRow``, the one row type):
  id, pass/fail/skip, shown fields, message, and the ``TensorDiff`` of every tensor it compared.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch

from moe_fq_parity.harness.core.equality import bit_diff, same_bits
from moe_fq_parity.harness.sections import SectionRow

from .layout import Coords, Layout


@dataclass(frozen=True)
class TensorDiff:
    """Bitwise comparison of one tensor: ``mismatches`` elements differ; ``note`` explains a
    comparison that could not be made element by element (missing, shape, replicas, coverage)."""

    name: str
    numel: int
    mismatches: int
    first: tuple[str, ...] = ()
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.mismatches == 0 and not self.note

    def describe(self) -> str:
        if self.ok:
            return f"{self.name}: {self.numel} equal"
        parts = [self.note] if self.note else []
        if self.mismatches:
            first = f", first {', '.join(self.first)}" if self.first else ""
            parts.append(f"{self.mismatches}/{self.numel} differ{first}")
        return f"{self.name}: " + "; ".join(parts)


def diff_bits(name: str, expected: torch.Tensor, got: torch.Tensor, note: str = "") -> TensorDiff:
    """Bitwise ``expected`` vs ``got`` (same dtype and shape, else a ``note`` and all counted)."""
    if expected.dtype != got.dtype or tuple(expected.shape) != tuple(got.shape):
        why = f"expected {expected.dtype}{tuple(expected.shape)}, got {got.dtype}{tuple(got.shape)}"
        return TensorDiff(name, expected.numel(), expected.numel(), (), "; ".join(x for x in (note, why) if x))
    e, g = expected.detach().cpu(), got.detach().cpu()
    if bool(same_bits(e, g).all()):
        # One comparison of the whole tensor: the per-expert walk below costs a few torch ops per
        # expert, and equal tensors are nearly every comparison of a matrix (about 18,000 of them).
        return TensorDiff(name, expected.numel(), 0, (), note)
    if e.dim() >= 2:  # [E, ...]: offenders name the expert
        d = bit_diff(list(e.unbind(0)), list(g.unbind(0)), label="expert")
    else:
        d = bit_diff([e], [g], label="tensor")
    return TensorDiff(name, expected.numel(), d.mismatches, d.offender_lines(), note)


def missing(name: str, why: str) -> TensorDiff:
    """A tensor that could not be compared at all."""
    return TensorDiff(name, 0, 0, (), why)


def _region(offsets: Iterable[int], shape: Iterable[int]) -> tuple[slice, ...]:
    return tuple(slice(o, o + n) for o, n in zip(offsets, shape))


def assemble(
    pieces: list[tuple[tuple[int, ...], torch.Tensor]], global_shape: tuple[int, ...], dtype: torch.dtype
) -> tuple[torch.Tensor, list[str]]:
    """Place ``(offsets, local)`` pieces into a NaN-filled ``global_shape`` tensor.

    Returns the tensor and problems: a piece outside the shape, overlapping pieces whose bits
    differ (replicas that disagree), elements no piece covers.
    """
    fill = float("nan") if dtype.is_floating_point else 0
    full = torch.full(global_shape, fill, dtype=dtype)
    covered = torch.zeros(global_shape, dtype=torch.bool)
    problems: list[str] = []
    for offsets, local in pieces:
        if len(offsets) != len(global_shape) or any(o + n > g for o, n, g in zip(offsets, local.shape, global_shape)):
            problems.append(f"piece {tuple(local.shape)} at {tuple(offsets)} outside {tuple(global_shape)}")
            continue
        region = _region(offsets, local.shape)
        seen = covered[region]
        if bool(seen.any()):
            differs = seen & ~same_bits(full[region].contiguous(), local.to(dtype).contiguous())
            if bool(differs.any()):
                problems.append(f"replicas at offset {tuple(offsets)} disagree on {int(differs.sum())} element(s)")
        full[region] = local.to(dtype)
        covered[region] = True
    uncovered = int((~covered).sum())
    if uncovered:
        problems.append(f"{uncovered} element(s) held by no rank")
    return full, problems


def canonical_pieces(
    t: torch.Tensor, tp_axis: Optional[int], layout: Layout, coords: Coords, num_experts: int
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(global_shape, offsets)`` of a rank's ``[n_local, ...]`` tensor in the canonical ``[E, ...]``.

    Experts at ``ep_rank * n_local`` (Megatron); ``tp_axis`` (of one expert's tensor) split over TP.
    """
    shape = [num_experts, *t.shape[1:]]
    offsets = [coords.ep * t.shape[0]] + [0] * (t.dim() - 1)
    if tp_axis is not None:
        shape[1 + tp_axis] *= layout.tp
        offsets[1 + tp_axis] = coords.tp * t.shape[1 + tp_axis]
    return tuple(shape), tuple(offsets)


def Verdict(id: str, verdict: str, fields: Optional[dict[str, Any]] = None, message: str = "",  # noqa: N802 - row constructor
            diffs: tuple[TensorDiff, ...] = ()) -> SectionRow:
    """The ``SectionRow`` of one dist check (``repro`` is added when the section is assembled)."""
    return SectionRow(id, verdict, dict(fields or {}), "", message, tuple(diffs))


def verdict_from_diffs(check_id: str, fields: dict[str, Any], diffs: list[TensorDiff], problems: list[str] = ()) -> SectionRow:
    """``pass`` when every diff is clean and there are no problems; the message lists what failed."""
    bad = [d.describe() for d in diffs if not d.ok] + list(problems)
    n_bad = sum(d.mismatches for d in diffs)
    fields = {**fields, "tensors": len(diffs), "elements": sum(d.numel for d in diffs), "mismatches": n_bad}
    if bad:
        return Verdict(check_id, "fail", fields, " | ".join(bad[:8]) + (f" | ... {len(bad) - 8} more" if len(bad) > 8 else ""), tuple(diffs))
    return Verdict(check_id, "pass", fields, "", tuple(diffs))


def negative_control(check_id: str, inner: SectionRow, what: str) -> SectionRow:
    """A deliberately broken run: ``pass`` when the inner check *failed* (the bug was caught)."""
    fields = {**inner.fields, "inner": inner.verdict}
    if inner.verdict == "fail":
        return Verdict(check_id, "pass", fields, f"caught {what}: {inner.message}", inner.diffs)
    if inner.verdict == "skip":
        return Verdict(check_id, "skip", fields, inner.message)
    return Verdict(check_id, "fail", fields, f"NOT caught: {what} went through the check unnoticed", inner.diffs)
