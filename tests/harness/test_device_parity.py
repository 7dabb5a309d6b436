"""The reference is bit-identical on the CPU and on a CUDA device (outputs and pre-rounding values)."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.run.device_parity import compare_devices

@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_reference_cpu_and_cuda_bits_identical():
    rows = compare_devices("cuda")
    bad = [r for r in rows if r["output_bits_differ"] or r["pre_round_differ"]]
    assert not bad, bad


def test_device_parity_detects_a_difference(monkeypatch):
    """Self-check of the comparison itself: a 'device' whose result differs must be reported."""
    from moe_fq_parity.harness.run import device_parity as dp

    real = dp.fake_quant_traced

    calls = {"n": 0}

    def flip_second(x, amax, fmt, var, **opts):
        r = real(x, amax, fmt, var, **opts)
        calls["n"] += 1
        if calls["n"] % 2 == 0:  # the "other device" call
            out = r.out.clone()
            out.view(torch.int16 if out.dtype != torch.float32 else torch.int32).reshape(-1)[0] ^= 1
            return type(r)(out, r.pre_round, r.grid_round)
        return r

    monkeypatch.setattr(dp, "fake_quant_traced", flip_second)
    monkeypatch.setattr(dp, "FORMATS", ("int8",))
    monkeypatch.setattr(dp, "AMAX_SWEEP", (1.0,))
    rows = dp.compare_devices("cpu")
    assert rows and all(r["output_bits_differ"] > 0 for r in rows)
