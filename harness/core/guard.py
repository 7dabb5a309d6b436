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


class CaseTimeout(Exception):
    """Raised inside a backend call that ran past the per-case timeout."""


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
    """Raise ``CaseTimeout`` in the block after ``seconds`` (SIGALRM; main thread only, else no limit).

    The alarm interrupts Python code (e.g. the Triton interpreter) between bytecodes; a single long
    native call finishes first.
    """
    usable = seconds and seconds > 0 and hasattr(signal, "setitimer") and threading.current_thread() is threading.main_thread()
    if not usable:
        yield
        return

    def _raise(signum, frame):
        raise CaseTimeout(f"timed out after {seconds:g} s")

    old = signal.signal(signal.SIGALRM, _raise)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


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
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any backend failure is a recorded result
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
