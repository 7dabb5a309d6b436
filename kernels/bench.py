"""Benchmark: ``python -m moe_fq_parity.kernels.bench --out DIR [--quick] [--sweep]`` (needs a CUDA device).

In one run: device copy bandwidth; then per case (N experts of one Nemotron-3 routed-expert shape,
bf16, list layout) the kernel forward for every format and the clipped backward, the per-expert
eager loop and the stacked eager reference (``reference`` itself, the baselines); the upstream
Ultra production case N=32 x [5120, 8192]; peak extra GPU memory there.  Prints a table and writes
``DIR/bench.json``.

Numbers:
* ``bytes`` = inputs read once + outputs written once (forward 4 B/element for bf16; clipped
  backward 6 B/element: weight and gradient in, gradient out); ``GB/s = bytes / median time``;
  ``pct_copy`` = that over the measured device-to-device copy bandwidth (read + write).
* Kernel times: ``triton.testing.do_bench_cudagraph`` (median), launching through a prepared
  expert table and preallocated outputs, cycling over enough input copies to exceed 4x the L2
  cache (no L2 hits from the previous launch).  ``api_ms``: the public call
  ``kernels.fake_quant_experts(..., check_values=False)`` timed end to end with ``do_bench``
  (host overhead included).
* Eager baselines: median of 3 event-timed calls after a warm-up (each takes tens of ms);
  skipped (``null``) past ``--eager-max-gb``.
* Only cases whose kernel output matched the reference bit for bit (experts 0 and N-1) are timed.
* ``--sweep`` first times tile configurations at the production case and then uses the fastest
  per kernel for the table (recorded under ``configs_used``); without it, the defaults of
  ``kernels/launch.py``.
"""

from __future__ import annotations

import argparse
import itertools
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch

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
    """One case's numbers (ms, GB/s, % of copy bandwidth; ``None`` = not measured)."""

    case: str
    n: int
    shape: tuple[int, int]
    correct: dict[str, bool] = field(default_factory=dict)
    kernel_ms: dict[str, float] = field(default_factory=dict)
    gbps: dict[str, float] = field(default_factory=dict)
    pct_copy: dict[str, float] = field(default_factory=dict)
    api_ms: float | None = None
    eager_loop_ms: dict[str, float | None] = field(default_factory=dict)
    stacked_eager_ms: dict[str, float | None] = field(default_factory=dict)
    speedup_vs_loop: dict[str, float] = field(default_factory=dict)


def copy_bandwidth_gbps(gib: float = 2.0) -> float:
    """Device-to-device ``copy_`` of ``gib`` GiB, (read + write) bytes / median time."""
    from triton.testing import do_bench

    n = int(gib * 2**30) // 2
    src = torch.randn(n, device="cuda").to(torch.bfloat16)
    dst = torch.empty_like(src)
    ms = do_bench(lambda: dst.copy_(src), warmup=25, rep=200, return_mode="median")
    return 2 * src.numel() * src.element_size() / ms / 1e6


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
        from . import launch

        self.launch = launch
        self.sets = sets
        self.tables = [launch.expert_table(ws) for ws, _ in sets]
        self.outs = [launch.alloc_outputs(t, torch.bfloat16, ws[0].device) for t, (ws, _) in zip(self.tables, sets)]

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
        from .amax import amax_for_list

        fns = []
        for ws, amax in self.sets:
            table = self.launch.expert_table(ws, grads)
            flat, _ = self.launch.alloc_outputs(table, grads[0].dtype, grads[0].device)
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


def _api_ms(fn: Callable[[], object]) -> float:
    from triton.testing import do_bench

    return do_bench(fn, warmup=5, rep=30, return_mode="median")


def _kind(fmt: str) -> str:
    """The ``EAGER_FORMATS`` entry sharing ``fmt``'s kernel code (the key of the tuned configs)."""
    code = parse_spec(fmt, None, {}).code
    return next(f for f in EAGER_FORMATS if parse_spec(f, None, {}).code == code)


def bench_case(name: str, n: int, shape: tuple[int, int], copy_gbps: float, args, configs: dict | None = None) -> CaseResult:
    from moe_fq_parity import reference

    from . import api

    res = CaseResult(name, n, shape)
    numel = n * shape[0] * shape[1]
    fwd_bytes, bwd_bytes = 4 * numel, 6 * numel
    sets = [make_experts(n, shape, seed=k) for k in range(_copies(fwd_bytes))]
    runner = KernelRunner(sets)
    ws, amax = sets[0]
    configs = configs or {}
    for fmt in FORMATS:
        cfg = configs.get(_kind(fmt))
        runner.fwd(fmt, cfg)[0]()
        res.correct[fmt] = _matches_reference(fmt, ws, amax, runner.outs[0][1])
        if res.correct[fmt]:
            _record(res, fmt, _graph_ms(runner.fwd(fmt, cfg)), fwd_bytes, copy_gbps)
    grads = [torch.randn_like(w) for w in ws]
    bwd_fns = runner.bwd(grads, configs.get("bwd_clipped"))
    res.correct["bwd_clipped"] = _bwd_matches(ws, amax, grads)
    if res.correct["bwd_clipped"]:
        _record(res, "bwd_clipped", _graph_ms(bwd_fns), bwd_bytes, copy_gbps)
    res.api_ms = _api_ms(lambda: api.fake_quant_experts(ws, amax, "fp8_e4m3", check_values=False))
    del runner, sets, bwd_fns
    eager = fwd_bytes / 1e9 <= args.eager_max_gb
    for fmt in EAGER_FORMATS:
        res.eager_loop_ms[fmt] = _eager_ms(lambda f=fmt: reference.fake_quant_experts(ws, amax, f)) if eager else None
        if res.eager_loop_ms[fmt] and fmt in res.kernel_ms:
            res.speedup_vs_loop[fmt] = res.eager_loop_ms[fmt] / res.kernel_ms[fmt]
    res.eager_loop_ms["bwd_clipped"] = _eager_ms(lambda: reference.ste_backward_experts(ws, amax, grads, "clipped")) if eager else None
    if res.eager_loop_ms["bwd_clipped"] and "bwd_clipped" in res.kernel_ms:
        res.speedup_vs_loop["bwd_clipped"] = res.eager_loop_ms["bwd_clipped"] / res.kernel_ms["bwd_clipped"]
    if eager and fwd_bytes / 1e9 <= args.stacked_max_gb:
        x = torch.stack(ws)
        for fmt in EAGER_FORMATS:
            res.stacked_eager_ms[fmt] = _eager_ms(lambda f=fmt: reference.fake_quant(x, amax, f))
        del x
    return res


def _bwd_matches(ws, amax, grads) -> bool:
    from moe_fq_parity import reference

    from . import api

    got = api.ste_backward_experts(ws, amax, grads, "clipped")
    want = reference.ste_backward_experts(ws, amax, grads, "clipped")
    return all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want))


def _record(res: CaseResult, key: str, ms: float, nbytes: int, copy_gbps: float) -> None:
    res.kernel_ms[key] = ms
    res.gbps[key] = nbytes / ms / 1e6
    res.pct_copy[key] = 100.0 * res.gbps[key] / copy_gbps


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


SWEEP_TILES = ((4096, 4, 4), (4096, 4, 8), (2048, 4, 8), (8192, 8, 2))
"""(elements per tile, warps, tiles per program) tried per kernel at the production case."""


def sweep(copy_gbps: float) -> tuple[list[dict], dict[str, object]]:
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
    plan += [("int8", KernelConfig(8192, 8, tiles_per_program=4, scalar_int_div=False)),
             ("nvfp4", KernelConfig(4096, 8, tiles_per_program=4, nvfp4_int_recip=True))]  # fmt: skip
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


def _cases(quick: bool) -> list[tuple[str, int, tuple[int, int]]]:
    counts = (4, 32, 128) if quick else EXPERT_COUNTS
    shapes = {"ultra_fc1": SHAPES["ultra_fc1"]} if quick else SHAPES
    return [(f"{name}/N{n}", n, shape) for name, shape in shapes.items() for n in counts] + [
        (f"{PRODUCTION[0]}/N{PRODUCTION[1]}", PRODUCTION[1], PRODUCTION[2])
    ]


TABLE_HEAD = (f"{'case':22s} " + " ".join(f"{k:>9s}" for k in (*FORMATS, "bwd"))
              + f"   {'xloop(' + '/'.join((*EAGER_FORMATS, 'bwd')) + ')':>26s}   fp8_ms  api_ms  stacked_fp8_ms")


def table_row(r: CaseResult) -> str:
    pcts = " ".join(f"{r.pct_copy.get(k, float('nan')):8.1f}%" for k in (*FORMATS, "bwd_clipped"))
    sp = "/".join(f"{r.speedup_vs_loop[k]:.0f}" if k in r.speedup_vs_loop else "-" for k in (*EAGER_FORMATS, "bwd_clipped"))
    st = r.stacked_eager_ms.get("fp8_e4m3")
    fp8 = r.kernel_ms.get("fp8_e4m3", float("nan"))
    return f"{r.case:22s} {pcts}   {sp:>26s}   {fp8:6.3f}  {r.api_ms:6.3f}  {'-' if st is None else f'{st:.2f}'}"


def print_table(results: list[CaseResult], copy_gbps: float) -> None:
    print(f"\ncopy bandwidth {copy_gbps:.0f} GB/s (read + write); kernel % of it, speedup vs the per-expert eager loop")
    print(TABLE_HEAD)
    for r in results:
        print(table_row(r))


def main(argv: list[str] | None = None) -> int:
    from moe_fq_parity.reports.schema import dumps  # strict JSON: non-finite floats as strings

    ap = argparse.ArgumentParser(description="grouped fake-quant kernel benchmark (one GPU)")
    ap.add_argument("--out", type=Path, required=True, help="directory for bench.json")
    ap.add_argument("--quick", action="store_true", help="Ultra fc1 at N in {4, 32, 128} plus the production case")
    ap.add_argument("--sweep", action="store_true", help="also sweep tile configurations at the production case")
    ap.add_argument("--no-cases", action="store_true", help="skip the case table (copy bandwidth and sweep only)")
    ap.add_argument("--eager-max-gb", type=float, default=6.0, help="skip eager baselines above this many bytes moved")
    ap.add_argument("--stacked-max-gb", type=float, default=6.0, help="skip the stacked eager reference above this")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("moe_fq_parity.kernels.bench needs a CUDA device")
    import triton

    t0 = time.time()
    copy_gbps = copy_bandwidth_gbps()
    print(f"{torch.cuda.get_device_name(0)}  torch {torch.__version__}  triton {triton.__version__}  copy {copy_gbps:.0f} GB/s", flush=True)
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                    "copy_gbps": copy_gbps}  # fmt: skip
    configs = None
    if args.sweep:
        report["sweep"], configs = sweep(copy_gbps)
        report["configs_used"] = {k: asdict(v) for k, v in configs.items()}
    report["triton_copy_pct"] = triton_copy_pct(copy_gbps)
    print(f"plain Triton copy, same tiling, production case: {report['triton_copy_pct']:.1f}% of copy bandwidth", flush=True)
    results = []
    args.out.mkdir(parents=True, exist_ok=True)
    print(TABLE_HEAD, flush=True)
    for name, n, shape in [] if args.no_cases else _cases(args.quick):
        results.append(bench_case(name, n, shape, copy_gbps, args, configs))
        print(table_row(results[-1]) + f"  ({time.time() - t0:.0f}s)", flush=True)
        report["cases"] = [asdict(r) for r in results]
        (args.out / "bench.json").write_text(dumps(report))  # partial results survive a timeout
        torch.cuda.empty_cache()
    report["peak_memory_production"] = None if args.no_cases else peak_extra_memory(PRODUCTION[1], PRODUCTION[2])
    report["seconds"] = time.time() - t0
    (args.out / "bench.json").write_text(dumps(report))
    print_table(results, copy_gbps)
    print(f"peak extra memory at {PRODUCTION[0]}: {report['peak_memory_production']}  (outputs {PRODUCTION[1]}x{PRODUCTION[2]} bf16)")
    print(f"total {report['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
