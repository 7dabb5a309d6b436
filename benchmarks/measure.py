"""One case's numbers: the kernel alone, the public call (checked and unchecked), the same-size
copy, host time of one call, and the per-expert eager loop; bit-exactness first.

Timers: ``graph_ms`` (``triton.testing.do_bench_cudagraph`` over a cycle of input copies, for the
kernel alone), ``api_ms`` (windows of ``triton.testing.do_bench``, L2 flushed per call, for the
public call), and ``harness.core.timing`` (``time_call`` for the eager loop, ``host_samples_us``
for host time, the copy curve for the same-size copy).
"""

from __future__ import annotations

import itertools
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.timing import copy_us_at, host_samples_us, time_call
from moe_fq_parity.kernels import api, checks, launch, tables
from moe_fq_parity.kernels.amax import amax_for_list
from moe_fq_parity.kernels.formats import FMT_NVFP4, parse_spec

from .cases import FORMATS, BenchFormat, make_experts

L2_MULTIPLE = 4
"""The kernel-alone timing cycles over enough input copies to exceed this many L2 caches."""


@dataclass
class CaseResult:
    """One case's numbers (ms, GB/s, % of copy bandwidth, us; ``None`` = not measured); keys are
    the ``BenchFormat`` keys and ``bwd_clipped``."""

    case: str
    n: int
    shape: tuple[int, int]
    bytes_fwd: int = 0
    bytes_bwd: int = 0
    correct: dict[str, bool] = field(default_factory=dict)
    kernel_ms: dict[str, float] = field(default_factory=dict)
    gbps: dict[str, float] = field(default_factory=dict)
    pct_copy: dict[str, float] = field(default_factory=dict)
    public_ms: dict[str, float] = field(default_factory=dict)
    pct_public: dict[str, float] = field(default_factory=dict)
    unchecked_ms: dict[str, float] = field(default_factory=dict)
    pct_unchecked: dict[str, float] = field(default_factory=dict)
    host_us: dict[str, float] = field(default_factory=dict)
    copy_same_ms: dict[str, float] = field(default_factory=dict)
    """``fwd``/``bwd``: a copy moving ``bytes_fwd``/``bytes_bwd`` under the public call's timer."""
    pct_copy_same: dict[str, float] = field(default_factory=dict)
    eager_loop_ms: dict[str, float | None] = field(default_factory=dict)
    speedup_vs_loop: dict[str, float] = field(default_factory=dict)


def graph_ms(fns: list[Callable[[], None]]) -> float:
    """Median ms per call of a CUDA graph cycling over ``fns`` (each on its own buffers)."""
    from triton.testing import do_bench_cudagraph  # deferred: Triton is an optional extra

    cycle = itertools.cycle(fns)
    return do_bench_cudagraph(lambda: next(cycle)(), rep=20, return_mode="median")


def _copies(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(8, -(-L2_MULTIPLE * l2 // max(nbytes, 1))))


def pct(nbytes: int, ms: float, copy_gbps: float) -> float:
    """``nbytes`` moved in ``ms`` as % of ``copy_gbps``."""
    return 100.0 * nbytes / ms / 1e6 / copy_gbps


class KernelRunner:
    """Prepared launches (tables, outputs) over ``copies`` input sets, for timing and checking."""

    def __init__(self, sets: list[tuple[list[torch.Tensor], torch.Tensor]]):
        self.sets = sets
        self.tables = [tables.expert_table(ws) for ws, _ in sets]
        self.outs = [tables.alloc_outputs(t, torch.bfloat16, ws[0].device) for t, (ws, _) in zip(self.tables, sets)]

    def fwd(self, bf: BenchFormat, config=None) -> list[Callable[[], None]]:
        spec = parse_spec(bf.fmt, None, bf.options)
        fns = []
        for (ws, amax), table, (flat, _) in zip(self.sets, self.tables, self.outs):
            if bf.takes_amax:
                view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=spec.code == FMT_NVFP4)
            else:
                view = api.expert_amax(spec, None, table)
            fns.append(lambda t=table, w=ws, f=flat, v=view: launch.fwd_list(t, w, f, v, spec, check=False, config=config))
        return fns

    def bwd(self, grads: list[torch.Tensor], config=None) -> list[Callable[[], None]]:
        fns = []
        for ws, amax in self.sets:
            table = tables.expert_table(ws, grads)
            flat, _ = tables.alloc_outputs(table, grads[0].dtype, grads[0].device)
            view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=False)
            fns.append(lambda t=table, w=ws, f=flat, v=view: launch.bwd_list(t, w, grads, f, v, config=config))
        return fns


def matches_reference(bf: BenchFormat, ws: list[torch.Tensor], amax: torch.Tensor, outs: list[torch.Tensor]) -> bool:
    """The first and last experts' outputs equal the reference's bit for bit."""
    idx = sorted({0, len(ws) - 1})
    a = bf.amax(amax)
    want = reference.fake_quant_experts([ws[i] for i in idx], None if a is None else a[idx], bf.fmt, **bf.options)
    return all(torch.equal(outs[i].view(torch.int16), w.view(torch.int16)) for i, w in zip(idx, want))


def bwd_matches(ws, amax, grads, config=None) -> bool:
    """The clipped backward (with ``config``, else the default) equals the reference's bit for bit."""
    if config is None:
        got = api.ste_backward_experts(ws, amax, grads, "clipped")
    else:
        table = tables.expert_table(ws, grads)
        flat, got = tables.alloc_outputs(table, grads[0].dtype, grads[0].device)
        view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=False)
        launch.bwd_list(table, ws, grads, flat, view, config=config)
    want = reference.ste_backward_experts(ws, amax, grads, "clipped")
    return all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))


def eager_ms(fn: Callable[[], object], reps: int = 3) -> float:
    """Median ms of ``reps`` calls after one warm-up (``time_call``; eager baselines take tens of ms each)."""
    return statistics.median(time_call(fn, torch.device("cuda"), reps=reps, warmup=1)[0]) / 1e3


API_WINDOWS = 3
"""``do_bench`` windows per public-call timing; the median window is quoted."""


def api_ms(fn: Callable[[], object]) -> float:
    """Median over ``API_WINDOWS`` windows of ``do_bench``'s median (25 ms each, L2 flushed per call).

    One window now and then runs far slower than the windows around it, with the same calls and
    nothing else on the GPU (``docs/kernels_performance.md`` section 9); with one window per number
    such an outlier reached the table.  The median of three keeps a lone slow window out; two in a
    row still show."""
    from triton.testing import do_bench  # deferred: Triton is an optional extra

    return statistics.median(do_bench(fn, warmup=5, rep=25, return_mode="median") for _ in range(API_WINDOWS))


def bench_case(name: str, n: int, shape: tuple[int, int], copy_gbps: float, args, configs: dict | None = None, curve=None) -> CaseResult:
    """One case's row; ``curve`` (``harness.core.timing.copy_curve``) gives its same-size copy.
    ``args``: ``host_reps``, ``eager_max_gb`` and ``eager_formats`` of the command line."""
    numel = n * shape[0] * shape[1]
    res = CaseResult(name, n, shape, 4 * numel, 6 * numel)
    if curve:
        for key, nbytes in (("fwd", res.bytes_fwd), ("bwd", res.bytes_bwd)):
            res.copy_same_ms[key] = ms = copy_us_at(curve, nbytes) / 1e3
            res.pct_copy_same[key] = pct(nbytes, ms, copy_gbps)
    sets = [make_experts(n, shape, seed=k) for k in range(_copies(res.bytes_fwd))]
    runner = KernelRunner(sets)
    ws, amax = sets[0]
    configs = configs or {}
    grads = [torch.randn_like(w) for w in ws]
    for bf in FORMATS:
        fmt = bf.key
        cfg = configs.get(bf.key)
        runner.fwd(bf, cfg)[0]()
        res.correct[fmt] = matches_reference(bf, ws, amax, runner.outs[0][1])
        if not res.correct[fmt]:
            continue
        res.kernel_ms[fmt] = ms = graph_ms(runner.fwd(bf, cfg))
        res.gbps[fmt] = res.bytes_fwd / ms / 1e6
        res.pct_copy[fmt] = pct(res.bytes_fwd, ms, copy_gbps)
        if configs:
            continue  # the public call uses the defaults of kernels/launch.py
        call = lambda b=bf, **kw: api.fake_quant_experts(ws, b.amax(amax), b.fmt, **b.options, **kw)  # noqa: E731
        res.public_ms[fmt] = api_ms(call)
        res.unchecked_ms[fmt] = api_ms(lambda c=call: c(check_values=False))
        res.pct_public[fmt] = pct(res.bytes_fwd, res.public_ms[fmt], copy_gbps)
        res.pct_unchecked[fmt] = pct(res.bytes_fwd, res.unchecked_ms[fmt], copy_gbps)
        res.host_us[fmt] = statistics.median_high(host_samples_us(call, args.host_reps))
    checks.raise_pending_errors()  # the benchmark's inputs are valid: nothing may be pending
    bwd_fns = runner.bwd(grads, configs.get("bwd_clipped"))
    res.correct["bwd_clipped"] = bwd_matches(ws, amax, grads)
    if res.correct["bwd_clipped"]:
        key = "bwd_clipped"
        res.kernel_ms[key] = ms = graph_ms(bwd_fns)
        res.gbps[key] = res.bytes_bwd / ms / 1e6
        res.pct_copy[key] = pct(res.bytes_bwd, ms, copy_gbps)
        if not configs:
            bwd = lambda: api.ste_backward_experts(ws, amax, grads, "clipped")  # noqa: E731
            res.public_ms[key] = res.unchecked_ms[key] = api_ms(bwd)
            res.pct_public[key] = res.pct_unchecked[key] = pct(res.bytes_bwd, res.public_ms[key], copy_gbps)
            res.host_us[key] = statistics.median_high(host_samples_us(bwd, args.host_reps))
    del runner, sets, bwd_fns
    if res.bytes_fwd / 1e9 <= args.eager_max_gb:
        for fmt in args.eager_formats:
            res.eager_loop_ms[fmt] = eager_ms(lambda f=fmt: reference.fake_quant_experts(ws, amax, f))
        res.eager_loop_ms["bwd_clipped"] = eager_ms(lambda: reference.ste_backward_experts(ws, amax, grads, "clipped"))
        for key, ms in res.eager_loop_ms.items():
            base = res.public_ms.get(key) or res.kernel_ms.get(key)
            if ms and base:
                res.speedup_vs_loop[key] = ms / base
    return res


def peak_extra_memory(n: int, shape: tuple[int, int]) -> dict[str, float]:
    """Peak GPU memory allocated by one public call beyond its inputs, vs the outputs' size."""
    ws, amax = make_experts(n, shape, seed=99)
    out_bytes = n * shape[0] * shape[1] * 2
    result = {"output_bytes": out_bytes}
    for check in (False, True):
        api.fake_quant_experts(ws, amax, "fp8_e4m3", check_values=check)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        outs = api.fake_quant_experts(ws, amax, "fp8_e4m3", check_values=check)
        torch.cuda.synchronize()
        result[f"peak_extra_bytes_check_{check}"] = torch.cuda.max_memory_allocated() - base
        del outs
    return result
