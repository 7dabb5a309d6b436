"""The checks: each returns a frozen ``CheckRecord`` (see ``harness.core.records``).

``run_case_checks`` runs the selected checks of one backend on one case, in ``CHECKS`` order, sharing
the reference's expected values between backends through ``expected``.  Each record carries the
check's peak CUDA memory (``peak_bytes``); a check that runs out of memory gives an ``oom`` record
(``harness.core.memory``), and the next check starts with the memory released.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Iterable, Optional

from moe_fq_parity.harness.core.memory import (
    OOM_ERRORS, CheckOutOfMemory, allocated, forget, oom_message, peak_since, release, start_peak,
)
from moe_fq_parity.harness.core.guard import InputsModified
from moe_fq_parity.harness.core.records import CHECKS, CheckRecord
from moe_fq_parity.harness.core.repro import repro_command

from .backward import check_backward
from .common import CheckContext, inputs_unchanged, record
from .forward import Expected, check_forward, expected_forward
from .invariants import check_grouped, check_layout, check_recalibrate
from .perf import check_perf
from .plan import format_declared, planned_checks

DEFAULT_CHECKS = tuple(c for c in CHECKS if c != "perf")


def case_oom_record(case, backend_spec: str, check: str, seed: int, mode: str, case_bytes: int, device, where: str, detail: str,
                    peak_bytes: Optional[int] = None) -> CheckRecord:
    """The ``oom`` record of ``check`` on ``case`` (call after the memory was released: the message
    states the memory free then)."""
    return CheckRecord(case_id=case.id, backend=backend_spec, check=check, verdict="fail", fmt=case.fmt, n=case.n, numel=case.numel,
                       mode=mode, message=oom_message(case.id, case_bytes, device, where, detail),
                       repro=repro_command(case.id, backend_spec, check, seed, mode), outcome="oom", peak_bytes=peak_bytes,
                       case_bytes=case_bytes)


def measured(ctx: CheckContext, check: str, fn: Callable[[], CheckRecord]) -> CheckRecord:
    """``fn()`` with its peak memory recorded; out of memory gives an ``oom`` record instead of raising."""
    device = ctx.inputs.device
    base = ctx.mem_base if ctx.mem_base is not None else allocated(device)
    start_peak(device)
    failure: Optional[tuple[str, str]] = None
    try:
        rec = inputs_unchanged(ctx, fn)
    except InputsModified as exc:
        return replace(record(ctx, check, "fail", exc.detail), peak_bytes=peak_since(device, base))
    except CheckOutOfMemory as exc:
        failure = (exc.where, exc.detail)
    except OOM_ERRORS as exc:
        failure = ("the check's own computation", f"{type(exc).__name__}: {exc}")
        forget(exc)
    if failure is not None:
        peak = peak_since(device, base)
        release(device)
        return case_oom_record(ctx.case, ctx.backend.spec, check, ctx.seed, ctx.mode, ctx.inputs.nbytes, device, *failure, peak_bytes=peak)
    return replace(rec, peak_bytes=peak_since(device, base))


def run_case_checks(ctx: CheckContext, checks: Iterable[str], expected: Optional[Expected] = None) -> list[CheckRecord]:
    """Records of ``checks`` (names from ``CHECKS``) for ``ctx``; ``perf`` only after ``forward``.

    A variant or option the backend declares away (``plan.planned_checks``) gives no record for the
    checks that pass it: the caller counts them (``plan.applicable``).  A format outside the
    backend's ``formats`` still gives skip records here; the runner and the pytest plugin do not
    call for it at all."""
    wanted = set(checks)
    unknown = wanted - set(CHECKS)
    if unknown:
        raise ValueError(f"unknown checks {sorted(unknown)}; known: {CHECKS}")
    if format_declared(ctx.backend, ctx.case):
        wanted = set(planned_checks(ctx.backend, ctx.case, wanted)[0])
    out: list[CheckRecord] = []
    forward_verdict = "not run"
    if expected is None and wanted & {"forward", "perf", "invariant.layout", "invariant.grouped", "invariant.recalibrate"}:
        expected = expected_forward(ctx.inputs)
    if "forward" in wanted or "perf" in wanted:
        rec = measured(ctx, "forward", lambda: check_forward(ctx, expected))
        forward_verdict = rec.verdict if expected.error is None else "a rejection (nothing to time)"
        if "forward" in wanted:
            out.append(rec)
    for mode in ("pass_through", "clipped"):
        if f"backward.{mode}" in wanted:
            out.append(measured(ctx, f"backward.{mode}", lambda: check_backward(ctx, mode)))
    for name, fn in (("invariant.layout", check_layout), ("invariant.grouped", check_grouped), ("invariant.recalibrate", check_recalibrate)):
        if name not in wanted:
            continue
        if expected.error is not None:
            out.append(record(ctx, name, "skip", f"the spec rejects this input ({expected.error}); the forward check covers it"))
        else:
            out.append(measured(ctx, name, lambda: fn(ctx)))
    if "perf" in wanted:
        out.append(measured(ctx, "perf", lambda: check_perf(ctx, forward_verdict, expected.loop_us if expected is not None else None)))
    return out


__all__ = ["CHECKS", "DEFAULT_CHECKS", "CheckContext", "Expected", "check_backward", "check_forward", "check_grouped",
           "check_layout", "check_perf", "check_recalibrate", "expected_forward", "measured", "case_oom_record", "run_case_checks"]
