"""Backward parity: the straight-through estimator, bit for bit.

``pass_through``: grad_in is grad_out.  ``clipped``: grad_out where ``|x| <= amax`` (inclusive) else
``+0``.  Any bit difference fails (a ``-0`` for ``+0`` included; NaN payloads per the policy of
``harness.core.equality``).  Offenders carry the element's
amax in ``pre_round``.
"""

from __future__ import annotations

from moe_fq_parity import reference
from moe_fq_parity.reference import split_expert_amax

from moe_fq_parity.harness.core.equality import bitwise, compare_each

from .common import (
    MAX_OFFENDERS, CheckContext, call_backend, call_options, expert_offenders, mismatch_message, not_run_reason, problems_of, record,
    summarize, undeclared_reason,
)


def check_backward(ctx: CheckContext, mode: str):
    """Compare ``backend.ste_backward(..., mode)`` with ``reference.ste_backward``, expert by expert.

    Memory: the reference gradient of one expert at a time (computed while comparing).
    """
    check = f"backward.{mode}"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", undeclared_reason(be, case.fmt))
    if not callable(getattr(be, "ste_backward", None)):
        return record(ctx, check, "skip", "backend has no ste_backward (optional in the contract)")
    per = split_expert_amax(inputs.weights, inputs.amax, fmt=case.fmt)
    if len(inputs.grads) != len(inputs.weights):
        raise ValueError(f"{len(inputs.grads)} gradients for {len(inputs.weights)} experts")
    call = call_backend(ctx, lambda: be.ste_backward(inputs.weights, inputs.amax, inputs.grads, case.fmt, mode, **call_options(case)))
    timing = {"duration_s": call.seconds}
    if (reason := not_run_reason(ctx, call)) is not None:
        return record(ctx, check, "skip", reason, **timing)
    if (problem := problems_of(call, inputs.grads)) is not None:
        return record(ctx, check, "fail", problem, **timing)
    offenders: list = []
    want = lambda e: reference.ste_backward(inputs.weights[e], per[e], inputs.grads[e], mode)  # noqa: E731 - one expert at a time

    def full(e: int):
        w, a, ref, got = inputs.weights[e], per[e], want(e), call.value[e]
        comp = bitwise(ref, got, ctx.nan_bits)
        if comp.numel != comp.counts["exact"] and len(offenders) < MAX_OFFENDERS:
            amax_full = None if a is None else a.reshape(a.shape + (1,) * (w.dim() - a.dim())).expand_as(w)
            offenders.extend(expert_offenders(e, comp, w, ref, got, amax_full, MAX_OFFENDERS - len(offenders)))
        return comp

    comps = compare_each(len(inputs.weights), want, call.value, full)
    fields = summarize(comps, inputs.amax)
    verdict = "pass" if fields["counts"]["exact"] == case.numel else "fail"
    msg = mismatch_message(fields, case.numel)
    return record(ctx, check, verdict, (msg + " (bitwise)") if msg else "", offenders=tuple(offenders), **fields, **timing)
