"""Isolation: the cases of a run go through a supervised worker process, so no backend can end the run.

The parent (the runner) owns the report and the exit code; a worker (``spawn``ed like every harness
process, ``harness.core.processes.startable_main``) loads the run's backends by spec and runs one
case at a time on one device: inputs, reference outputs and the checks, exactly as in process
(``chunks.case_chunks``), sending each check's records back as it finishes.  The parent kills and
replaces a worker that

* dies (``os._exit``, a segfault, an abort): the check it was running gets a ``crash`` record saying
  how (exit code or signal), the backend's other checks of that case a ``crash`` record naming it;
* runs one backend call longer than the timeout plus ``KILL_GRACE_S`` (a backend that catches every
  exception and disarms SIGALRM): ``timeout`` records the same way;
* loses its CUDA context (an illegal memory access poisons every later call of the process): the
  checks of that backend on that case become ``crash`` records.

Then the run goes on with the case's remaining backends and the next case in a fresh worker: a
crashed worker poisons only its own process and CUDA context.  The worker ignores SIGINT (Ctrl-C is
the parent's: it ends the run with a partial report and kills the worker), so a ``KeyboardInterrupt``
raised inside a backend is that call's failure.

Cost (``moe-fq-parity run --suite ci``, measured in ``docs/ARCHITECTURE.md``): one process start per
run plus one per crash, and a pipe message per backend call and per check.
"""

from __future__ import annotations

import ctypes
import multiprocessing as mp
import signal
import sys
import time
from dataclasses import dataclass, replace
from typing import Any, Optional, Sequence

import torch

from moe_fq_parity.cases import Case
from moe_fq_parity.reference import FORMATS

from moe_fq_parity.harness.backends import LoadedBackend, load
from moe_fq_parity.harness.core.guard import mark_interrupts, watch_calls
from moe_fq_parity.harness.core.processes import startable_main
from moe_fq_parity.harness.core.records import CheckRecord
from moe_fq_parity.harness.core.repro import repro_command
from moe_fq_parity.harness.core.timing import CopyCurve

from .chunks import PHASES, HeldCase, case_chunks, check_chunks, in_check_order
from .gpu_lease import CaseTurns

KILL_GRACE_S = 3.0
"""A backend call still running this long after its timeout gets its worker killed (the in-process
alarm re-fires every second meanwhile: three chances to end the call politely)."""
START_TIMEOUT_S = 600.0
"""A worker that has not loaded the run's backends after this long is killed (its cases: ``crash``)."""


@dataclass(frozen=True)
class WorkerSettings:
    """What a worker needs besides the backends' specs and the cases (``chunks.case_chunks``' ``cfg``)."""

    seed: int
    mode: str
    timeout_s: Optional[float]
    nan_bits: str
    threads: int
    gpu_share_mib: Optional[int] = None
    """``None``: the worker takes no lease (the run's only worker, or a pytest worker whose test holds
    one); else it is one of a run's case workers and leases its device per case, the GPU or on a CPU
    the host's memory (``gpu_lease.CaseTurns``: cases up to this many MiB share it)."""


def isolatable(backends: Sequence[LoadedBackend]) -> Optional[str]:
    """``None`` when a worker can load every backend by its spec, else why not (a backend defined in
    the parent's ``__main__``: a spawned worker cannot import it)."""
    bad = [b.spec for b in backends if b.available and b.spec.startswith("__main__:")]
    return f"backends {bad} live in the parent's __main__, which a worker process cannot import" if bad else None


class NotIsolatable(Exception):
    """This case cannot run in a worker (its format was registered in this process at run time: a
    spawned worker knows only the formats its imports register); the runner runs it in process."""


class _WorkerDied(Exception):
    """The worker ended (or was killed) while a case was in flight; ``outcome`` is crash or timeout."""

    def __init__(self, outcome: str, how: str) -> None:
        super().__init__(how)
        self.outcome, self.how = outcome, how


_IDLE: list["Supervisor"] = []
"""The worker of the last run that ended normally in this process (at most one), kept for the next
run with the same backends and settings (a test session or notebook running many small runs pays
for one worker start, not one per run)."""


def supervisor(specs: Sequence[str], settings: WorkerSettings, curve: Optional[CopyCurve]) -> "Supervisor":
    """The idle worker of an earlier run of this process when it has the same backends, settings and
    copy timings and is alive, else a new ``Supervisor`` (the idle one, if any, is ended)."""
    key = (tuple(specs), settings, tuple(map(tuple, curve)) if curve else None)
    while _IDLE:
        old = _IDLE.pop()
        if old.key == key and old.alive():
            return old
        old.close()
    return Supervisor(specs, settings, curve)


def done_with(sup: "Supervisor", keep: bool) -> None:
    """The run is over: keep its worker idle for the next run (``keep``, and it is alive) or end it."""
    if keep and sup.alive():
        _IDLE.append(sup)
    else:
        sup.close()


class Supervisor:
    """Runs cases in a worker process (started on first use, replaced after a crash); ``close()``
    ends it.  ``records(case, device, group, checks, phases)`` returns the same records, in the same
    order, as the in-process ``runner._case_records``, except where the worker died."""

    def __init__(self, specs: Sequence[str], settings: WorkerSettings, curve: Optional[CopyCurve]) -> None:
        self.specs, self.settings, self.curve = tuple(specs), settings, curve
        self.key = (self.specs, settings, tuple(map(tuple, curve)) if curve else None)
        self._proc: Any = None
        self._conn: Any = None
        self.formats: frozenset[str] = frozenset()
        """The formats the worker knows (``reference.FORMATS`` there)."""
        self.starts = 0
        """Workers started so far (1 + one per crash or timeout)."""

    # -- the worker's life ------------------------------------------------------------------------

    def _start(self) -> None:
        ctx = mp.get_context("spawn")  # a fresh interpreter: no CUDA context of the parent's
        mine, theirs = ctx.Pipe()
        proc = ctx.Process(target=_worker_main, args=(theirs, self.specs, self.settings, self.curve), name="parity-worker", daemon=True)
        with startable_main():
            proc.start()
        theirs.close()
        self._proc, self._conn = proc, mine
        self.starts += 1
        kind, payload = self._receive(time.monotonic() + START_TIMEOUT_S, "starting")
        if kind != "ready":
            self.close()
            raise _WorkerDied("crash", f"the worker could not load the backends: {payload}")
        self.formats = frozenset(payload)

    def alive(self) -> bool:
        return self._proc is not None and self._proc.is_alive()

    def close(self) -> None:
        """End the worker (a polite stop when it idles, else a kill)."""
        proc, conn, self._proc, self._conn = self._proc, self._conn, None, None
        if proc is None:
            return
        try:
            conn.send(None)
        except (OSError, ValueError):
            pass
        proc.join(2)
        if proc.is_alive():
            proc.kill()
            proc.join(5)
        conn.close()

    def _kill(self) -> str:
        """Kill the worker; how it ended (for a record's message)."""
        proc = self._proc
        if proc.is_alive():
            proc.kill()
        proc.join(10)
        code = proc.exitcode
        self._conn.close()
        self._proc = self._conn = None
        if code is None:
            return "did not end"
        if code < 0:
            try:
                return f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                return f"was killed by signal {-code}"
        return f"exited with code {code}"

    def _receive(self, deadline: Optional[float], doing: str) -> tuple[str, Any]:
        """The next message, or ``_WorkerDied`` when the worker ends or ``deadline`` (monotonic) passes."""
        while True:
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                ready = self._conn.poll(wait)
                if ready:
                    return self._conn.recv()
            except (EOFError, OSError):
                raise _WorkerDied("crash", f"the worker process {self._kill()} during {doing}") from None
            if deadline is not None and time.monotonic() >= deadline:
                self._kill()
                raise _WorkerDied("timeout", f"{doing} ran past its limit; the worker process was killed")
            if not self._proc.is_alive() and not self._conn.poll(0):
                raise _WorkerDied("crash", f"the worker process {self._kill()} during {doing}")

    # -- one case ------------------------------------------------------------------------------------

    def records(self, case: Case, device: str, group: Sequence[LoadedBackend], checks: tuple[str, ...],
                phases: dict[str, float], keep_case: bool = False) -> list[CheckRecord]:
        """``keep_case``: the worker keeps the case's tensors for the next call on the same case."""
        out: list[CheckRecord] = []
        pending = list(group)
        while pending:
            current: Optional[tuple[LoadedBackend, tuple[str, ...]]] = None
            try:
                if self._proc is None:
                    self._start()
                if case.fmt not in self.formats:
                    raise NotIsolatable(f"format {case.fmt!r} was registered in this process at run time, a worker process does not know it")
                self._conn.send((case, device, [b.spec for b in pending], checks, keep_case))
                call_deadline: Optional[float] = None
                while True:
                    doing = "the case's inputs and reference outputs" if current is None else f"check {current[1][0]}"
                    timeout = self.settings.timeout_s
                    kind, payload = self._receive(call_deadline, f"a backend call of {doing} (timeout {timeout:g} s)" if call_deadline else doing)
                    if kind == "call":
                        call_deadline = time.monotonic() + timeout + KILL_GRACE_S if payload and timeout else None
                    elif kind == "begin":
                        spec, chunk = payload
                        current = (next(b for b in pending if b.spec == spec), tuple(chunk))
                    elif kind == "records":
                        out += [CheckRecord.from_json(r) for r in payload]
                    elif kind == "lost":
                        raise _WorkerDied("crash", f"the CUDA context of the worker is lost ({payload})")
                    elif kind == "done":
                        for k, v in payload.items():
                            phases[k] = phases.get(k, 0.0) + v
                        pending = []
                        break
            except _WorkerDied as died:
                if self._proc is not None:
                    self._kill()
                if current is None:  # died before any check: every pending backend of the case
                    out += [crash_record(case, b.spec, c, self.settings, died.outcome, f"{died.how}; no check of this case ran on this backend")
                            for b in pending for chunk in check_chunks(checks) for c in chunk]
                    pending = []
                    continue
                backend, chunk = current
                reported = {r.check for r in out if r.backend == backend.spec}
                for c in (c for ch in check_chunks(checks) for c in ch):
                    if c in reported:
                        continue
                    why = died.how if c in chunk else f"not run: in check {chunk[0]} of this backend on this case, {died.how}"
                    out.append(crash_record(case, backend.spec, c, self.settings, died.outcome, why))
                pending = pending[pending.index(backend) + 1:]
        return in_check_order(out, group)


def crash_record(case: Case, spec: str, check: str, settings: WorkerSettings, outcome: str, message: str) -> CheckRecord:
    """A ``crash``/``timeout`` record (verdict ``fail``) with the repro of that one check."""
    return CheckRecord(case_id=case.id, backend=spec, check=check, verdict="fail", fmt=case.fmt, n=case.n, numel=case.numel,
                       mode=settings.mode, message=message, outcome=outcome,
                       repro=repro_command(case.id, spec, check, settings.seed, settings.mode, timeout_s=settings.timeout_s,
                                           nan_bits=settings.nan_bits))


# -- the worker process ------------------------------------------------------------------------------

def _worker_main(conn: Any, specs: Sequence[str], settings: WorkerSettings, curve: Optional[CopyCurve]) -> None:
    """Load the backends, then run each case the parent sends until it sends ``None`` or goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C belongs to the parent, which kills this process
    _die_with_parent()
    mark_interrupts()
    torch.set_num_threads(max(1, settings.threads))
    try:
        loaded = {s: load(s) for s in specs}
    except Exception as exc:  # noqa: BLE001 - told to the parent, which records it
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    watch_calls(lambda started: conn.send(("call", started)))
    held = HeldCase()
    all_turns: dict[Optional[int], CaseTurns] = {}
    conn.send(("ready", sorted(FORMATS)))
    while True:
        try:
            job = conn.recv()
        except EOFError:  # the parent is gone
            return
        if job is None:
            return
        case, device, group_specs, checks, keep = job
        phases = dict.fromkeys(PHASES, 0.0)
        dev = torch.device(device)
        cuda = dev.type == "cuda"
        turns: Optional[CaseTurns] = None
        if settings.gpu_share_mib is not None:  # one of several case workers: lease the GPU (or the host) per case
            index = (torch.cuda.current_device() if dev.index is None else dev.index) if cuda else None
            turns = all_turns.get(index) or all_turns.setdefault(index, CaseTurns(index, settings.gpu_share_mib))

        def begin(b: LoadedBackend, chunk: tuple[str, ...]) -> None:
            if turns is not None:
                turns.chunk()
            conn.send(("begin", (b.spec, chunk)))

        if turns is not None:
            waited = turns.waited_s
            turns.start(case)
        try:
            for recs in case_chunks(settings, case, device, [loaded[s] for s in group_specs], checks, curve, phases, begin, held, keep,
                                    turns.alone if turns is not None else None):
                lost = _cuda_lost() if cuda else None
                if lost is not None:  # the check that lost it fails as a crash; the parent starts a fresh worker
                    recs = [replace(r, verdict="fail", outcome="crash", message=f"the CUDA context is lost after this check ({lost}); {r.message}")
                            for r in recs]
                conn.send(("records", [r.to_json() for r in recs]))
                if lost is not None:
                    conn.send(("lost", lost))
                    return
        finally:
            if turns is not None:
                turns.end()
        if turns is not None:
            phases["lease_wait"] += turns.waited_s - waited
        conn.send(("done", {k: v for k, v in phases.items() if k in PHASES}))


def _die_with_parent() -> None:
    """On Linux: this process gets SIGKILL when its parent dies (even by SIGKILL), so a worker stuck in
    a backend call never outlives its run; elsewhere the parent's exit ends it (a daemonic process)."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass


def _cuda_lost() -> Optional[str]:
    """Why this process's CUDA context is unusable (a sticky error such as an illegal memory access),
    or ``None`` when it still works."""
    try:
        torch.cuda.synchronize()
        torch.empty(1, device="cuda").add_(1)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - the reason is reported
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return None
