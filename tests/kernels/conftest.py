"""tests/kernels: the Triton kernels on the GPU when there is one, else under Triton's interpreter.

``TRITON_INTERPRET=1`` must be set before the kernels are first compiled (decorated), so it is set
here, at collection, and only when no CUDA device exists (the harness's Triton backend does the
same).  On a GPU machine the same tests run on the GPU, and ``test_gpu.py`` also runs the
interpreter in a subprocess to compare GPU, interpreter and reference bits.
"""

from __future__ import annotations

import os
import zlib

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture
def device() -> str:
    return DEVICE


def _global_seed(config: pytest.Config) -> int:
    """The parity plugin's seed when it is loaded, else ``PARITY_SEED`` or ``cases.DEFAULT_SEED``."""
    from moe_fq_parity.cases import DEFAULT_SEED

    option = config.getoption("parity_seed", default=None)
    return int(option if option is not None else os.environ.get("PARITY_SEED", DEFAULT_SEED))


def pytest_report_header(config: pytest.Config) -> str:
    mode = "GPU" if torch.cuda.is_available() else "Triton interpreter (TRITON_INTERPRET=1)"
    return f"kernels: seed={_global_seed(config)} mode={mode}"


@pytest.fixture
def gen(request: pytest.FixtureRequest) -> torch.Generator:
    """CPU generator seeded with the global seed + crc32(test id): order- and xdist-independent."""
    return torch.Generator().manual_seed(_global_seed(request.config) + zlib.crc32(request.node.nodeid.encode()))
