"""The checks: each returns a frozen ``CheckRecord`` (see ``harness.core.records``).

``run_case_checks`` runs the selected checks of one backend on one case, in ``CHECKS`` order, sharing
the reference's expected values between backends through ``expected``.
"""

from __future__ import annotations

from typing import Iterable, Optional

from moe_fq_parity.harness.core.records import CHECKS, CheckRecord

from .backward import check_backward
from .common import CheckContext, record
from .forward import Expected, check_forward, expected_forward
from .invariants import check_grouped, check_layout, check_recalibrate
from .perf import check_perf

DEFAULT_CHECKS = tuple(c for c in CHECKS if c != "perf")


def run_case_checks(ctx: CheckContext, checks: Iterable[str], expected: Optional[Expected] = None) -> list[CheckRecord]:
    """Records of ``checks`` (names from ``CHECKS``) for ``ctx``; ``perf`` only after ``forward``."""
    wanted = set(checks)
    unknown = wanted - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {CHECKS}")
    out: list[CheckRecord] = []
    forward_verdict = "not run"
    if expected is None and wanted & {"forward", "perf", "invariant.layout", "invariant.grouped"}:
        expected = expected_forward(ctx.inputs)
    if "forward" in wanted or "perf" in wanted:
        rec = check_forward(ctx, expected)
        forward_verdict = rec.verdict if expected.error is None else "a rejection (nothing to time)"
        if "forward" in wanted:
            out.append(rec)
    for mode in ("pass_through", "clipped"):
        if f"backward.{mode}" in wanted:
            out.append(check_backward(ctx, mode))
    for name, fn in (("invariant.layout", check_layout), ("invariant.grouped", check_grouped), ("invariant.recalibrate", check_recalibrate)):
        if name not in wanted:
            continue
        if expected.error is not None:
            out.append(record(ctx, name, "skip", f"the spec rejects this input ({expected.error}); the forward check covers it"))
        else:
            out.append(fn(ctx))
    if "perf" in wanted:
        out.append(check_perf(ctx, forward_verdict))
    return out


__all__ = ["CHECKS", "DEFAULT_CHECKS", "CheckContext", "Expected", "check_backward", "check_forward", "check_grouped",
           "check_layout", "check_perf", "check_recalibrate", "expected_forward", "run_case_checks"]
