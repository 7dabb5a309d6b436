"""``harness.core.guard.fingerprint``: every single-bit write to any input changes the checksum of
that input and only that one, for small (batched) and large (chunked) tensors alike."""

from __future__ import annotations

import gc
import random
import signal
import statistics
import time

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


RATIO_BOUND = 40
"""The most N=20,000 may cost over N=1,000 (linear 20x, quadratic 400x): room for a loaded host."""


class _Replay:
    """A backend returning given outputs (the harness's own cost is what is timed)."""

    name = "replay"
    formats = ("int8",)

    def __init__(self, outputs: list) -> None:
        self.outputs = outputs

    def fake_quant(self, weights, amax, fmt, **options):
        return list(self.outputs)


def _forward_check_seconds(n: int) -> float:
    """Process seconds of the harness's per-tensor steps for one forward check of ``n`` one-element
    experts: the input fingerprints, the backend call's guard and output validation, the comparison,
    the summary, the record's JSON and the report's consistency check of it."""
    from moe_fq_parity.cases import make_case
    from moe_fq_parity.cases.inputs import CaseInputs
    from moe_fq_parity.harness.backends import LoadedBackend
    from moe_fq_parity.harness.checks import run_case_checks
    from moe_fq_parity.harness.checks.common import CheckContext
    from moe_fq_parity.harness.checks.forward import Expected
    from moe_fq_parity.reports.schema import record_problems

    case = make_case(fmt="int8", variant="cuda", granularity="per_expert", layout="stacked", n=n, shape=(1, 1), dist="zeros")
    stacked = torch.zeros(n, 1, 1, dtype=torch.bfloat16)
    grads = list(torch.zeros(n, 1, 1, dtype=torch.bfloat16).unbind(0))
    inputs = CaseInputs(case, 0, list(stacked.unbind(0)), torch.zeros(n), grads, stacked)
    outputs = [torch.zeros(1, 1, dtype=torch.bfloat16) for _ in range(n)]
    ctx = CheckContext(LoadedBackend("replay", _Replay(outputs), True, "", "cpu"), inputs, 0, "strict", None)
    gc.collect()
    gc.disable()  # the collector's passes over the whole test process grow with its heap, not with the harness's work
    try:
        start = time.process_time()
        (rec,) = run_case_checks(ctx, ("forward",), Expected(outputs, None))
        problems = record_problems(rec.to_json() | {"key": rec.key})
        seconds = time.process_time() - start
    finally:
        gc.enable()
    assert rec.verdict == "pass" and rec.numel == n and not problems, (rec.message, problems)
    return seconds


def test_a_check_costs_time_linear_in_the_expert_count():
    """20x the experts cost at most 40x the process time (linear: 20x; the fingerprint's batch sum,
    re-added for every tensor, made it about 600x: 350 s for N=20,000).  The small case is the median
    of three runs after a warm-up; past the bound the large one is stopped by a CPU-time alarm."""
    _forward_check_seconds(1000)
    small = statistics.median(_forward_check_seconds(1000) for _ in range(3))
    bound = RATIO_BOUND * small

    def too_slow(signum, frame):
        raise TimeoutError(f"N=20,000 took more than {RATIO_BOUND}x N=1,000's {small:.3f} s of CPU time")

    old = signal.signal(signal.SIGPROF, too_slow)
    signal.setitimer(signal.ITIMER_PROF, bound + 1.0)  # a margin for the case's set-up
    try:
        large = _forward_check_seconds(20_000)
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, old)
    assert large < bound, f"N=20,000: {large:.2f} s, N=1,000: {small:.3f} s: {large / small:.0f}x (linear: 20x)"
