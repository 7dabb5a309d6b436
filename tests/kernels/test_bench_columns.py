"""The benchmark's columns: every format the kernel implements, with the options that select kernel
code of their own, launched the way the benchmark launches them (``benchmarks.measure.KernelRunner``)
and checked the way it checks them (``matches_reference``), under the interpreter on CPU hosts."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.benchmarks.cases import FORMATS
from moe_fq_parity.benchmarks.measure import KernelRunner, matches_reference
from moe_fq_parity.kernels.formats import FORMATS as KERNEL_FORMATS


def test_every_kernel_format_and_its_own_code_paths_is_a_column() -> None:
    keys = [b.key for b in FORMATS]
    assert {b.fmt for b in FORMATS} == set(KERNEL_FORMATS) and len(keys) == len(set(keys))
    assert {"nvfp4+2d", "fp8_block+2d", "fp8_block+fp32s", "mxfp8+2d", "mxfp4+2d"} <= set(keys)
    assert [b.key for b in FORMATS if b.takes_amax] == ["int8", "int4", "fp8_e4m3", "nvfp4", "nvfp4+2d"]


@pytest.mark.parametrize("bf", FORMATS, ids=[b.key for b in FORMATS])
def test_the_benchmark_launch_gives_the_reference_bits(bf, device, gen) -> None:
    ws = [(torch.randn(64, 128, generator=gen) * s).to(torch.bfloat16).to(device) for s in (0.01, 1.0, 30.0)]
    amax = torch.stack([w.float().abs().amax() for w in ws]) * 0.9
    runner = KernelRunner([(ws, amax)])
    runner.fwd(bf)[0]()
    outs = runner.outs[0][1]
    assert matches_reference(bf, ws, amax, outs)
    outs[-1].view(torch.int16).view(-1)[5] ^= 1  # one bit of the last expert: the check must see it
    assert not matches_reference(bf, ws, amax, outs)
