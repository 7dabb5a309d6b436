"""Put Triton in interpreter mode on CUDA-less machines *before* anything imports it.

Triton decides interpreter mode when it is first imported (``TRITON_INTERPRET=1``); a process that
imports it earlier (for its version, say) and sets the variable later gets kernels that cannot be
called.  The CLI and the pytest plugin call ``prepare()`` first thing.
"""

from __future__ import annotations

import os
import sys


def prepare() -> bool:
    """Set ``TRITON_INTERPRET=1`` when there is no CUDA and the user did not choose; True when set here.

    Does nothing (and returns False) once ``triton`` is imported: the choice is made by then.
    """
    if "TRITON_INTERPRET" in os.environ or "triton" in sys.modules:
        return False
    import torch

    if torch.cuda.is_available():
        return False
    os.environ["TRITON_INTERPRET"] = "1"
    return True
