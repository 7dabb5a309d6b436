"""Timing: a zero-argument closure timed with CUDA events (L2 flushed) or ``perf_counter`` on CPU.

Raw samples are kept and the median quoted.  ``copy_bandwidth_gbps`` measures the device's copy
bandwidth once per run (bytes read + written), the yardstick of ``% of copy``.
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
    after every sample left the device idle during each call's host work: at the Ultra case the
    public call's ~0.4 ms of host time appeared in every sample but the first.)
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


def copy_bandwidth_gbps(device: torch.device, nbytes: int | None = None) -> float:
    """Median device-to-device copy bandwidth, GB/s of bytes read + written."""
    nbytes = nbytes or ((1 << 30) if device.type == "cuda" else (64 << 20))
    src = torch.ones(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    samples, _ = time_call(lambda: dst.copy_(src), device, reps=10, warmup=2)
    return 2 * nbytes / (statistics.median(samples) * 1e-6) / 1e9
