"""The kernel against Model-Optimizer's real CUDA extension (the shipped golden vectors), bit for bit.

Every bf16 bit pattern, 8 amax values, computed on an H200 by ``fake_tensor_quant`` /
``scaled_e4m3``: production fake quant that nobody here wrote (``moe_fq_parity.reference.golden``).
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity.reference.golden import load_golden

from .bitcheck import assert_same_bits

FORWARD = {"int8_wide": ("int8", {}), "int8_narrow": ("int8", {"narrow_range": True}), "int4_wide": ("int4", {}), "fp8_e4m3": ("fp8_e4m3", {})}


@pytest.fixture(scope="module")
def golden():
    return load_golden()


def _inputs(golden, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.from_numpy(golden["x_bits"]).view(torch.bfloat16).reshape(1, 256, 256)
    amax = torch.from_numpy(golden["amax"])
    return x.expand(len(amax), 256, 256).contiguous().to(device), amax.to(device)


def _bf16(bits) -> torch.Tensor:
    return torch.from_numpy(bits).view(torch.bfloat16).reshape(-1, 256, 256)


@pytest.mark.parametrize("key", list(FORWARD))
def test_forward_equals_modelopt_cuda(key: str, golden, device: str) -> None:
    x, amax = _inputs(golden, device)
    fmt, options = FORWARD[key]
    assert_same_bits([kernels.fake_quant(x, amax, fmt, **options)], [_bf16(golden[key])], [x], case=key)


@pytest.mark.parametrize("key", ["int8_wide_clipgrad", "fp8_e4m3_clipgrad", "int8_wide_passgrad"])
def test_backward_equals_modelopt_cuda(key: str, golden, device: str) -> None:
    x, amax = _inputs(golden, device)
    ones = torch.ones_like(x)
    mode = "pass_through" if key.endswith("passgrad") else "clipped"
    assert_same_bits([kernels.ste_backward(x, amax, ones, mode)], [_bf16(golden[key])], [x], case=key)
