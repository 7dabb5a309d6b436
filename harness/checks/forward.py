"""Forward parity: the backend's fake quant against the reference, per case and per expert.

Verdicts (``harness.core.tolerances``): ``strict`` -- every element exact; ``1-ulp`` -- within one output
ULP.  Tie flips (a one-step disagreement where the reference's pre-rounding value sits at a tie) are
counted apart and fail under both modes.  Where the spec rejects an input (NVFP4 NaN), the backend
must reject it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moe_fq_parity import reference
from moe_fq_parity.reference import FakeQuantResult, split_expert_amax

from moe_fq_parity.harness.core.ulp import compare

from .common import (
    CheckContext, call_backend, call_options, mismatch_message, not_run_reason, offenders_of, problems_of, record,
    reference_options, summarize,
)

CHECK = "forward"


@dataclass(frozen=True)
class Expected:
    """Reference results per expert (traced), or why the reference rejects the input."""

    traced: Optional[list[FakeQuantResult]]
    error: Optional[str]


def expected_forward(inputs) -> Expected:
    """Run the reference expert by expert (the per-expert loop defines the grouped result)."""
    case = inputs.case
    try:
        per = split_expert_amax(inputs.weights, inputs.amax)
        traced = [reference.fake_quant_traced(w, a, case.fmt, case.variant, **reference_options(case)) for w, a in zip(inputs.weights, per)]
    except (ValueError, TypeError) as exc:
        return Expected(None, f"{type(exc).__name__}: {exc}")
    return Expected(traced, None)


def check_forward(ctx: CheckContext, expected: Expected):
    """Compare ``backend.fake_quant`` with ``expected``; returns a ``CheckRecord``."""
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, CHECK, "skip", f"backend formats {sorted(be.formats)} do not include {case.fmt}")
    call = call_backend(ctx, lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **call_options(case)))
    timing = {"duration_s": call.seconds}
    if expected.error is not None:
        if call.ok:
            return record(ctx, CHECK, "fail", f"the reference rejects this input ({expected.error}) but the backend returned outputs", **timing)
        if isinstance(call.error, NotImplementedError):
            return record(ctx, CHECK, "skip", f"backend does not implement this: {call.message}", **timing)
        return record(ctx, CHECK, "pass", f"rejected as the spec requires (reference {expected.error}; backend {call.message})", **timing)
    if (reason := not_run_reason(ctx, call)) is not None:
        return record(ctx, CHECK, "skip", reason, **timing)
    if (problem := problems_of(call, inputs.weights)) is not None:
        return record(ctx, CHECK, "fail", problem, **timing)
    traced = expected.traced
    comps = [compare(t.out, g, t.pre_round, t.grid_round) for t, g in zip(traced, call.value)]
    fields = summarize(comps, inputs.amax)
    verdict = "pass" if all(c.passes(ctx.mode) for c in comps) else "fail"
    offenders = offenders_of(comps, inputs.weights, [t.out for t in traced], call.value, [t.pre_round for t in traced])
    return record(ctx, CHECK, verdict, mismatch_message(fields, case.numel), offenders=offenders, **fields, **timing)
