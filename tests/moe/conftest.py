"""tests/moe: run torch single-threaded.

The expert GEMMs here are tiny (a few rows each); with several intra-op threads on a busy
2-core CI machine OpenMP's spin-waits make each one take tens of milliseconds.  Results do not
depend on the thread count (grouped and sequential layers always run under the same setting).
"""

from __future__ import annotations

import pytest
import torch


@pytest.fixture(autouse=True, scope="package")
def _single_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
