"""``harness.core.guard.fingerprint``: every single-bit write to any input changes the checksum of
that input and only that one, for small (batched) and large (chunked) tensors alike."""

from __future__ import annotations

import random

import pytest
import torch

from moe_fq_parity.harness.core import guard


def _inputs(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    shapes = [(3, 5), (0, 4), (64, 128), (1,), (7, 9)]
    ts = [torch.randn(s, generator=g).to(torch.bfloat16) for s in shapes]
    ts.append(torch.rand(6, generator=g))  # fp32 (int32 bits): its own batch
    ts.append(None)
    ts.append(torch.randn(guard._SMALL + 333, generator=g).to(torch.bfloat16))  # a large tensor: chunked
    return ts


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_one_flipped_bit_changes_exactly_that_tensor(seed):
    ts = _inputs(seed)
    before = guard.fingerprint(ts)
    assert guard.fingerprint(ts) == before  # deterministic
    rng = random.Random(seed)
    for i, t in enumerate(ts):
        if t is None or t.numel() == 0:
            continue
        bits = t.view(torch.int16 if t.dtype == torch.bfloat16 else torch.int32).reshape(-1)
        for pos in (0, t.numel() - 1, rng.randrange(t.numel())):
            bit = rng.randrange(15)
            bits[pos] ^= 1 << bit
            after = guard.fingerprint(ts)
            changed = [k for k, (a, b) in enumerate(zip(before[1], after[1])) if a != b]
            assert changed == [i], (i, pos, bit, changed)
            bits[pos] ^= 1 << bit
            assert guard.fingerprint(ts) == before


@pytest.mark.parametrize("numel", [10, guard._SMALL * 3 + 5])
def test_swapping_two_elements_changes_it(numel):
    t = torch.arange(numel, dtype=torch.float32)
    before = guard.fingerprint([t])
    t[[2, numel - 3]] = t[[numel - 3, 2]]
    assert guard.fingerprint([t]) != before


def test_many_small_tensors_spill_into_several_batches(monkeypatch):
    monkeypatch.setattr(guard, "_BATCH", 64)
    ts = [torch.full((5, 5), float(k)) for k in range(9)]  # 25 elements each: three batches of 2, and one more
    before = guard.fingerprint(ts)
    ts[5][4, 4] += 1
    after = guard.fingerprint(ts)
    assert [k for k, (a, b) in enumerate(zip(before[1], after[1])) if a != b] == [5]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_on_the_gpu_the_same_sums_as_on_the_host():
    ts = [t for t in _inputs(3) if t is not None]
    host = guard.fingerprint(ts)
    dev = guard.fingerprint([t.cuda() for t in ts])
    assert dev[1] == host[1]
