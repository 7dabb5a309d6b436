"""Calling a backend safely: exceptions, per-case timeout, and output validation.

A backend that raises, hangs, or returns the wrong number/shape/dtype/device of tensors produces a
``Call`` with ``error`` set; the checks turn it into a failed record, never a crash of the run.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from .equality import _raw_bits


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by the runner's handler: ends a run like Ctrl-C does
    (partial report, ``complete: false``, the reason), never caught as a backend failure."""


class CaseTimeout(BaseException):
    """Raised inside a backend call that ran past the per-case timeout.

    A ``BaseException`` (like ``KeyboardInterrupt``), so a backend's ``except Exception`` retry loop
    cannot swallow it; and re-raised every ``REARM_S`` seconds until the call returns, so a backend
    that catches even ``BaseException`` is interrupted again at its next Python instruction."""


REARM_S = 1.0
"""After the timeout fired, it fires again every this many seconds until the call ends."""


class InputsModified(Exception):
    """A backend call wrote to its inputs (weights, amax, gradients or the stacked tensor).

    Raised out of a check after the inputs were restored to their generated bits, so the next check
    sees exactly the tensors a one-check rerun (the record's ``repro``) would build."""

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.where = where
        self.detail = detail


_SMALL = 1 << 20
"""Tensors of at most this many elements are checksummed together, in batches (few launches for many experts)."""
_BATCH = 1 << 22
"""Elements per batch of small tensors, and the largest chunk of a large tensor."""
_CHUNK_MIX = 1000003
"""Odd multiplier combining the chunk sums of a large tensor (mod 2**64)."""
_WEIGHTS: dict[torch.device, torch.Tensor] = {}


def _weights(n: int, device: torch.device) -> torch.Tensor:
    w = _WEIGHTS.get(device)
    if w is None or w.numel() < n:
        w = (torch.arange(max(n, _BATCH), dtype=torch.int64, device=device) * 2654435761) % 2147483629 + 1
        _WEIGHTS[device] = w
    return w[:n]


def _large_sum(flat: torch.Tensor) -> torch.Tensor:
    """Position-weighted int64 sum of one large tensor's bits, in chunks of at most ``numel / 8``
    elements (so the int64 temporary is at most the tensor's own bytes for 2-byte dtypes)."""
    chunk = min(_BATCH, max(_SMALL, flat.numel() // 8))
    acc = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), chunk):
        c = flat[start:start + chunk].to(torch.int64)
        # the chunks' sums are combined as a polynomial, so equal offsets in two chunks weigh differently
        acc = acc * _CHUNK_MIX + c.mul_(_weights(c.numel(), c.device)).sum()
    return acc


def _batch_sums(flats: list[torch.Tensor]) -> torch.Tensor:
    """Per-tensor position-weighted int64 sums of small same-dtype tensors, with a few launches:
    one concatenation, one weighted cumulative sum, one gather of the segment ends."""
    sizes = [f.numel() for f in flats]
    device = flats[0].device
    v = torch.cat(flats).to(torch.int64)
    v.mul_(_weights(v.numel(), device))
    csum = torch.cat([torch.zeros(1, dtype=torch.int64, device=device), v.cumsum(0)])
    ends, pos = [], 0
    for n in sizes:
        pos += n
        ends.append(pos)
    ends_t = torch.tensor(ends, dtype=torch.int64).to(device, non_blocking=True)
    starts_t = ends_t - torch.tensor(sizes, dtype=torch.int64).to(device, non_blocking=True)
    return csum[ends_t] - csum[starts_t]  # int64 arithmetic wraps: the sums are equal mod 2**64 or not


def fingerprint(tensors: Sequence[Optional[torch.Tensor]]) -> tuple:
    """A position-weighted checksum of the bits of every tensor (shape, dtype and contents).

    Any write that changes an element's bits changes it (up to a 2**-64 chance per write pattern).
    Cost: one read of the tensors and one device synchronisation per call, whatever the number of
    tensors (small ones, up to ``_SMALL`` elements, are summed in batches of ``_BATCH`` elements:
    about 6 launches per batch); memory: an int64 temporary of at most ``_BATCH`` elements, or of a
    large tensor's ``numel / 8``, at a time.
    """
    heads: list = []
    sums: list[Optional[torch.Tensor]] = [None] * len(tensors)
    pending: dict[tuple, list[tuple[int, torch.Tensor]]] = {}

    def flush(key: tuple) -> None:
        batch = pending.pop(key, [])
        if batch:
            out = _batch_sums([f for _, f in batch])
            for k, (i, _) in enumerate(batch):
                sums[i] = out[k]

    for i, t in enumerate(tensors):
        if t is None or not isinstance(t, torch.Tensor):
            heads.append(None)
            continue
        heads.append((tuple(t.shape), t.dtype, t.device))
        flat = _raw_bits(t.detach()).reshape(-1)
        if flat.numel() > _SMALL:
            sums[i] = _large_sum(flat)
            continue
        key = (flat.device, flat.dtype)
        batch = pending.setdefault(key, [])
        if batch and sum(f.numel() for _, f in batch) + flat.numel() > _BATCH:
            flush(key)
            batch = pending.setdefault(key, [])
        batch.append((i, flat))
    for key in list(pending):
        flush(key)
    values: list[Optional[int]] = [None] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, s in enumerate(sums):
        if s is not None:
            by_device.setdefault(s.device, []).append(i)
    for idx in by_device.values():
        host = torch.stack([sums[i] for i in idx]).cpu().tolist()  # the one synchronisation per device
        for i, v in zip(idx, host):
            values[i] = v
    return tuple(heads), tuple(values)


@dataclass(frozen=True)
class Call:
    """Outcome of one guarded call: ``value`` or ``error`` (with its type name), and the wall time."""

    value: Any
    error: Optional[BaseException]
    message: str
    seconds: float

    @property
    def ok(self) -> bool:
        return self.error is None


@contextmanager
def time_limit(seconds: Optional[float]) -> Iterator[None]:
    """Raise ``CaseTimeout`` in the block after ``seconds``, and again every ``REARM_S`` until it ends
    (SIGALRM; main thread only, else no limit).

    The alarm interrupts Python code (e.g. the Triton interpreter) between bytecodes; a single long
    native call finishes first.
    """
    usable = seconds and seconds > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    # (a negative or NaN limit is refused where it is given: CLI, pytest options, RunConfig)
    if not usable:
        yield
        return

    done = False

    def _raise(signum, frame):
        if not done:
            raise CaseTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds, REARM_S)
    try:
        yield
    finally:
        pending: Optional[BaseException] = None
        while True:  # a re-armed alarm (or Ctrl-C) may land in here: disarm until it sticks, then re-raise
            try:
                done = True
                signal.setitimer(signal.ITIMER_REAL, 0)
                signal.signal(signal.SIGALRM, old)
                break
            except CaseTimeout:
                continue
            except BaseException as exc:  # noqa: BLE001 - KeyboardInterrupt/Terminated: raised once disarmed
                pending = exc
        if pending is not None:
            raise pending


def _describe(exc: BaseException) -> str:
    tb = traceback.extract_tb(exc.__traceback__)
    where = f" (at {tb[-1].filename}:{tb[-1].lineno})" if tb else ""
    return f"{type(exc).__name__}: {exc}{where}"


def guarded(fn: Callable[[], Any], timeout_s: Optional[float]) -> Call:
    """Run ``fn()`` under ``time_limit``; never raises (``KeyboardInterrupt`` excepted)."""
    start = time.perf_counter()
    try:
        with time_limit(timeout_s):
            value = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        return Call(value, None, "", time.perf_counter() - start)
    except KeyboardInterrupt:  # Ctrl-C and SIGTERM (``Terminated``) end the run with a partial report
        raise
    except BaseException as exc:  # noqa: BLE001 - any backend failure (and the timeout) is a recorded result
        return Call(None, exc, _describe(exc), time.perf_counter() - start)


def output_problems(outputs: Any, like: Sequence[torch.Tensor]) -> list[str]:
    """Every way ``outputs`` misses "N tensors with the inputs' shape, dtype and device"."""
    if not isinstance(outputs, (list, tuple)):
        return [f"returned {type(outputs).__name__}, expected a list of {len(like)} tensors"]
    if len(outputs) != len(like):
        return [f"returned {len(outputs)} tensors for {len(like)} experts"]
    problems = []
    for i, (o, w) in enumerate(zip(outputs, like)):
        if not isinstance(o, torch.Tensor):
            problems.append(f"expert {i}: returned {type(o).__name__}, not a tensor")
            continue
        if o.shape != w.shape:
            problems.append(f"expert {i}: shape {tuple(o.shape)} != input shape {tuple(w.shape)}")
        if o.dtype != w.dtype:
            problems.append(f"expert {i}: dtype {o.dtype} != input dtype {w.dtype}")
        if o.device != w.device:
            problems.append(f"expert {i}: device {o.device} != input device {w.device}")
    return problems
