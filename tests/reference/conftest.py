"""Shared inputs for the reference tests."""

from __future__ import annotations

import numpy as np
import pytest
import torch


AMAX_SWEEP = [
    1.0, 2.0, 0.5, 2.0**-10, 2.0**10,  # powers of two
    float(np.nextafter(np.float32(1.0), np.float32(2))), float(np.nextafter(np.float32(1.0), np.float32(0))),
    float(np.nextafter(np.float32(64.0), np.float32(100))), float(np.nextafter(np.float32(64.0), np.float32(0))),
    0.75, 3.1415927, 0.1, 0.7, 1.3, 123.0, 448.0, 1e-3,  # ordinary
    2.0**-24, 2.0**-25, 1.5 * 2.0**-24, 2.0**-20, 0.0,  # tiny and zero
    3.0e38, 1e30, 65504.0,  # huge
]


@pytest.fixture(scope="session")
def all_bf16() -> torch.Tensor:
    """Every bf16 bit pattern, as a [256, 256] bf16 tensor (NaN and Inf included)."""
    return torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)


@pytest.fixture(scope="session")
def golden() -> dict:
    """The shipped golden vectors (``moe_fq_parity.reference.golden``); a missing file is an error, not a skip."""
    from moe_fq_parity.reference.golden import load_golden

    return load_golden()
