"""Starting worker processes (``spawn`` / ``forkserver``) from any parent.

Such children re-run the parent's main script by its path before they run anything (so that
objects defined there unpickle).  A parent read from standard input (``python - <<EOF``, common in
CI scripts) names ``<stdin>`` as its main file, which does not exist: every child died with
``FileNotFoundError`` before reporting, and each process-based check failed for a reason that is
not a finding.  ``startable_main`` hides such a name while processes start.  ``usable_cpus`` is how
many processes of one thread each the host runs at once; ``share_cpus`` gives a process that runs
beside others of the harness its share of them for PyTorch's threads, and ``cpu_share`` is that
share for the processes it starts.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Iterator

_LOCK = threading.Lock()
_STATE: dict = {"depth": 0, "hidden": None}


@contextmanager
def startable_main() -> Iterator[None]:
    """Around process starts: when ``__main__`` names a file that does not exist (and was not run
    with ``-m``), its ``__file__`` is removed for the duration, so children start without re-running
    it (what they would need from a real main script they cannot get from stdin anyway).
    Re-entrant and thread-safe (concurrent starts share one hiding); restored on exit."""
    main = sys.modules.get("__main__")
    with _LOCK:
        if _STATE["depth"] == 0:
            path = getattr(main, "__file__", None)
            if isinstance(path, str) and getattr(main, "__spec__", None) is None and not os.path.isfile(path):
                _STATE["hidden"] = path
                del main.__file__
        _STATE["depth"] += 1
    try:
        yield
    finally:
        with _LOCK:
            _STATE["depth"] -= 1
            if _STATE["depth"] == 0 and _STATE["hidden"] is not None:
                main.__file__ = _STATE["hidden"]
                _STATE["hidden"] = None


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # no affinity masks on this OS
        return max(1, os.cpu_count() or 1)


def share_cpus(processes: int) -> int:
    """Cap this process's PyTorch intra-op threads at its share of the host's CPUs when
    ``processes`` harness processes run on the host at once (xdist workers, shards on one host,
    section processes): ``max(1, usable_cpus() // processes)``, never raising a lower setting (an
    ``OMP_NUM_THREADS`` or ``torch.set_num_threads`` the user chose).  Returns the thread count now
    in effect.

    Why: each process otherwise starts one thread per CPU, and OpenMP threads of several processes
    that outnumber the CPUs spin against each other (chosen by measurement: docs/measured.md §13).
    """
    import torch

    previous = share_count()
    if processes > previous:
        os.environ[SHARE_ENV] = str(processes)  # children (section processes, dist ranks) inherit it
    share = max(1, usable_cpus() // max(1, processes))
    if torch.get_num_threads() > share:
        torch.set_num_threads(share)
    return torch.get_num_threads()


@contextmanager
def sharing_cpus(processes: int) -> Iterator[int]:
    """``share_cpus(processes)`` for the duration of a block (a run called in process, e.g. from a
    test or a notebook), then this process's threads and share count as they were."""
    import torch

    threads, env = torch.get_num_threads(), os.environ.get(SHARE_ENV)
    try:
        yield share_cpus(processes)
    finally:
        torch.set_num_threads(threads)
        if env is None:
            os.environ.pop(SHARE_ENV, None)
        else:
            os.environ[SHARE_ENV] = env


SHARE_ENV = "PARITY_CPU_SHARE"
"""How many harness processes share this host's CPUs (set by ``share_cpus``, inherited by the
processes this one starts)."""


def share_count() -> int:
    """How many harness processes share this host's CPUs (``PARITY_CPU_SHARE``; 1 when unset or not a number)."""
    try:
        return max(1, int(os.environ.get(SHARE_ENV, "1")))
    except ValueError:
        return 1


SIBLINGS_ENV = "PARITY_CPU_SIBLINGS"
"""How many processes of the same run work beside this one within its share (set in each section
process: the other sections running at once), each keeping about one CPU busy."""


def siblings() -> int:
    """``PARITY_CPU_SIBLINGS`` (0 when unset or not a number)."""
    try:
        return max(0, int(os.environ.get(SIBLINGS_ENV, "0")))
    except ValueError:
        return 0


def cpu_share() -> int:
    """The CPUs this process and the processes it starts may keep busy: ``usable_cpus()`` divided by
    the share count of ``share_cpus`` (``PARITY_CPU_SHARE``), less one per sibling process of the
    run working beside it (``PARITY_CPU_SIBLINGS``), at least 1.  The dist section schedules its
    one-thread rank processes within it, so its ranks leave a CPU to each section running at once
    (the ``moe`` section drives its GPU from one busy thread and slows when that thread waits for a
    CPU)."""
    return max(1, usable_cpus() // share_count() - siblings())
