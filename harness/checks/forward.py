"""Forward parity: the backend's fake quant against the reference, per case and per expert.

Verdicts (``harness.core.tolerances``): ``strict`` -- every element exact; ``1-ulp`` -- within one output
ULP.  What "exact" means for NaN and signed zero is the policy of ``harness.core.equality``.  Tie flips
(a one-step disagreement where the reference's pre-rounding value sits at a tie) are counted apart
and fail under both modes.  Where the spec rejects an input (NVFP4 NaN), the backend must reject it
too.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Optional

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FakeQuantResult, split_expert_amax

from moe_fq_parity.harness.core.bits import bits_equal
from moe_fq_parity.harness.core.equality import DEFAULT_NAN_BITS, compare_each
from moe_fq_parity.harness.core.ulp import Comparison, compare

from .common import (
    MAX_OFFENDERS, CheckContext, call_backend, call_options, expert_offenders, mismatch_message, not_run_reason, problems_of,
    record, reference_options, summarize, undeclared_reason,
)

CHECK = "forward"


@dataclass(frozen=True)
class Expected:
    """Reference outputs per expert (input dtype), or why the reference rejects the input.

    Only the outputs are kept (one output-sized tensor per case); the fp32 pre-rounding values that
    explain a mismatch are recomputed by ``trace_expert`` for the experts that mismatch.
    """

    outputs: Optional[list[torch.Tensor]]
    error: Optional[str]
    loop_us: Optional[float] = None
    """Wall time of this per-expert reference loop, microseconds (host clock, device synchronised
    at the end): the eager-loop baseline of the ``perf`` check, so timing it costs no extra call."""


def expected_forward(inputs) -> Expected:
    """Run the reference expert by expert (the per-expert loop defines the grouped result).

    Memory: the outputs plus one expert's fp32 temporaries at a time.
    """
    case = inputs.case
    start = time.perf_counter()
    try:
        per = split_expert_amax(inputs.weights, inputs.amax, fmt=case.fmt)
        outputs = [reference.fake_quant(w, a, case.fmt, case.variant, **reference_options(case)) for w, a in zip(inputs.weights, per)]
    except (ValueError, TypeError) as exc:
        return Expected(None, f"{type(exc).__name__}: {exc}")
    if inputs.device.type == "cuda":
        torch.cuda.synchronize(inputs.device)
    return Expected(outputs, None, (time.perf_counter() - start) * 1e6)


def trace_expert(inputs, e: int, amax: Optional[torch.Tensor] = None) -> FakeQuantResult:
    """The reference's traced result (output and fp32 pre-rounding values) of expert ``e``
    (``amax``: the amax of all experts to use instead of the case's, as after recalibration)."""
    case = inputs.case
    amax = split_expert_amax(inputs.weights, inputs.amax if amax is None else amax, fmt=case.fmt)[e]
    return reference.fake_quant_traced(inputs.weights[e], amax, case.fmt, case.variant, **reference_options(case))


def compare_expert(inputs, e: int, expected: torch.Tensor, got: torch.Tensor, nan_bits: str = DEFAULT_NAN_BITS,
                   amax: Optional[torch.Tensor] = None) -> tuple[Comparison, Optional[torch.Tensor]]:
    """Classify expert ``e``'s elements; the pre-rounding values are traced only when it mismatches.

    Returns the comparison and the pre-rounding values (``None`` when the expert matched).  The
    traced output must equal ``expected`` bit for bit (it is the same reference call), else
    ``RuntimeError``: the reference itself would be non-deterministic.  ``nan_bits``: the NaN policy
    (``harness.core.equality``); ``amax``: as in ``trace_expert``.
    """
    comp = compare(expected, got, nan_bits=nan_bits)
    if comp.counts["exact"] == comp.numel:
        return comp, None
    traced = trace_expert(inputs, e, amax)
    if not bool(bits_equal(traced.out, expected).all()):
        raise RuntimeError(f"the reference gave different bits for expert {e} when traced: it must be deterministic")
    return compare(expected, got, traced.pre_round, traced.grid_round, nan_bits=nan_bits, inputs=inputs.weights[e]), traced.pre_round


def check_forward(ctx: CheckContext, expected: Expected):
    """Compare ``backend.fake_quant`` with ``expected``; returns a ``CheckRecord``."""
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, CHECK, "skip", undeclared_reason(be, case.fmt))
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
    offenders: list = []

    def full(e: int) -> Comparison:
        comp, pre = compare_expert(inputs, e, expected.outputs[e], call.value[e], ctx.nan_bits)
        offenders.extend(expert_offenders(e, comp, inputs.weights[e], expected.outputs[e], call.value[e], pre, MAX_OFFENDERS - len(offenders)))
        return comp

    comps = compare_each(len(expected.outputs), expected.outputs.__getitem__, call.value, full)
    fields = summarize(comps, inputs.amax)
    verdict = "pass" if all(c.passes(ctx.mode) for c in comps) else "fail"
    return record(ctx, CHECK, verdict, mismatch_message(fields, case.numel), offenders=tuple(offenders), **fields, **timing)
