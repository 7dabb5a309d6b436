"""Benchmark: ``python -m moe_fq_parity.benchmarks.bench --out DIR [--quick] [--sweep] [--host-calls K]`` (needs a CUDA device).

In one run: device copy bandwidth; then per case (N experts of one Nemotron-3 routed-expert shape,
bf16, list layout, N in {4, 8, 16, 32, 64, 128}, plus the Ultra production case N=32 x [5120, 8192])
for every format the kernel implements (its default variant; also with ``tile_2d`` and
``fp32_scale`` where a format takes them: ``benchmarks.cases.FORMATS``, keys as case ids write
them, e.g. ``fp8_block+2d``; the block-scaled formats take no amax) and the clipped backward:

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
  of that size can show under that timer, a guide rather than a bound (measured:
  ``docs/kernels_performance.md`` sections 6 and 9);
* ``host_us``: host time of one public default call (``perf_counter``, median of ``--host-reps``
  calls, each started on an idle device);
* ``speedup_vs_loop``: the per-expert eager loop (``reference.fake_quant_experts``, the baseline;
  median of 3 calls timed by ``harness.core.timing.time_call``) over the public default call; skipped past ``--eager-max-gb``.

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
``--sweep`` (``--sweep-kinds`` to choose columns) adds, per column and for the backward, every tile
configuration of ``profiling.SWEEP_CHANGES`` at the production case: the kernel alone, its L2
ceiling and whether its output is bit-exact (``sweep`` / ``sweep_best`` in ``bench.json``).
Prints tables and writes ``DIR/bench.json``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict
from pathlib import Path

import torch

from moe_fq_parity.harness.core.timing import copy_curve, curve_gbps
from moe_fq_parity.reports.schema import dumps  # strict JSON: non-finite floats as strings

from .cases import EXPERT_COUNTS, FIRST, case_list
from .host import host_distribution
from .measure import bench_case
from .profiling import profile_formats, sweep
from .table import TABLE_HEAD, TABLE_NOTE, print_table, table_row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="grouped fake-quant kernel benchmark (one GPU)")
    ap.add_argument("--out", type=Path, required=True, help="directory for bench.json")
    ap.add_argument("--quick", action="store_true", help="Ultra fc1 at N in {4, 32, 128} plus the production case")
    ap.add_argument("--sweep", action="store_true", help="also time tile configurations per column at the production case, with their L2 ceilings")
    ap.add_argument("--sweep-kinds", default="", help="comma-separated columns to sweep (the table's columns and bwd_clipped; default all)")
    ap.add_argument("--no-cases", action="store_true", help="skip the case table")
    ap.add_argument("--host-calls", type=int, default=1000, help="calls per entry of the host-cost distribution (0: skip)")
    ap.add_argument("--host-after", type=int, default=len(FIRST), help="measure the host distribution after this many cases")
    ap.add_argument("--host-counts", default=",".join(map(str, EXPERT_COUNTS)), help="expert counts of the host distribution")
    ap.add_argument("--max-cases", type=int, default=0, help="stop after this many cases (0: all; the acceptance cases come first)")
    ap.add_argument("--host-reps", type=int, default=30, help="calls per host-time median in the case table")
    ap.add_argument("--profile", action="store_true", help="L2-resident ceilings and compiled-kernel facts per format column")
    ap.add_argument("--eager-max-gb", type=float, default=1.2, help="skip the eager baselines above this many bytes moved")
    ap.add_argument("--eager-formats", default="fp8_e4m3", help="comma-separated formats timed through the eager loop")
    args = ap.parse_args(argv)
    args.eager_formats = tuple(f for f in args.eager_formats.split(",") if f)
    if not torch.cuda.is_available():
        raise SystemExit("moe_fq_parity.benchmarks.bench needs a CUDA device")
    import triton  # deferred: an optional extra (and a CUDA-less machine gets the message above)

    t0 = time.time()
    curve = copy_curve(torch.device("cuda"))  # the perf check's yardsticks: one truth for both
    copy_gbps = curve_gbps(curve)
    print(f"{torch.cuda.get_device_name(0)}  torch {torch.__version__}  triton {triton.__version__}  copy {copy_gbps:.0f} GB/s", flush=True)
    report: dict = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "triton": triton.__version__,
                    "copy_gbps": copy_gbps, "copy_curve": [list(p) for p in curve],
                    "command": "python -m moe_fq_parity.benchmarks.bench " + " ".join(argv or [])}  # fmt: skip
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
        if "error" in report["profile"]:
            print("profile failed:", report["profile"]["error"], flush=True)
        else:  # the ceilings print as the table's last row; bench.json holds the compiled-kernel facts too
            print("profile:", " ".join(f"{k} {v['ceiling_pct_of_hbm_copy']:.0f}%" for k, v in report["profile"].items()), flush=True)
        save()
    results = []
    if not args.no_cases:
        print(TABLE_NOTE)
        print(TABLE_HEAD, flush=True)
    for i, (name, n, shape) in enumerate([] if args.no_cases else case_list(args.quick)):
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
    if results or "profile" in report:
        print_table(results, copy_gbps, report.get("profile"))
    for r in report.get("host", []):
        print(f"host {r['entry']:52s} N={r['n']:3d}  median {r['median']:7.1f}  p90 {r['p90']:7.1f}  p99 {r['p99']:7.1f} us"
              f"  bound {r['bound_us'] or float('nan'):6.1f}  {'ok' if r['within_bound'] else ('-' if r['within_bound'] is None else 'OVER')}")  # fmt: skip
    print(f"total {report['seconds']:.0f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
