"""Starting worker processes (``spawn`` / ``forkserver``) from any parent.

Such children re-run the parent's main script by its path before they run anything (so that
objects defined there unpickle).  A parent read from standard input (``python - <<EOF``, common in
CI scripts) names ``<stdin>`` as its main file, which does not exist: every child died with
``FileNotFoundError`` before reporting, and each process-based check failed for a reason that is
not a finding.  ``startable_main`` hides such a name while processes start.  ``usable_cpus`` is how
many processes of one thread each the host runs at once.
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
