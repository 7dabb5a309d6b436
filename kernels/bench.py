"""Benchmark: ``python -m moe_fq_parity.kernels.bench --out DIR [--quick] [--sweep] [--host-calls K]`` (needs a CUDA device).

In one run: device copy bandwidth; then per case (N experts of one Nemotron-3 routed-expert shape,
bf16, list layout, N in {4, 8, 16, 32, 64, 128}, plus the Ultra production case N=32 x [5120, 8192])
for every format and the clipped backward:

* ``kernel``: the kernel alone through a prepared table and preallocated outputs
  (``triton.testing.do_bench_cudagraph`` median, cycling over enough input copies to exceed 4x the
  L2 cache);
* ``public``: the public call as users make it (``kernels.fake_quant_experts(ws, amax, fmt)``,
  checks on, the default; ``ste_backward_experts(..., "clipped")``), ``do_bench`` median (L2
  flushed before each call; host time included wherever the host is the slower side);
* ``unchecked``: the public call with ``check_values=False``;
* ``copy_same``: a device copy moving the case's bytes (forward and backward), timed with the L2
  flushed before it as the public call is: the run's copy curve (``harness.core.timing.copy_curve``,
  the perf check's too; its largest copy gives the copy bandwidth) at those bytes; the most a call
  of that size can show under that timer, a guide rather than a bound (on one H100, 92% of copy at
  the 160 MB of Nano N=8, 98-100% from 705 MB);
* ``host_us``: host time of one public default call (``perf_counter``, median of ``--host-reps``
  calls, each started on an idle device);
* ``speedup_vs_loop``: the per-expert eager loop (``reference.fake_quant_experts``, the baseline;
  median of 3 event-timed calls) over the public default call; skipped past ``--eager-max-gb``.

``pct_*`` = (bytes read + bytes written) / time / measured device-to-device copy bandwidth
(forward 4 B/element for bf16; clipped backward 6 B/element).  Only cases whose kernel output
matched the reference bit for bit (experts 0 and N-1) are timed.

``--host-calls K`` (default 1000) adds the host-cost distribution over K calls each of the
functional forward (checked and unchecked), the clipped backward, the same two on one stacked
``[N, out, in]`` tensor (``fake_quant``, ``ste_backward``), and ``QuantGroupedLinear``'s
fake-quant forward (``quantized_weights()``) and backward (clipped STE), the same for the layer with
one stacked weight (``stacked=True``: ``quantized_weight()``), plus the whole layer
(with its N per-expert GEMMs) for scale, against the bound 40 us + 0.5 us per expert, and
PyTorch's own floor for list-in/list-out calls (``host_floor_rows``: N output views, the N-expert
table key, autograd through an N-input no-op node).
``--profile`` adds, per format, the throughput with the data L2-resident (the arithmetic ceiling
without HBM traffic), registers, spills and PTX instruction counts of the production launch.
Prints tables and writes ``DIR/bench.json``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

from moe_fq_parity.harness.core.timing import copy_curve, copy_us_at, curve_gbps

from .formats import FORMATS, parse_spec  # FORMATS: what the kernels implement, each timed

SHAPES = {"nano_fc1": (1856, 2688), "super_fc1": (2688, 1024), "ultra_fc1": (5120, 2048)}
EXPERT_COUNTS = (4, 8, 16, 32, 64, 128)
PRODUCTION = ("ultra_prod", 32, (5120, 8192))


def _first_per_code() -> tuple[str, ...]:
    """One format per kernel code (INT, FP8, NVFP4; the first listed): the eager baselines and the
    sweep's tile kinds (INT4 runs INT8's code path)."""
    first: dict[int, str] = {}
    for f in FORMATS:
        first.setdefault(parse_spec(f, None, {}).code, f)
    return tuple(first.values())


EAGER_FORMATS = _first_per_code()
L2_MULTIPLE = 4


@dataclass
class CaseResult:
    """One case's numbers (ms, GB/s, % of copy bandwidth, us; ``None`` = not measured); keys are
    the formats and ``bwd_clipped``."""

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


def make_experts(n: int, shape: tuple[int, int], seed: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """N bf16 experts with per-expert scales (so per-expert amax differ) and amax = 0.9 max|w|."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    scales = torch.logspace(-2, 0, max(n, 1), device="cuda")
    ws = [(torch.randn(shape, device="cuda", generator=g) * scales[i]).to(torch.bfloat16) for i in range(n)]
    amax = torch.stack([w.float().abs().amax() for w in ws]) * 0.9
    return ws, amax


def _graph_ms(fns: list[Callable[[], None]]) -> float:
    """Median ms per call of a CUDA graph cycling over ``fns`` (each on its own buffers)."""
    from triton.testing import do_bench_cudagraph

    cycle = itertools.cycle(fns)
    return do_bench_cudagraph(lambda: next(cycle)(), rep=20, return_mode="median")


def _copies(nbytes: int) -> int:
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    return max(1, min(8, -(-L2_MULTIPLE * l2 // max(nbytes, 1))))


class KernelRunner:
    """Prepared launches (tables, outputs) over ``copies`` input sets, for timing and checking."""

    def __init__(self, sets: list[tuple[list[torch.Tensor], torch.Tensor]]):
        from . import launch, tables

        self.launch = launch
        self.sets = sets
        self.tables = [tables.expert_table(ws) for ws, _ in sets]
        self.outs = [tables.alloc_outputs(t, torch.bfloat16, ws[0].device) for t, (ws, _) in zip(self.tables, sets)]

    def fwd(self, fmt: str, config=None) -> list[Callable[[], None]]:
        from .amax import amax_for_list
        from .formats import FMT_NVFP4, parse_spec

        spec = parse_spec(fmt, None, {})
        fns = []
        for (ws, amax), table, (flat, _) in zip(self.sets, self.tables, self.outs):
            view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=spec.code == FMT_NVFP4)
            fns.append(lambda t=table, w=ws, f=flat, v=view: self.launch.fwd_list(t, w, f, v, spec, check=False, config=config))
        return fns

    def bwd(self, grads: list[torch.Tensor], config=None) -> list[Callable[[], None]]:
        from . import tables
        from .amax import amax_for_list

        fns = []
        for ws, amax in self.sets:
            table = tables.expert_table(ws, grads)
            flat, _ = tables.alloc_outputs(table, grads[0].dtype, grads[0].device)
            view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=False)
            fns.append(lambda t=table, w=ws, f=flat, v=view: self.launch.bwd_list(t, w, grads, f, v, config=config))
        return fns


def _matches_reference(fmt: str, ws: list[torch.Tensor], amax: torch.Tensor, outs: list[torch.Tensor]) -> bool:
    from moe_fq_parity import reference

    idx = sorted({0, len(ws) - 1})
    want = reference.fake_quant_experts([ws[i] for i in idx], amax[idx], fmt)
    return all(torch.equal(outs[i].view(torch.int16), w.view(torch.int16)) for i, w in zip(idx, want))


def _eager_ms(fn: Callable[[], object], reps: int = 3) -> float:
    """Median of ``reps`` event-timed calls after one warm-up (eager baselines take tens of ms each)."""
    fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


API_WINDOWS = 3
"""``do_bench`` windows per public-call timing; the median window is quoted."""


def _api_ms(fn: Callable[[], object]) -> float:
    """Median over ``API_WINDOWS`` windows of ``do_bench``'s median (25 ms each, L2 flushed per call).

    One window now and then runs far slower than the windows around it: 4 of 144 on one H100
    (41-58% of copy; every other window 84-99%, same calls, nothing else on the GPU).  One window
    per number put such outliers into the table (N=128 FP8 default 23%, kernel 98%).  The median
    of three keeps a lone slow window out; two in a row still show."""
    from triton.testing import do_bench

    return statistics.median(do_bench(fn, warmup=5, rep=25, return_mode="median") for _ in range(API_WINDOWS))


def host_samples_us(fn: Callable[[], object], calls: int, *, before: Callable[[], object] = lambda: None,
                    sync: Callable[[], None] | None = None) -> list[float]:  # fmt: skip
    """Host time (us) of ``calls`` calls of ``fn``, each started with the device idle (``before()``
    and a sync first, not timed), so the number is what the host spends issuing one call.  One
    untimed call first; ``sync`` defaults to ``torch.cuda.synchronize``."""
    sync = torch.cuda.synchronize if sync is None else sync
    before()
    fn()
    sync()
    out = []
    for _ in range(calls):
        before()
        sync()
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    sync()
    return out


def _median(xs: list[float]) -> float:
    return sorted(xs)[len(xs) // 2]


def _kind(fmt: str) -> str:
    """The ``EAGER_FORMATS`` entry sharing ``fmt``'s kernel code (the key of the tuned configs)."""
    code = parse_spec(fmt, None, {}).code
    return next(f for f in EAGER_FORMATS if parse_spec(f, None, {}).code == code)


def _pct(nbytes: int, ms: float, copy_gbps: float) -> float:
    return 100.0 * nbytes / ms / 1e6 / copy_gbps


def bench_case(name: str, n: int, shape: tuple[int, int], copy_gbps: float, args, configs: dict | None = None, curve=None) -> CaseResult:
    """One case's row; ``curve`` (``harness.core.timing.copy_curve``) gives its same-size copy."""
    from moe_fq_parity import reference

    from . import api

    numel = n * shape[0] * shape[1]
    res = CaseResult(name, n, shape, 4 * numel, 6 * numel)
    if curve:
        for key, nbytes in (("fwd", res.bytes_fwd), ("bwd", res.bytes_bwd)):
            res.copy_same_ms[key] = ms = copy_us_at(curve, nbytes) / 1e3
            res.pct_copy_same[key] = _pct(nbytes, ms, copy_gbps)
    sets = [make_experts(n, shape, seed=k) for k in range(_copies(res.bytes_fwd))]
    runner = KernelRunner(sets)
    ws, amax = sets[0]
    configs = configs or {}
    grads = [torch.randn_like(w) for w in ws]
    for fmt in FORMATS:
        cfg = configs.get(_kind(fmt))
        runner.fwd(fmt, cfg)[0]()
        res.correct[fmt] = _matches_reference(fmt, ws, amax, runner.outs[0][1])
        if not res.correct[fmt]:
            continue
        res.kernel_ms[fmt] = ms = _graph_ms(runner.fwd(fmt, cfg))
        res.gbps[fmt] = res.bytes_fwd / ms / 1e6
        res.pct_copy[fmt] = _pct(res.bytes_fwd, ms, copy_gbps)
        if configs:
            continue  # the public call uses the defaults of kernels/launch.py
        res.public_ms[fmt] = _api_ms(lambda f=fmt: api.fake_quant_experts(ws, amax, f))
        res.unchecked_ms[fmt] = _api_ms(lambda f=fmt: api.fake_quant_experts(ws, amax, f, check_values=False))
        res.pct_public[fmt] = _pct(res.bytes_fwd, res.public_ms[fmt], copy_gbps)
        res.pct_unchecked[fmt] = _pct(res.bytes_fwd, res.unchecked_ms[fmt], copy_gbps)
        res.host_us[fmt] = _median(host_samples_us(lambda f=fmt: api.fake_quant_experts(ws, amax, f), args.host_reps))
    from . import checks

    checks.raise_pending_errors()  # the benchmark's inputs are valid: nothing may be pending
    bwd_fns = runner.bwd(grads, configs.get("bwd_clipped"))
    res.correct["bwd_clipped"] = _bwd_matches(ws, amax, grads)
    if res.correct["bwd_clipped"]:
        key = "bwd_clipped"
        res.kernel_ms[key] = ms = _graph_ms(bwd_fns)
        res.gbps[key] = res.bytes_bwd / ms / 1e6
        res.pct_copy[key] = _pct(res.bytes_bwd, ms, copy_gbps)
        if not configs:
            bwd = lambda: api.ste_backward_experts(ws, amax, grads, "clipped")  # noqa: E731
            res.public_ms[key] = res.unchecked_ms[key] = _api_ms(bwd)
            res.pct_public[key] = res.pct_unchecked[key] = _pct(res.bytes_bwd, res.public_ms[key], copy_gbps)
            res.host_us[key] = _median(host_samples_us(bwd, args.host_reps))
    del runner, sets, bwd_fns
    if res.bytes_fwd / 1e9 <= args.eager_max_gb:
        for fmt in args.eager_formats:
            res.eager_loop_ms[fmt] = _eager_ms(lambda f=fmt: reference.fake_quant_experts(ws, amax, f))
        res.eager_loop_ms["bwd_clipped"] = _eager_ms(lambda: reference.ste_backward_experts(ws, amax, grads, "clipped"))
        for key, ms in res.eager_loop_ms.items():
            base = res.public_ms.get(key) or res.kernel_ms.get(key)
            if ms and base:
                res.speedup_vs_loop[key] = ms / base
    return res


def _bwd_matches(ws, amax, grads) -> bool:
    from moe_fq_parity import reference

    from . import api

    got = api.ste_backward_experts(ws, amax, grads, "clipped")
    want = reference.ste_backward_experts(ws, amax, grads, "clipped")
    return all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))


def peak_extra_memory(n: int, shape: tuple[int, int]) -> dict[str, float]:
    """Peak GPU memory allocated by one public call beyond its inputs, vs the outputs' size."""
    from . import api

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


SWEEP_TILES = ((4096, 4, 1), (4096, 4, 4), (2048, 4, 1), (2048, 4, 2), (2048, 4, 8), (8192, 8, 1), (8192, 8, 2))
"""(elements per tile, warps, tiles per program) tried per kernel at the production case."""


def sweep(copy_gbps: float, kinds: str = "") -> tuple[list[dict], dict[str, object]]:
    """Tile configurations at the Ultra production case; returns the rows and the fastest
    ``KernelConfig`` per kernel (``int8`` stands for INT, ``bwd_clipped`` for the backward)."""
    from .launch import BWD_CONFIG, FWD_CONFIG, KernelConfig

    _, n, shape = PRODUCTION
    runner = KernelRunner([make_experts(n, shape, seed=0)])
    grads = [torch.randn_like(w) for w in runner.sets[0][0]]
    numel = n * shape[0] * shape[1]
    defaults = {**{f: FWD_CONFIG[parse_spec(f, None, {}).code] for f in EAGER_FORMATS}, "bwd_clipped": BWD_CONFIG}
    plan = [(kind, KernelConfig(b, w, tiles_per_program=t, nvfp4_int_recip=defaults[kind].nvfp4_int_recip))
            for b, w, t in SWEEP_TILES for kind in defaults]  # fmt: skip
    plan += [("int8", KernelConfig(4096, 4, tiles_per_program=4, scalar_int_div=True)),
             ("nvfp4", KernelConfig(4096, 8, tiles_per_program=4, nvfp4_int_recip=True))]  # fmt: skip
    wanted = {k for k in kinds.split(",") if k}
    plan += [("nvfp4", KernelConfig(b, w, tiles_per_program=t, nvfp4_int_recip=False)) for b, w, t in ((1024, 4, 8), (2048, 8, 8), (4096, 4, 8))]
    plan = [(k, c) for k, c in plan if not wanted or k in wanted]
    rows, best = [], {}
    for kind, cfg in plan:
        fns = runner.bwd(grads, cfg) if kind == "bwd_clipped" else runner.fwd(kind, cfg)
        ms = _graph_ms(fns)
        pct = 100 * (6 if kind == "bwd_clipped" else 4) * numel / ms / 1e6 / copy_gbps
        rows.append({"kind": kind, **asdict(cfg), "ms": ms, "pct_copy": pct})
        if kind not in best or ms < best[kind][0]:
            best[kind] = (ms, cfg)
        print(f"  sweep {kind:12s} block={cfg.block:6d} warps={cfg.num_warps:2d} tpp={cfg.tiles_per_program} "
              f"int_div={cfg.scalar_int_div:d} int_recip={cfg.nvfp4_int_recip:d}  {ms:7.3f} ms  {pct:5.1f}%", flush=True)  # fmt: skip
    return rows, {k: v[1] for k, v in best.items()}


def triton_copy_pct(copy_gbps: float) -> float:
    """A plain Triton copy through the same tensor-of-pointers tiling (no arithmetic): what the
    access pattern alone reaches at the Ultra production case, as % of copy bandwidth."""
    from .copy_kernel import tiled_copy_kernel
    from .formats import FMT_FP8
    from .geometry import grid_for
    from .launch import FWD_CONFIG, tile_for

    _, n, shape = PRODUCTION
    runner = KernelRunner([make_experts(n, shape, seed=0)])
    (ws, _), table, (flat, _) = runner.sets[0], runner.tables[0], runner.outs[0]
    cfg = FWD_CONFIG[FMT_FP8]
    tile = tile_for(table.shapes, cfg, ws[0].device)
    grid = grid_for(table.shapes, tile)
    xi, fi = ws[table.base].view(torch.int16), flat.view(torch.int16)
    launch_copy = lambda: tiled_copy_kernel[grid](xi, fi, table.meta, n, VEC=table.xvec, BR=tile.br, BC=tile.bc, TPP=tile.tpp,  # noqa: E731
                                                  num_warps=tile.num_warps)
    ms = _graph_ms([launch_copy])
    return 100 * 4 * n * shape[0] * shape[1] / ms / 1e6 / copy_gbps


FIRST = (("ultra_prod", 32), ("wide_1024x2048", 128), ("super_fc1", 64), ("nano_fc1", 8))
"""Timed first (partial results are written after every case): the production case and the
acceptance cases N=128 x [1024, 2048], N=64 x Super fc1, N=8 x Nano fc1."""


def _cases(quick: bool) -> list[tuple[str, int, tuple[int, int]]]:
    counts = (4, 32, 128) if quick else EXPERT_COUNTS
    shapes = {"ultra_fc1": SHAPES["ultra_fc1"]} if quick else SHAPES
    cases = [(f"{name}/N{n}", n, shape) for name, shape in shapes.items() for n in counts]
    cases += [(f"wide_1024x2048/N128", 128, (1024, 2048)), (f"{PRODUCTION[0]}/N{PRODUCTION[1]}", PRODUCTION[1], PRODUCTION[2])]
    first = [c for key in FIRST for c in cases if c[0] == f"{key[0]}/N{key[1]}"]
    return first + [c for c in cases if c not in first]


KEYS = (*FORMATS, "bwd_clipped")
TABLE_HEAD = (f"{'case':20s} {'MB':>6s} " + " ".join(f"{k[:9]:>17s}" for k in KEYS) + f" {'same-size copy':>14s}"
              + f"  {'host us (' + '/'.join(k[:4] for k in KEYS) + ')':>34s}  {'x loop (fp8/bwd)':>16s}")  # fmt: skip
TABLE_NOTE = ("per format: kernel / public default / public unchecked, % of copy bandwidth; same-size copy: a copy of the "
              "forward / backward bytes timed as the public call, % of copy")  # fmt: skip


def table_row(r: CaseResult) -> str:
    def cell(k: str) -> str:
        vals = (r.pct_copy.get(k), r.pct_public.get(k), r.pct_unchecked.get(k))
        return "/".join("-" if v is None else f"{v:.0f}" for v in vals)

    host = "/".join(f"{r.host_us[k]:.0f}" if k in r.host_us else "-" for k in KEYS)
    sp = "/".join(f"{r.speedup_vs_loop[k]:.0f}" if k in r.speedup_vs_loop else "-" for k in ("fp8_e4m3", "bwd_clipped"))
    same = "/".join(f"{r.pct_copy_same[k]:.0f}" if k in r.pct_copy_same else "-" for k in ("fwd", "bwd"))
    return f"{r.case:20s} {r.bytes_fwd / 1e6:6.0f} " + " ".join(f"{cell(k):>17s}" for k in KEYS) + f" {same:>14s}  {host:>34s}  {sp:>16s}"


def print_table(results: list[CaseResult], copy_gbps: float) -> None:
    print(f"\ncopy bandwidth {copy_gbps:.0f} GB/s (read + write); {TABLE_NOTE}; host us of one default call; "
          "speedup of the default call vs the per-expert eager loop")  # fmt: skip
    print(TABLE_HEAD)
    for r in results:
        print(table_row(r))


def host_bound_us(n: int) -> float:
    """The host-cost target per call: 40 us + 0.5 us per expert."""
    return 40.0 + 0.5 * n


def _stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
    return {"calls": len(s), "min": s[0], "p10": q(0.10), "median": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1]}


class _NoOpExperts(torch.autograd.Function):
    """N weights in, N fresh views of one buffer out; backward hands the gradients straight back:
    the autograd engine's own cost for an N-input node (and N ``AccumulateGrad``s), no kernel."""

    @staticmethod
    def forward(ctx, *ws):  # type: ignore[override]
        return torch.empty((len(ws), *ws[0].shape), dtype=ws[0].dtype, device=ws[0].device).unbind(0)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        return grads


FLOOR_ENTRIES = ("floor: N output views (torch.empty + unbind)", "floor: table key of N experts",
                 "floor: autograd backward of an N-input no-op node")  # fmt: skip
"""PyTorch's own host cost for what any list-in/list-out call must do (``host_floor_rows``)."""


def host_floor_rows(params: list[torch.Tensor], grads: list[torch.Tensor], calls: int,
                    sync: Callable[[], None] = lambda: None) -> list[dict]:  # fmt: skip
    """Host time (us) of the work no implementation of the public calls can skip, over ``calls``
    calls each, for N = ``len(params)`` experts of one shape (``params`` require grad):

    * creating the N output tensors (one ``torch.empty`` and ``unbind``: the cheapest way);
    * reading each expert's address, shape, contiguity and dtype (``launch.table_key``: what tells a
      reused table from a stale one);
    * ``torch.autograd.backward`` through one N-input node that does nothing (the engine and the N
      gradient accumulations of a module with N weights).

    ``sync`` runs before each timed call (the device's synchronize on a GPU)."""
    from .tables import table_key

    n, shape, dtype, device = len(params), tuple(params[0].shape), params[0].dtype, params[0].device
    state: dict = {}

    def fwd() -> None:
        for p in params:
            p.grad = None
        state["outs"] = _NoOpExperts.apply(*params)

    rows = [host_samples_us(lambda: torch.empty((n, *shape), dtype=dtype, device=device).unbind(0), calls, sync=sync),
            host_samples_us(lambda: table_key(params), calls, sync=sync),
            host_samples_us(lambda: torch.autograd.backward(state.pop("outs"), grads), calls, before=fwd, sync=sync)]  # fmt: skip
    return [{"entry": e, "n": n, "bound_us": None, **_stats(r)} for e, r in zip(FLOOR_ENTRIES, rows)]


def host_distribution(calls: int, counts=EXPERT_COUNTS, shape: tuple[int, int] = SHAPES["super_fc1"]) -> list[dict]:
    """Host time per call over ``calls`` calls each, for the public entry points and the module."""
    from . import api
    from .module import QuantGroupedLinear

    rows = []
    for n in counts:
        ws, amax = make_experts(n, shape, seed=7)
        grads = [torch.randn_like(w) for w in ws]
        stacked, gstacked = torch.stack(ws), torch.stack(grads)
        first = len(rows)
        layer = QuantGroupedLinear(n, shape[1], shape[0], "fp8_e4m3", device="cuda", ste_mode="clipped")
        with torch.no_grad():
            for q, a in zip(layer.weight_quantizer, amax):
                q._amax.fill_(float(a))
        slayer = QuantGroupedLinear(n, shape[1], shape[0], "fp8_e4m3", device="cuda", ste_mode="clipped", stacked=True)
        slayer.load_state_dict(layer.state_dict())
        splits = [4] * n
        x = torch.randn(4 * n, shape[1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        gy = torch.randn(4 * n, shape[0], device="cuda", dtype=torch.bfloat16)
        state: dict = {}

        def module_fwd():
            state["wq"] = layer.quantized_weights()

        def module_bwd():
            if "wq" not in state:
                module_fwd()
            torch.autograd.backward(state.pop("wq"), grads)

        def layer_step():
            x.grad = None
            for w in layer.weights():
                w.grad = None
            layer(x, splits).backward(gy)

        def stacked_fwd():
            state["swq"] = slayer.quantized_weight()

        def stacked_bwd():
            if "swq" not in state:
                stacked_fwd()
            torch.autograd.backward(state.pop("swq"), gstacked)

        entries = {
            "fake_quant_experts (checked)": lambda: api.fake_quant_experts(ws, amax, "fp8_e4m3"),
            "fake_quant_experts (unchecked)": lambda: api.fake_quant_experts(ws, amax, "fp8_e4m3", check_values=False),
            "ste_backward_experts (clipped)": lambda: api.ste_backward_experts(ws, amax, grads, "clipped"),
            "QuantGroupedLinear fq forward": module_fwd,
            "fake_quant stacked [N, out, in] (checked)": lambda: api.fake_quant(stacked, amax, "fp8_e4m3"),
            "ste_backward stacked [N, out, in] (clipped)": lambda: api.ste_backward(stacked, amax, gstacked, "clipped"),
        }
        for what, fn in entries.items():
            rows.append({"entry": what, "n": n, "bound_us": host_bound_us(n), **_stats(host_samples_us(fn, calls))})
        def fresh_forward() -> None:  # the backward needs a fresh forward each time (untimed)
            module_fwd()
            for w in layer.weights():
                w.grad = None  # AccumulateGrad then keeps the gradient (no per-expert add kernels)

        samples = host_samples_us(module_bwd, calls, before=fresh_forward)
        rows.append({"entry": "QuantGroupedLinear fq backward", "n": n, "bound_us": host_bound_us(n), **_stats(samples)})
        rows.append({"entry": "QuantGroupedLinear(stacked=True) fq forward", "n": n, "bound_us": host_bound_us(n),
                     **_stats(host_samples_us(stacked_fwd, calls))})

        def fresh_stacked_forward() -> None:
            stacked_fwd()
            slayer.weight.grad = None

        samples = host_samples_us(stacked_bwd, calls, before=fresh_stacked_forward)
        rows.append({"entry": "QuantGroupedLinear(stacked=True) fq backward", "n": n, "bound_us": host_bound_us(n), **_stats(samples)})
        rows.append({"entry": "QuantGroupedLinear layer fwd+bwd (incl. N GEMMs)", "n": n, "bound_us": None,
                     **_stats(host_samples_us(layer_step, max(50, calls // 10)))})  # fmt: skip
        rows += host_floor_rows(layer.weights(), grads, calls, torch.cuda.synchronize)
        for r in rows[first:]:
            r["within_bound"] = None if r["bound_us"] is None else r["median"] <= r["bound_us"]
            print(f"  host {r['entry']:52s} N={n:3d}  median {r['median']:7.1f} us  p90 {r['p90']:7.1f}  p99 {r['p99']:7.1f}"
                  f"  bound {r['bound_us'] or float('nan'):6.1f}", flush=True)  # fmt: skip
        floor = {r["entry"]: r["median"] for r in rows[-len(FLOOR_ENTRIES):]}
        print(f"  host N={n:3d}: floor of a list-out call (views + key) {floor[FLOOR_ENTRIES[0]] + floor[FLOOR_ENTRIES[1]]:7.1f} us"
              f" vs bound {host_bound_us(n):6.1f} us", flush=True)  # fmt: skip
        del ws, grads, layer, slayer, stacked, gstacked
        torch.cuda.empty_cache()
    from . import checks

    checks.raise_pending_errors()
    return rows


def profile_formats(copy_gbps: float, n: int = 256, shape: tuple[int, int] = (512, 2048)) -> dict:
    """Per format: the arithmetic ceiling, i.e. the kernel's throughput with (almost) no HBM traffic:
    ``n`` experts that are all the same 2 MB tensor, every output written to one 2 MB buffer (the
    table's output offsets zeroed), so loads and stores stay in L2 while the programs, tiles and
    instructions are those of an ``n`` x ``shape`` launch (1 GB of nominal traffic); the same for a
    plain Triton copy with that tiling.  Reported as nominal GB/s and as % of the measured HBM copy
    bandwidth: a format whose ceiling is below 100% cannot reach copy bandwidth on this GPU (and on
    a GPU with the same SMs and faster HBM, it reaches at most ceiling/copy there).  Also registers,
    spills, warps and PTX instruction counts of the production-case launch."""
    from . import launch, tables
    from .copy_kernel import tiled_copy_kernel
    from .geometry import grid_for
    from .launch import FWD_CONFIG, tile_for

    out: dict = {}
    w = make_experts(1, shape, seed=3)[0][0]
    ws = [w] * n
    amax = torch.full((n,), float(w.float().abs().amax()), device="cuda")
    table = tables.expert_table(ws)
    table.meta[1].zero_()  # every expert writes the same buffer
    flat = torch.empty(shape[0] * shape[1], dtype=torch.bfloat16, device="cuda")
    nominal = 4 * n * shape[0] * shape[1]
    from .amax import amax_for_list

    for fmt in FORMATS:
        spec = parse_spec(fmt, None, {})
        view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=fmt == "nvfp4")
        ms = _graph_ms([lambda s=spec, v=view: launch.fwd_list(table, ws, flat, v, s, check=False)])
        out[fmt] = {"ceiling_gbps": nominal / ms / 1e6, "ceiling_pct_of_hbm_copy": _pct(nominal, ms, copy_gbps)}
    tile = tile_for(table.shapes, FWD_CONFIG[parse_spec("fp8_e4m3", None, {}).code], w.device)
    grid = grid_for(table.shapes, tile)
    xi, fi = w.view(torch.int16), flat.view(torch.int16)
    ms = _graph_ms([lambda: tiled_copy_kernel[grid](xi, fi, table.meta, n, VEC=table.xvec, BR=tile.br, BC=tile.bc, TPP=tile.tpp,
                                                    num_warps=tile.num_warps)])  # fmt: skip
    out["triton_copy"] = {"ceiling_gbps": nominal / ms / 1e6, "ceiling_pct_of_hbm_copy": _pct(nominal, ms, copy_gbps)}
    _, n, shape = PRODUCTION
    prod = KernelRunner([make_experts(n, shape, seed=0)])
    for fmt in FORMATS:
        k = prod.fwd(fmt)[0]()
        torch.cuda.synchronize()
        try:
            ptx = k.asm.get("ptx", "")
            instr = [ln for ln in ptx.splitlines() if ln.strip().endswith(";") and not ln.strip().startswith((".", "//"))]
            regs, warps = int(k.n_regs), int(k.metadata.num_warps)
            blocks = min(32, 65536 // max(1, regs * 32 * warps))  # register-limited blocks per SM
            out[fmt].update(n_regs=regs, n_spills=int(k.n_spills), num_warps=warps, ptx_instructions=len(instr),
                            ptx_lines_fma_mul_add=sum(1 for ln in instr if any(t in ln for t in ("fma.", "mul.", "add.", "sub."))),
                            theoretical_warps_per_sm=min(64, blocks * warps))  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (compiled-kernel attributes differ across Triton versions)
            out[fmt]["compiled_facts_error"] = f"{type(exc).__name__}: {exc}"
    return out


def main(argv: list[str] | None = None) -> int:
    from moe_fq_parity.reports.schema import dumps  # strict JSON: non-finite floats as strings

    ap = argparse.ArgumentParser(description="grouped fake-quant kernel benchmark (one GPU)")
    ap.add_argument("--out", type=Path, required=True, help="directory for bench.json")
    ap.add_argument("--quick", action="store_true", help="Ultra fc1 at N in {4, 32, 128} plus the production case")
    ap.add_argument("--sweep", action="store_true", help="also sweep tile configurations at the production case")
    ap.add_argument("--sweep-kinds", default="", help="comma-separated kernels to sweep (int8, fp8_e4m3, nvfp4, bwd_clipped; default all)")
    ap.add_argument("--no-cases", action="store_true", help="skip the case table")
    ap.add_argument("--host-calls", type=int, default=1000, help="calls per entry of the host-cost distribution (0: skip)")
    ap.add_argument("--host-after", type=int, default=len(FIRST), help="measure the host distribution after this many cases")
    ap.add_argument("--host-counts", default=",".join(map(str, EXPERT_COUNTS)), help="expert counts of the host distribution")
    ap.add_argument("--max-cases", type=int, default=0, help="stop after this many cases (0: all; the acceptance cases come first)")
    ap.add_argument("--host-reps", type=int, default=30, help="calls per host-time median in the case table")
    ap.add_argument("--profile", action="store_true", help="L2-resident ceilings and compiled-kernel facts per format")
    ap.add_argument("--eager-max-gb", type=float, default=1.2, help="skip the eager baselines above this many bytes moved")
    ap.add_argument("--eager-formats", default="fp8_e4m3", help="comma-separated formats timed through the eager loop")
    args = ap.parse_args(argv)
    args.eager_formats = tuple(f for f in args.eager_formats.split(",") if f)
    if not torch.cuda.is_available():
        raise SystemExit("moe_fq_parity.kernels.bench needs a CUDA device")
    import triton

    t0 = time.time()
    curve = copy_curve(torch.device("cuda"))  # the perf check's yardsticks: one truth for both
    copy_gbps = curve_gbps(curve)
    print(f"{torch.cuda.get_device_name(0)}  torch {torch.__version__}  triton {triton.__version__}  copy {copy_gbps:.0f} GB/s", flush=True)
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                    "copy_gbps": copy_gbps, "copy_curve": [list(p) for p in curve], "command": "python -m moe_fq_parity.kernels.bench " + " ".join(argv or [])}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    save = lambda: (args.out / "bench.json").write_text(dumps(report))  # noqa: E731
    configs = None  # the table times the defaults of kernels/launch.py (what the public call uses)
    if args.sweep:
        report["sweep"], best = sweep(copy_gbps, args.sweep_kinds)
        report["sweep_best"] = {k: asdict(v) for k, v in best.items()}
        save()
    if args.profile:
        try:
            report["profile"] = profile_formats(copy_gbps)
        except Exception as exc:  # noqa: BLE001  (a profile failure must not lose the table)
            report["profile"] = {"error": f"{type(exc).__name__}: {exc}"}
        print("profile:", json.dumps(report["profile"]), flush=True)
        save()
    results = []
    print(TABLE_NOTE)
    print(TABLE_HEAD, flush=True)
    for i, (name, n, shape) in enumerate([] if args.no_cases else _cases(args.quick)):
        if i == args.host_after and args.host_calls:
            report["host"] = host_distribution(args.host_calls, tuple(int(c) for c in args.host_counts.split(",")))
            save()
        if args.max_cases and i >= args.max_cases:
            break
        results.append(bench_case(name, n, shape, copy_gbps, args, configs, curve))
        print(table_row(results[-1]) + f"  ({time.time() - t0:.0f}s)", flush=True)
        report["cases"] = [asdict(r) for r in results]
        save()  # partial results survive a timeout
        torch.cuda.empty_cache()
    if args.host_calls and "host" not in report:
        report["host"] = host_distribution(args.host_calls, tuple(int(c) for c in args.host_counts.split(",")))
        save()
    report["seconds"] = time.time() - t0
    save()
    print_table(results, copy_gbps)
    for r in report.get("host", []):
        print(f"host {r['entry']:52s} N={r['n']:3d}  median {r['median']:7.1f}  p90 {r['p90']:7.1f}  p99 {r['p99']:7.1f} us"
              f"  bound {r['bound_us'] or float('nan'):6.1f}  {'ok' if r['within_bound'] else ('-' if r['within_bound'] is None else 'OVER')}")  # fmt: skip
    print(f"total {report['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
