"""Kernel jobs shared by the GPU test and the interpreter worker (no environment side effects)."""

from __future__ import annotations

import torch

from moe_fq_parity import kernels


def run(job: dict) -> list[torch.Tensor] | torch.Tensor:
    """Run one job dict (``op`` = ``experts`` | ``stacked`` | ``clipped``) through ``kernels``."""
    if job["op"] == "experts":
        return kernels.fake_quant_experts(job["x"], job["amax"], job["fmt"], **job["options"])
    if job["op"] == "stacked":
        return kernels.fake_quant(job["x"], job["amax"], job["fmt"], **job["options"])
    if job["op"] == "clipped":
        return kernels.ste_backward_experts(job["x"], job["amax"], job["grads"], "clipped")
    raise ValueError(f"unknown op {job['op']!r}")
