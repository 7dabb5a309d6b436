"""One GPU test per GPU at a time, across pytest-xdist workers (and concurrent pytest sessions), or
several small ones.

A GPU test (marked ``gpu`` or ``slow``) holds a lease on one GPU from before its fixtures are set up
until after they are torn down: the lease is an ``flock`` on a per-GPU lock file, keyed by the GPU's
UUID, in ``PARITY_GPU_LOCK_DIR`` (default ``<tmp>/moe-fq-parity-gpu-locks``).  It is exclusive, except
for the parity tests of small cases (``--parity-gpu-share-mib``), which share the GPU with each other:
their work is a stream of short launches and host synchronisations that one process leaves the GPU
mostly idle for.  The test runs
with that GPU as the current CUDA device.  Before the lease is given back the worker tidies its
memory (``harness.core.memory.tidy``: garbage collected when more than it should hold is still
allocated, PyTorch's cache emptied when more than 1 GiB of it is unused), so the next holder
(another process) finds the memory free.  A test
marked both ``dist`` and ``gpu`` (several GPUs, e.g. NCCL ranks) leases every GPU, in index order.

So with ``pytest -n G`` on G GPUs each GPU serves one exclusive test at a time and G GPU tests run at
once; with more workers than GPUs (``-n auto``), the extra workers run the other tests and the
small parity cases beside each other, and wait for a free GPU when they reach an exclusive GPU test.  Locks held by a process that dies are released by
the kernel.  Tests that are not marked run where they land, as in a serial run.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

import torch

from moe_fq_parity.harness.core.memory import allocated_here, case_bytes, tidy
from moe_fq_parity.harness.core.tolerances import GPU_SHARE_MIB

LOCK_DIR_ENV = "PARITY_GPU_LOCK_DIR"
HELD_ENV = "PARITY_GPU_LEASE_HELD"
"""Set (to ``1``) in the environment while this process holds a lease, so that a process it starts
knows its GPU is already leased on its behalf (``held_here``)."""
POLL_S = 0.01
"""How often a worker waiting for a GPU polls the locks, seconds."""

_held = [0]
"""Leases this process holds now."""


def shares_gpu(case: Any, share_mib: int = GPU_SHARE_MIB) -> bool:
    """Whether ``case`` may hold a shared GPU lease: its input + output bytes at most ``share_mib``
    MiB (0: no case shares)."""
    return share_mib > 0 and case_bytes(case) <= share_mib << 20


def held_here() -> bool:
    """Whether this process, or the process that started it, holds a GPU lease now (a lease taken
    here again would wait for itself)."""
    return _held[0] > 0 or os.environ.get(HELD_ENV) == "1"


def _count(delta: int) -> None:
    _held[0] += delta
    if _held[0] > 0:
        os.environ[HELD_ENV] = "1"
    else:
        os.environ.pop(HELD_ENV, None)


def lock_dir() -> Path:
    """Where the per-GPU lock files live (``PARITY_GPU_LOCK_DIR`` or ``<tmp>/moe-fq-parity-gpu-locks``)."""
    return Path(os.environ.get(LOCK_DIR_ENV) or Path(tempfile.gettempdir()) / "moe-fq-parity-gpu-locks")


def gpu_key(index: int) -> str:
    """A name for visible GPU ``index`` that is the same in every process (its UUID when torch has it)."""
    props = torch.cuda.get_device_properties(index)
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        return f"gpu-{uuid}"
    bus = getattr(props, "pci_bus_id", None)
    return f"gpu-pci-{bus}" if bus is not None else f"gpu-index-{index}"


class Lease:
    """GPUs held by this process until ``release``."""

    def __init__(self, devices: Sequence[int], fds: Sequence[int], waited_s: float) -> None:
        self.devices = tuple(devices)
        self._fds = list(fds)
        self.waited_s = waited_s
        _count(1)

    def release(self, keep_bytes: Optional[int] = None) -> None:
        """Tidy this process's GPU memory (``harness.core.memory.tidy``: ``keep_bytes`` is what it may
        still hold on purpose; ``None``: collect and empty the cache), then unlock (idempotent)."""
        if not self._fds:
            return
        # a failed test's traceback (kept by pytest for post-mortem debugging) would keep its frames' tensors
        for name in ("last_exc", "last_type", "last_value", "last_traceback"):
            if hasattr(sys, name):
                setattr(sys, name, None)
        try:
            tidy(keep_bytes)
        finally:
            for fd in self._fds:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
            self._fds = []
            _count(-1)


def _open(path: Path) -> int:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except PermissionError:  # another user's lock file: a shared lock dir needs only read access
        return os.open(path, os.O_RDONLY)


def acquire(*, all_devices: bool = False, prefer: int = 0, shared: bool = False, only: bool = False,
            directory: Optional[Path] = None) -> Lease:
    """Lease one free GPU (``prefer`` tried first, then the others; waits until one is free), or all;
    ``only``: GPU ``prefer`` and no other.

    ``shared``: a shared lease, held beside other shared leases of the GPU (small parity cases of
    several xdist workers); an exclusive lease waits until the GPU has no lease of either kind.  A
    lease is an ``flock`` on the GPU's lock file (``LOCK_SH`` / ``LOCK_EX``), taken through the GPU's
    gate file: whoever holds the gate is next, and an exclusive lease keeps the gate while it waits
    for the shared ones to end, so a stream of shared leases never starves it.

    Sets the leased GPU (the first one, for ``all_devices``) as the current CUDA device.
    """
    count = torch.cuda.device_count()
    if count < 1:
        raise RuntimeError("no CUDA device to lease")
    root = directory or lock_dir()
    paths = [root / f"{gpu_key(i)}.lock" for i in range(count)]
    start = time.monotonic()
    if all_devices:
        fds = []
        for p in paths:
            gate = _open(p.with_suffix(".gate"))
            try:
                fcntl.flock(gate, fcntl.LOCK_EX)  # held while waiting: no new shared lease starts on this GPU
                fd = _open(p)
                fcntl.flock(fd, fcntl.LOCK_EX)
            finally:
                os.close(gate)
            fds.append(fd)
        torch.cuda.set_device(0)
        return Lease(range(count), fds, time.monotonic() - start)
    order = [prefer] if only else [(prefer + k) % count for k in range(count)]
    k, fd, waited = _wait_for([paths[i] for i in order], shared)
    torch.cuda.set_device(order[k])
    return Lease([order[k]], [fd], waited)


def _wait_for(paths: Sequence[Path], shared: bool) -> tuple[int, int, float]:
    """The first of the lock files ``paths`` free to lock (shared or exclusive), each taken through its
    gate, waiting until one is: ``(its position in paths, descriptor, seconds waited)``.  An exclusive
    lease that found none free keeps the first path's gate while it waits."""
    mode = fcntl.LOCK_SH if shared else fcntl.LOCK_EX
    start = time.monotonic()
    held_gate: Optional[int] = None
    try:
        while True:
            for k, path in enumerate(paths):
                fd = _take(path, mode, gate_held=held_gate is not None and k == 0)
                if fd is not None:
                    return k, fd, time.monotonic() - start
            if not shared and held_gate is None:
                held_gate = _open(paths[0].with_suffix(".gate"))
                try:
                    fcntl.flock(held_gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:  # another lease is next there: try again next round
                    os.close(held_gate)
                    held_gate = None
            time.sleep(POLL_S)
    finally:
        if held_gate is not None:
            os.close(held_gate)  # closing the descriptor releases the gate


def acquire_host(shared: bool, directory: Optional[Path] = None) -> Lease:
    """A lease on this host's memory (case workers of a run on a CPU device: a large case alone, as
    on a GPU), through the same lock files and gate as the GPU leases."""
    _, fd, waited = _wait_for([(directory or lock_dir()) / f"host-{socket.gethostname()}.lock"], shared)
    return Lease((), [fd], waited)


def _take(path: Path, mode: int, gate_held: bool) -> Optional[int]:
    """The lock file ``path`` locked in ``mode`` (its descriptor), taken through its gate (already held
    by the caller when ``gate_held``), or ``None`` when the gate or the lock is held elsewhere."""
    gate = None
    if not gate_held:
        gate = _open(path.with_suffix(".gate"))
        try:
            fcntl.flock(gate, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # someone else is next on this GPU
            os.close(gate)
            return None
    try:
        fd = _open(path)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        return fd
    finally:
        if gate is not None:
            os.close(gate)


class CaseTurns:
    """The leases of one case worker of a run with several workers on one GPU (``run --workers``),
    or, with ``index`` None, on this host's memory (a run on a CPU device: the same rules, so large
    cases never hold the host's memory at once and a timing runs alone).

    A case whose bytes are above ``share_mib`` (``shares_gpu``) holds the GPU alone from its inputs
    to its last check.  A smaller one shares it with the other workers' small cases, one lease for
    its inputs and reference outputs and one per check chunk, so that a worker waiting to hold the
    GPU alone waits for one chunk of each other worker, not for their whole cases; while the perf
    check times the backend (``alone``) it holds the GPU alone: a timing never overlaps another
    process's work.  A small case's tensors stay allocated between its leases (at most ``share_mib``)."""

    def __init__(self, index: Optional[int], share_mib: int) -> None:
        self.index, self.share_mib = index, share_mib
        self._lease: Optional[Lease] = None
        self._shared = self.small = False
        self.waited_s = 0.0
        """Seconds spent waiting for leases so far."""

    def start(self, case: Any) -> None:
        """Before ``case``'s inputs are built: its lease (shared when it is small)."""
        self.small = shares_gpu(case, self.share_mib)
        self._hold(shared=self.small)

    def chunk(self) -> None:
        """Before a check chunk: a small case gives its lease back and takes a shared one for the chunk."""
        if self.small:
            self._hold(shared=True, again=True)

    @contextmanager
    def alone(self) -> Iterator[None]:
        """The GPU held alone for the block (a timing); a small case shares it again after."""
        if not self.small:
            yield
            return
        self._hold(shared=False)
        try:
            yield
        finally:
            self._hold(shared=True)

    def end(self) -> None:
        """After the case (its tensors dropped): give the lease back (``tidy`` first)."""
        if self._lease is not None:
            lease, self._lease = self._lease, None
            lease.release(0)

    def _hold(self, shared: bool, again: bool = False) -> None:
        if self._lease is not None:
            if self._shared == shared and not again:
                return
            lease, self._lease = self._lease, None
            lease.release(allocated_here())
        self._lease = acquire_host(shared) if self.index is None else acquire(prefer=self.index, only=True, shared=shared)
        self._shared = shared
        self.waited_s += self._lease.waited_s
