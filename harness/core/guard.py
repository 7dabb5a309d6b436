"""Calling a backend safely: exceptions, per-case timeout, process-global numeric state, and output validation.

A backend that raises, hangs, returns the wrong number/shape/dtype/device of tensors, or leaves a
process-global numeric setting changed (``ProcessState``) produces a ``Call`` with ``error`` set;
the checks turn it into a failed record, never a crash of the run.  A backend that raises
``KeyboardInterrupt`` itself is such a failure too where the run marks its own interrupts
(``run_signals``): only a real Ctrl-C or SIGTERM ends the run.
"""

from __future__ import annotations

import signal
import threading
import time
import traceback
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

import torch

from .bits import raw_bits


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread by the runner's handler: ends a run like Ctrl-C does
    (partial report, ``complete: false``, the reason), never caught as a backend failure."""


class Interrupted(KeyboardInterrupt):
    """SIGINT (Ctrl-C), raised by ``run_signals``' handler: ends a run, never caught as a backend failure."""


_SIGNALS = {"marked": False}
"""``marked``: this process's interrupts arrive as ``Interrupted``/``Terminated`` (``run_signals``, or
an isolation worker, which ignores SIGINT), so a plain ``KeyboardInterrupt`` out of a backend call
was raised by the backend and is its failure."""


@contextmanager
def run_signals() -> Iterator[None]:
    """In the main thread: SIGINT raises ``Interrupted`` and SIGTERM ``Terminated`` (both
    ``KeyboardInterrupt``s: the run ends with a partial report saying why), and a plain
    ``KeyboardInterrupt`` raised by a backend call is that call's failure (``guarded``).  Elsewhere
    (another thread): nothing changes."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _int(signum, frame):
        raise Interrupted("interrupted (KeyboardInterrupt)")

    def _term(signum, frame):
        raise Terminated("terminated (SIGTERM)")

    old_int, old_term, old_marked = signal.signal(signal.SIGINT, _int), signal.signal(signal.SIGTERM, _term), _SIGNALS["marked"]
    _SIGNALS["marked"] = True
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, old_int)
        signal.signal(signal.SIGTERM, old_term)
        _SIGNALS["marked"] = old_marked


def mark_interrupts() -> None:
    """For a process that does not take Ctrl-C itself (an isolation worker ignores SIGINT; its parent
    owns the run): every ``KeyboardInterrupt`` in a backend call is that backend's failure."""
    _SIGNALS["marked"] = True


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
    about 6 launches per batch), and host work linear in the number of tensors (about 30 us a
    tensor on a 2-CPU host: 0.6 s for 20,000 one-element ones); memory: an int64 temporary of at most ``_BATCH`` elements, or of a
    large tensor's ``numel / 8``, at a time.
    """
    heads: list = []
    sums: list[Optional[torch.Tensor]] = [None] * len(tensors)
    pending: dict[tuple, list[tuple[int, torch.Tensor]]] = {}
    pending_numel: dict[tuple, int] = {}  # elements in each pending batch, kept as it grows (linear in the tensor count)

    def flush(key: tuple) -> None:
        batch = pending.pop(key, [])
        pending_numel.pop(key, None)
        if batch:
            out = _batch_sums([f for _, f in batch])
            for k, (i, _) in enumerate(batch):
                sums[i] = out[k]

    for i, t in enumerate(tensors):
        if t is None or not isinstance(t, torch.Tensor):
            heads.append(None)
            continue
        heads.append((tuple(t.shape), t.dtype, t.device))
        flat = raw_bits(t.detach()).reshape(-1)
        if flat.numel() > _SMALL:
            sums[i] = _large_sum(flat)
            continue
        key = (flat.device, flat.dtype)
        if pending.get(key) and pending_numel[key] + flat.numel() > _BATCH:
            flush(key)
        pending.setdefault(key, []).append((i, flat))
        pending_numel[key] = pending_numel.get(key, 0) + flat.numel()
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


# --- process-global numeric state -----------------------------------------------------------------

_DENORMAL, _ONE, _HALF_ULP, _THREE_QUARTER_ULP = float.fromhex("0x1p-1074"), 1.0, float.fromhex("0x1p-53"), float.fromhex("0x3p-54")


def _flush_denormal() -> bool:
    """Whether this thread flushes denormals (FTZ/DAZ, as ``torch.set_flush_denormal(True)`` or a
    library built with fast math sets them): the smallest double times 1 reads as 0.  Python's float
    arithmetic runs on the same unit and control register as PyTorch's CPU kernels."""
    return _DENORMAL * _ONE == 0.0


def _set_flush_denormal(on: bool) -> None:
    torch.set_flush_denormal(bool(on))


_FE_MODES = {  # fesetround's constants per machine (glibc)
    "x86_64": {"nearest": 0x0, "downward": 0x400, "upward": 0x800, "toward_zero": 0xC00},
    "aarch64": {"nearest": 0x0, "upward": 0x400000, "downward": 0x800000, "toward_zero": 0xC00000},
}


def _rounding() -> str:
    """This thread's floating-point rounding mode, read off two additions (RNE is ``nearest``)."""
    if _ONE + _HALF_ULP != _ONE:
        return "upward"
    if -_ONE - _HALF_ULP != -_ONE:
        return "downward"
    return "nearest" if _ONE + _THREE_QUARTER_ULP != _ONE else "toward_zero"


def _set_rounding(mode: str) -> None:
    import ctypes
    import ctypes.util
    import platform

    codes = _FE_MODES.get(platform.machine())
    lib = ctypes.util.find_library("m")
    if codes is None or lib is None or ctypes.CDLL(lib).fesetround(codes[mode]) != 0:
        raise OSError(f"cannot set the rounding mode to {mode} on this platform")


def _attr(path: str) -> tuple[Callable[[], Any], Callable[[Any], None]]:
    """Getter and setter of a ``torch.backends`` attribute such as ``cuda.matmul.allow_tf32``."""
    *parents, leaf = path.split(".")

    def owner() -> Any:
        obj: Any = torch.backends
        for p in parents:
            obj = getattr(obj, p)
        return obj

    return (lambda: getattr(owner(), leaf)), (lambda v: setattr(owner(), leaf, v))


def _deterministic() -> tuple[bool, bool]:
    return torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()


def _settings() -> dict[str, tuple[Callable[[], Any], Callable[[Any], None]]]:
    out: dict[str, tuple[Callable[[], Any], Callable[[Any], None]]] = {
        "flush_denormal": (_flush_denormal, _set_flush_denormal),
        "rounding_mode": (_rounding, _set_rounding),
        "default_dtype": (torch.get_default_dtype, torch.set_default_dtype),
        "default_device": (torch.get_default_device, torch.set_default_device),
        "float32_matmul_precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
        "deterministic_algorithms": (_deterministic, lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
        "fill_uninitialized_memory": (lambda: torch.utils.deterministic.fill_uninitialized_memory,
                                      lambda v: setattr(torch.utils.deterministic, "fill_uninitialized_memory", v)),
    }
    # fp32_precision first: setting it also sets the allow_tf32 flags (and the reverse), so the flags
    # are restored after it and the restore is checked (``ProcessState.apply``)
    paths = ("fp32_precision", "cuda.matmul.fp32_precision", "cuda.matmul.allow_tf32", "cuda.matmul.allow_bf16_reduced_precision_reduction",
             "cuda.matmul.allow_fp16_reduced_precision_reduction", "cuda.matmul.allow_fp16_accumulation", "cudnn.fp32_precision",
             "cudnn.conv.fp32_precision", "cudnn.rnn.fp32_precision", "cudnn.allow_tf32", "cudnn.enabled", "cudnn.deterministic",
             "cudnn.benchmark", "mkldnn.fp32_precision", "mkldnn.matmul.fp32_precision", "mkldnn.conv.fp32_precision",
             "mkldnn.rnn.fp32_precision", "mkldnn.enabled", "mkldnn.deterministic")
    for path in paths:
        get, put = _attr(path)
        try:
            get()
        except Exception:  # noqa: BLE001 - not in this torch: nothing to watch
            continue
        out[path] = (get, put)
    return out


SETTINGS = _settings()
"""Every process-global setting that changes what PyTorch computes (``name -> (get, set)``):
denormal flushing and the rounding mode of the calling thread, the default dtype and device, the
matmul/cuDNN/oneDNN precision and reduced-precision-reduction flags, cuDNN/deterministic-algorithm
modes and ``fill_uninitialized_memory``.  A backend may run in any of them; the reference, the case
inputs and the comparisons always run in the state the process had before any backend was built."""


@dataclass(frozen=True)
class ProcessState:
    """Values of ``SETTINGS`` (``capture()``); ``changes(other)`` is what differs, as ``name -> (old, new)``.

    Cost of ``capture()``: about 20 attribute reads and two float operations (tens of microseconds),
    once before and once after each guarded call."""

    values: tuple[tuple[str, Any], ...]

    @classmethod
    def capture(cls) -> "ProcessState":
        out = []
        for name, (get, _) in SETTINGS.items():
            try:
                out.append((name, get()))
            except Exception as exc:  # noqa: BLE001 - a getter that fails is a state of its own
                out.append((name, f"<unreadable: {type(exc).__name__}>"))
        return cls(tuple(out))

    def with_values(self, values: Sequence[tuple[str, Any]]) -> "ProcessState":
        """This state with some settings replaced (a backend's chosen state over the harness's)."""
        new = dict(values)
        return ProcessState(tuple((k, new.get(k, v)) for k, v in self.values))

    def changes(self, after: "ProcessState") -> dict[str, tuple[Any, Any]]:
        before = dict(self.values)
        return {k: (before.get(k), v) for k, v in after.values if before.get(k) != v}

    def apply(self, only: Optional[Iterable[str]] = None) -> list[str]:
        """Set the settings ``only`` names (default: all that differ now) to these values; returns
        the names that could not be set back (their setter raised or the value did not stick)."""
        want = dict(self.values)
        names = list(only) if only is not None else list(ProcessState.capture().changes(self))
        failed = []
        for name in names:  # in SETTINGS order (see _settings)
            try:
                SETTINGS[name][1](want[name])
            except Exception:  # noqa: BLE001 - reported by name below
                pass
        now = dict(ProcessState.capture().values)
        for name in names:
            if now.get(name) != want[name]:
                failed.append(name)
        return failed


def describe_changes(changes: dict[str, tuple[Any, Any]]) -> str:
    """``name old -> new`` for each changed setting, comma-separated."""
    return ", ".join(f"{k} {old} -> {new}" for k, (old, new) in changes.items())


class ProcessStateChanged(Exception):
    """A backend call left process-global numeric settings changed (the harness set them back).

    Not a ``TypeError``/``ValueError``/``NotImplementedError``: a leaking call is a failure, never
    read as the backend declining an option."""


@dataclass(frozen=True)
class BuiltState:
    """What building a backend did to the process (``building``): ``changes`` (name -> (before, after))."""

    changes: dict[str, tuple[Any, Any]]
    unrestored: tuple[str, ...] = ()

    @property
    def chosen(self) -> tuple[tuple[str, Any], ...]:
        """The settings the backend runs with (``guarded``'s ``state``): the values it set."""
        return tuple((k, new) for k, (_, new) in self.changes.items())

    def note(self) -> str:
        """One line for the report and the console ('' when nothing changed)."""
        if not self.changes:
            return ""
        msg = (f"building it changed process-global numeric settings ({describe_changes(self.changes)}): its calls run with them, "
               "the reference and the harness without")
        if self.unrestored:
            msg += f"; could not set back {', '.join(self.unrestored)} (the reference runs with them too)"
        return msg


@contextmanager
def building() -> Iterator[list[BuiltState]]:
    """Around building a backend (import, construction, ``available()``): the settings it changed are
    recorded (the one-element list yielded gets a ``BuiltState``) and set back, so the harness runs as
    before while the backend's calls run in the state it chose (``guarded(..., state=built.chosen)``)."""
    before = ProcessState.capture()
    out: list[BuiltState] = []
    try:
        yield out
    finally:
        changes = before.changes(ProcessState.capture())
        unrestored = tuple(before.apply(changes)) if changes else ()
        out.append(BuiltState(changes, unrestored))


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


def guarded(fn: Callable[[], Any], timeout_s: Optional[float], state: Sequence[tuple[str, Any]] = ()) -> Call:
    """Run ``fn()`` under ``time_limit``; never raises (a Ctrl-C or SIGTERM excepted: ``run_signals``).

    ``state``: settings of ``SETTINGS`` the backend runs with (what building it set, ``building``),
    applied for the call.  Whatever the call leaves changed beyond them is set back after it and makes
    the call fail (``ProcessStateChanged`` naming each setting): the process runs on exactly as before.
    """
    start = time.perf_counter()
    before = ProcessState.capture()
    watch = _WATCH.get("call")
    if watch is not None:
        watch(True)
    try:
        if state:
            ProcessState(tuple(state)).apply([k for k, _ in state])
        with time_limit(timeout_s):
            value = fn()
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        call = Call(value, None, "", time.perf_counter() - start)
    except (Interrupted, Terminated):
        raise
    except KeyboardInterrupt as exc:
        if not _SIGNALS["marked"]:  # no handler of ours: Python's own Ctrl-C, end the run
            raise
        call = Call(None, exc, _describe(exc) + " (raised by the backend: not a Ctrl-C)", time.perf_counter() - start)
    except BaseException as exc:  # noqa: BLE001 - any backend failure (and the timeout) is a recorded result
        call = Call(None, exc, _describe(exc), time.perf_counter() - start)
    finally:
        if watch is not None:
            watch(False)
        chosen = ProcessState(before.values).with_values(state)
        leaked = chosen.changes(ProcessState.capture())
        if leaked or state:
            before.apply()
    if leaked:
        what = f"the call left process-global numeric settings changed ({describe_changes(leaked)}); set back after the call"
        err = ProcessStateChanged(what)
        call = Call(None, err, f"{type(err).__name__}: {what}", call.seconds) if call.ok else replace(call, message=f"{call.message}; {what}")
    return call


_WATCH: dict[str, Callable[[bool], None]] = {}
"""``call``: told ``True`` when a guarded backend call starts and ``False`` when it ends (an isolation
worker tells its parent, which kills a worker whose call outlives the timeout)."""


def watch_calls(fn: Optional[Callable[[bool], None]]) -> None:
    """``fn(True)`` when each guarded backend call starts, ``fn(False)`` when it ends (``None``: stop)."""
    if fn is None:
        _WATCH.pop("call", None)
    else:
        _WATCH["call"] = fn


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
