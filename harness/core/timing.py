"""Timing: a zero-argument closure timed with CUDA events (L2 flushed) or ``perf_counter`` on CPU.

Raw samples are kept and the median quoted.  ``copy_curve`` times device copies from 4 KiB to 2 GiB
once per run: its largest gives the copy bandwidth (bytes read + written), the yardstick of ``% of
copy``; interpolated at a case's bytes (``copy_us_at``), the yardstick of ``% of a same-size copy``.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

L2_FLUSH_BYTES = 256 << 20
"""Bytes zeroed between timed CUDA calls so no call starts with a warm L2."""


def time_call(fn: Callable[[], object], device: torch.device, *, reps: int = 10, warmup: int = 2) -> tuple[list[float], str]:
    """Samples (microseconds) of ``fn()`` and the timer's name (``cuda_events`` / ``perf_counter``).

    CUDA: ``warmup`` calls, a synchronisation, then ``reps`` calls queued back to back, each between
    two events after an L2 flush, and one synchronisation at the end (as ``triton.testing.do_bench``
    times): while the device runs one call the host prepares the next, so a sample is the call's
    device time, plus host time only where the host is slower than the device.  (A synchronisation
    after every sample left the device idle during each call's host work, which then appeared in
    every sample but the first: docs/measured.md §13.)
    CPU: ``perf_counter`` around each call.
    """
    for _ in range(warmup):
        fn()
    samples = []
    if device.type == "cuda":
        flush = torch.empty(L2_FLUSH_BYTES, dtype=torch.uint8, device=device)
        torch.cuda.synchronize(device)
        events = []
        for _ in range(reps):
            flush.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            events.append((start, end))
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) * 1e3 for start, end in events], "cuda_events"
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - t0) * 1e6)
    return samples, "perf_counter"


CopyCurve = tuple[tuple[int, float], ...]
"""``((bytes moved, median us), ...)`` in increasing bytes: device copies timed like the perf samples."""

COPY_CURVE_MIN_BYTES = 4 << 10
"""Smallest copy of the curve (bytes read + written); each next point moves 4x more."""


_GAP = 3 << 20
"""Bytes between the curve's source and destination (one buffer; every point's halves lie 1 GiB +
3 MiB apart on CUDA).  Where they lie changes a copy's speed (docs/measured.md §13), so the curve
is a guide to what a call of a size can show, not a bound."""


def copy_curve(device: torch.device, max_bytes: int | None = None) -> CopyCurve:
    """Median time (us) of a device-to-device copy moving ``b`` bytes (``b/2`` read, ``b/2`` written)
    for ``b`` = 4 KiB, 16 KiB, ... and ``max_bytes`` (2 GiB on CUDA, 128 MiB on CPU), each timed as
    the perf samples are (``time_call``: 2 warm-up calls, 10 timed, L2 flushed before each).

    The yardstick of ``% of a same-size copy``: what a call moving ``b`` bytes would take if it were
    a copy under the same timer, launch latency and L2 flush included (docs/kernels_performance.md).
    Memory: one buffer of ``max_bytes`` + 3 MiB (source and destination halves, sliced for the
    smaller copies); time: tens of milliseconds on a GPU (docs/measured.md §13)."""
    max_bytes = max_bytes or ((1 << 31) if device.type == "cuda" else (128 << 20))
    half = max_bytes // 2
    buf = torch.ones(2 * half + _GAP, dtype=torch.uint8, device=device)
    src, dst = buf[:half], buf[half + _GAP :]
    sizes, b = [], COPY_CURVE_MIN_BYTES
    while b < max_bytes:
        sizes.append(b)
        b *= 4
    out = []
    for b in reversed(sizes + [max_bytes]):  # largest first: a device idle until now runs its first
        s, d = src[: b // 2], dst[: b // 2]  # copies at a low clock (docs/measured.md §13)
        samples, _ = time_call(lambda: d.copy_(s), device, reps=10, warmup=2)
        out.append((2 * (b // 2), statistics.median(samples)))
    return tuple(reversed(out))


def curve_gbps(curve: CopyCurve) -> float:
    """Copy bandwidth (GB/s of bytes read + written) of the curve's largest copy: the run's
    ``copy_gbps``, the yardstick of ``% of copy``."""
    b, us = curve[-1]
    return b / (us * 1e-6) / 1e9


def copy_us_at(curve: CopyCurve, nbytes: int) -> float:
    """The time of a copy moving ``nbytes``: linear in bytes between the curve's neighbouring points;
    below its first point, that point's time (a copy takes no less than its launch); above its
    last, that point's bandwidth."""
    if nbytes <= curve[0][0]:
        return curve[0][1]
    for (b0, t0), (b1, t1) in zip(curve, curve[1:]):
        if nbytes <= b1:
            return t0 + (t1 - t0) * (nbytes - b0) / (b1 - b0)
    b, us = curve[-1]
    return us * nbytes / b


def host_samples_us(fn: Callable[[], object], calls: int, *, before: Callable[[], object] = lambda: None,
                    sync: Callable[[], None] | None = None) -> list[float]:  # fmt: skip
    """Host time (us) of ``calls`` calls of ``fn``, each started with the device idle (``before()``
    and a sync first, not timed), so the number is what the host spends issuing one call.  One
    untimed call first; ``sync`` defaults to ``torch.cuda.synchronize``."""
    sync = torch.cuda.synchronize if sync is None else sync
    before()
    fn()
    sync()
    out = []
    for _ in range(calls):
        before()
        sync()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    sync()
    return out
