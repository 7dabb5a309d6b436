"""A hanging backend that says when its hang begins (loaded as ``tests.harness.hang_marker_backends:NAME``).

``HangsUninterruptiblyAndSays`` is ``hostile_backends.HangsUninterruptibly`` that first writes a file
named after its process id into the folder named by ``$HANG_MARKER_DIR``: a test signals the run once
every worker hangs, instead of sleeping and hoping they do by then.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.harness.hostile_backends import HangsUninterruptibly

MARKER_DIR_ENV = "HANG_MARKER_DIR"


class HangsUninterruptiblyAndSays(HangsUninterruptibly):
    """Writes ``$HANG_MARKER_DIR/<pid>``, then disarms SIGALRM and loops forever, swallowing even ``BaseException``."""

    name = "hangs-uninterruptibly-and-says"

    def misbehave(self) -> None:
        (Path(os.environ[MARKER_DIR_ENV]) / str(os.getpid())).touch()
        super().misbehave()
