"""Performance record: time of one grouped ``fake_quant`` call, GB/s moved, % of copy bandwidth.

Timed only when the forward check passed (timing is separate from correctness); optional on CPU.
A backend with ``timed_entries(weights, amax, fmt, **options)`` (the Triton kernel) reports the
quantities of ``python -m moe_fq_parity.benchmarks.bench`` for the case: the public default call
(``time_us``, ``pct_of_copy``), the kernel alone through a prepared launch (``kernel_us``), the
public call with checks off (``unchecked_us``), host time per call (``host_us``) and the speedup
over the per-expert eager loop (``loop_us``: the reference loop that built the case's expected
outputs, timed then, so the baseline costs no extra call).

Samples are queued back to back as ``benchmarks.bench`` times them (``harness.core.timing.time_call``),
so the public call's time is its device time wherever the host keeps ahead of the device.

Every record also gives the call against a device copy of its size timed the same way
(``copy_same_us``, ``pct_of_same_copy``; the run's ``meta.copy_curve`` interpolated): under this
timer a small call cannot reach the run's copy bandwidth (launch latency and the write-back of the
flush's dirty L2 lines are in every sample: docs/kernels_performance.md), so
``pct_of_same_copy`` tells a kernel that is slow from a size that is.

Cost per case (kernel backend): 12 calls of the default entry (2 warm-up, 10 timed, each after a
256 MiB L2 flush) and 11 host-timed default calls; cases of at least ``DETAIL_BYTES`` also 6 each of
the unchecked and kernel entries (1 warm-up, 5 timed).
"""

from __future__ import annotations

import statistics
import time
from contextlib import nullcontext
from typing import Optional

import torch

from moe_fq_parity.harness.core.records import Perf
from moe_fq_parity.harness.core.timing import copy_us_at, host_samples_us, time_call

from .common import CheckContext, call_backend, call_options, record

CHECK = "perf"
DETAIL_BYTES = 16 << 20
"""Cases moving at least this many bytes also time the kernel alone and the unchecked call.  Below,
every call is launch-bound (the kernel's share is not what its time says) and those two entries
would only add compiled variants (checks off) to a run, mostly compiled for small shapes (chosen by
measurement: docs/measured.md §13)."""


def check_perf(ctx: CheckContext, forward_verdict: str, loop_us: Optional[float] = None, *, reps: int = 10):
    """A ``perf`` record (skip unless the forward check passed); ``loop_us``: the reference loop's
    time for this case (``Expected.loop_us``), the baseline of ``speedup_vs_loop``."""
    if forward_verdict != "pass":
        return record(ctx, CHECK, "skip", f"not timed: forward verdict is {forward_verdict}")
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    opts = call_options(case)
    device = torch.device(ctx.backend.device or "cpu")
    # A stacked case is timed through the backend's stacked entry point when it has one (the
    # production call for a grouped [N, out, in] weight); otherwise through the list contract.
    stacked = getattr(be, "fake_quant_stacked", None)
    if case.layout == "stacked" and inputs.stacked is not None and callable(stacked):
        entry, fn = "fake_quant_stacked", (lambda: stacked(inputs.stacked, inputs.amax, case.fmt, **opts))
    else:
        entry, fn = "fake_quant", (lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
    entries = getattr(be, "timed_entries", None)
    t0 = time.perf_counter()
    with ctx.alone() if ctx.alone is not None else nullcontext():  # a timing never overlaps another process's work
        timed = _timed(ctx, entries, entry, fn, device, reps, loop_us)
    if isinstance(timed, str):
        return record(ctx, CHECK, "fail", f"backend raised while timed: {timed}")
    samples, timer, entry, extra = timed
    t_us = statistics.median(samples)
    gbps = inputs.nbytes / (t_us * 1e-6) / 1e9 if t_us > 0 else 0.0
    pct = 100.0 * gbps / ctx.copy_gbps if ctx.copy_gbps else None
    pct_of = lambda us: 100.0 * inputs.nbytes / (us * 1e-6) / 1e9 / ctx.copy_gbps if ctx.copy_gbps and us else None  # noqa: E731
    if ctx.copy_curve and t_us > 0:
        same = copy_us_at(ctx.copy_curve, inputs.nbytes)
        extra.update(copy_same_us=same, pct_of_same_copy=100.0 * same / t_us)
    if "host_us" in extra:
        extra.update(pct_kernel=pct_of(extra["kernel_us"]), pct_unchecked=pct_of(extra["unchecked_us"]),
                     speedup_vs_loop=extra["loop_us"] / t_us if extra.get("loop_us") and t_us > 0 else None)  # fmt: skip
    perf = Perf(time_us=t_us, gbps=gbps, pct_of_copy=pct, timer=f"{timer}; {entry}", samples_us=tuple(samples), bytes_moved=inputs.nbytes, **extra)
    msg = f"{entry}: {t_us:.1f} us, {gbps:.2f} GB/s" + (f", {pct:.0f}% of copy" if pct is not None else "")
    if extra.get("pct_of_same_copy") is not None:
        msg += f" ({extra['pct_of_same_copy']:.0f}% of a same-size copy, {extra['copy_same_us']:.1f} us)"
    if "host_us" in extra:
        side = f"kernel {extra['kernel_us']:.1f} us, checks off {extra['unchecked_us']:.1f} us, " if extra.get("kernel_us") is not None else ""
        msg += (f"; {side}host {extra['host_us']:.1f} us/call"
                + (f", {extra['speedup_vs_loop']:.1f}x the per-expert eager loop" if extra.get("speedup_vs_loop") else ""))  # fmt: skip
    return record(ctx, CHECK, "pass", msg, perf=perf, duration_s=time.perf_counter() - t0)


def _timed(ctx: CheckContext, entries, entry: str, fn, device: torch.device, reps: int, loop_us: Optional[float]):
    """``(samples, timer, entry, extra)`` of the case's timed call (``timed_entries`` where the backend
    has them, else ``fn``, the stacked entry falling back to the list contract), or the message of a
    call that raised."""
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    opts = call_options(case)
    if callable(entries):
        whole = inputs.stacked if case.layout == "stacked" else None
        detail = inputs.nbytes >= DETAIL_BYTES
        timed = call_backend(ctx, lambda: _time_entries(entries(inputs.weights, inputs.amax, case.fmt, stacked=whole, **opts), device, reps, detail))
        if not timed.ok:
            return timed.message
        (samples, timer), extra = timed.value
        extra["loop_us"] = loop_us
        return samples, timer, f"{'fake_quant_stacked' if whole is not None else 'fake_quant'} (public default call)", extra
    call = call_backend(ctx, lambda: time_call(fn, device, reps=reps))
    if not call.ok and entry == "fake_quant_stacked":
        entry, fn = "fake_quant", (lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
        call = call_backend(ctx, lambda: time_call(fn, device, reps=reps))
    if not call.ok:
        return call.message
    samples, timer = call.value
    return samples, timer, entry, {}


def host_us(fn, device: torch.device, reps: int) -> float:
    """Median host time (us) of one call of ``fn``, the device idle at the start of each
    (``core.timing.host_samples_us``)."""
    return statistics.median(host_samples_us(fn, reps, sync=torch.cuda.synchronize if device.type == "cuda" else (lambda: None)))


def _time_entries(entries: dict, device: torch.device, reps: int, detail: bool):
    """Samples of the public default call, plus the other quantities (medians, us); the kernel alone
    and the unchecked call only with ``detail`` (else ``None``)."""
    default = time_call(entries["default"], device, reps=reps)
    side = max(1, reps // 2)
    med = lambda name: statistics.median(time_call(entries[name], device, reps=side, warmup=1)[0]) if detail else None  # noqa: E731
    extra = {"kernel_us": med("kernel"), "unchecked_us": med("unchecked"), "host_us": host_us(entries["default"], device, reps)}
    return default, extra
