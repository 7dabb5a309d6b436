"""The reference agrees bit for bit with an independent numpy-fp32 evaluation of the formulas:
every bf16 bit pattern for a sweep of amax values, and >= 1M random values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moe_fq_parity import reference as R

from .conftest import AMAX_SWEEP
from .numpy_oracle import fp8_fake_quant_bits, int_fake_quant_bits

SEED = 20261122


def _check(x: torch.Tensor, amax: float, fmt: str, oracle) -> str | None:
    got = R.fake_quant(x, torch.tensor(amax, dtype=torch.float32), fmt).reshape(-1).view(torch.int16).numpy()
    want = oracle(x.reshape(-1).view(torch.int16).numpy())
    bad = np.nonzero(got != want)[0]
    if bad.size:
        j = bad[0]
        return f"{fmt} amax={amax!r}: {bad.size} differ; first x_bits={x.reshape(-1).view(torch.int16)[j].item():#06x} got={got[j]:#06x} want={want[j]:#06x}"
    return None


ORACLES = {
    "int8": lambda a: lambda b: int_fake_quant_bits(b, a, 8, False),
    "int4": lambda a: lambda b: int_fake_quant_bits(b, a, 4, False),
    "fp8_e4m3": lambda a: lambda b: fp8_fake_quant_bits(b, a),
}


@pytest.mark.parametrize("fmt", sorted(ORACLES))
def test_all_bf16_patterns(all_bf16, fmt):
    failures = [m for a in AMAX_SWEEP if (m := _check(all_bf16, a, fmt, ORACLES[fmt](a)))]
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_one_million_random_values(fmt):
    g = torch.Generator().manual_seed(SEED)
    n = 1 << 20
    # heavy-tailed values over many binades, plus per-chunk amax spread over orders of magnitude
    x = (torch.randn(n, generator=g) * torch.exp2(torch.randint(-20, 20, (n,), generator=g).float())).to(torch.bfloat16)
    amaxes = (torch.rand(16, generator=g) * torch.exp2(torch.randint(-20, 21, (16,), generator=g).float())).tolist()
    chunks = x.reshape(16, -1)
    failures = [m for c, a in zip(chunks, amaxes) if (m := _check(c.reshape(1, -1), a, fmt, ORACLES[fmt](a)))]
    assert not failures, f"seed={SEED}\n" + "\n".join(failures)
