"""Performance record: time of one grouped ``fake_quant`` call, GB/s moved, % of copy bandwidth.

Timed only when the forward check passed (timing is separate from correctness); optional on CPU.
"""

from __future__ import annotations

import statistics

import torch

from moe_fq_parity.harness.core.records import Perf

from .common import CheckContext, call_backend, call_options, record

CHECK = "perf"


def check_perf(ctx: CheckContext, forward_verdict: str, *, reps: int = 10):
    """A ``perf`` record (skip unless the forward check passed)."""
    if forward_verdict != "pass":
        return record(ctx, CHECK, "skip", f"not timed: forward verdict is {forward_verdict}")
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    opts = call_options(case)
    device = torch.device(ctx.backend.device or "cpu")
    from moe_fq_parity.harness.core.timing import time_call

    # A stacked case is timed through the backend's stacked entry point when it has one (the
    # production call for a grouped [N, out, in] weight); otherwise through the list contract.
    stacked = getattr(be, "fake_quant_stacked", None)
    if case.layout == "stacked" and inputs.stacked is not None and callable(stacked):
        entry, fn = "fake_quant_stacked", (lambda: stacked(inputs.stacked, inputs.amax, case.fmt, **opts))
    else:
        entry, fn = "fake_quant", (lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
    call = call_backend(ctx, lambda: time_call(fn, device, reps=reps))
    if not call.ok and entry == "fake_quant_stacked":
        entry, fn = "fake_quant", (lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
        call = call_backend(ctx, lambda: time_call(fn, device, reps=reps))
    if not call.ok:
        return record(ctx, CHECK, "fail", f"backend raised while timed: {call.message}")
    samples, timer = call.value
    t_us = statistics.median(samples)
    gbps = inputs.nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
    pct = 100.0 * gbps / ctx.copy_gbps if ctx.copy_gbps else None
    perf = Perf(time_us=t_us, gbps=gbps, pct_of_copy=pct, timer=f"{timer}; {entry}", samples_us=tuple(samples), bytes_moved=inputs.nbytes)
    return record(ctx, CHECK, "pass", f"{entry}: {t_us:.1f} us, {gbps:.2f} GB/s" + (f", {pct:.0f}% of copy" if pct is not None else ""), perf=perf, duration_s=call.seconds)
