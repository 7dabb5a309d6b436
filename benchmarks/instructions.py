"""Instruction profile of the forward kernel without a GPU: every bench column (``cases.FORMATS``)
compiled for a CUDA target as the production stacked launch at the Ultra case compiles it (tile,
warps, tiles per program, 16-byte aligned pointers and row lengths), then its PTX and SASS counted.

    python -m moe_fq_parity.benchmarks.instructions [--columns int8,fp8_e4m3] [--arch 90] [--json OUT]

Needs Triton's NVIDIA back end (its bundled ``ptxas`` and ``cuobjdump``); no GPU, no CUDA driver.
The counts are static (a rarely taken branch counts as much as the hot loop) and per program; "per
element" divides by the elements a thread handles.  The compiled launch assumes what a GPU of
compute capability 8.0 or later has: an exact fused multiply-add and the hardware bf16 conversion,
and from 8.9 on the hardware E4M3 conversion (``kernels/env.py`` checks each on the device itself).  The L2-resident ceilings, which these
counts explain, are measured on the GPU by ``bench --profile``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Optional, Sequence

import torch

from moe_fq_parity.kernels import launch
from moe_fq_parity.kernels.formats import parse_spec

from .cases import FORMATS, PRODUCTION, BenchFormat

_POINTERS = ("x_ptr", "y_ptr", "meta_ptr", "amax_ptr", "flag_ptr")
_SASS_LINE = re.compile(r"^\s+/\*[0-9a-f]{4}\*/\s+(?:@!?U?P[T0-9]+\s+)?([A-Z0-9_.]+)")


_BLOCKED = re.compile(r"^#(blocked\d*) = #ttg\.blocked<\{(.*)\}>")
_INPUT_LOAD = re.compile(r"(?:tt\.load|ttg\.async_copy_global_to_local) .*: tensor<([0-9x]+)x!tt\.ptr<i(?:16|32)>, #(blocked\d*)>")


def input_layout(ttgir: str) -> dict:
    """The layout Triton gave the tile of input bits (the first 16-bit tensor load, or 32-bit: bf16
    pairs, ``launch.block_layout``'s ``PAIRS``; tile shapes then count words; a pipelined loop's
    load is its copy to shared memory, ``launch.KernelConfig.pipeline_stages``): its shape and
    ``sizePerThread``, ``threadsPerWarp``, ``warpsPerCTA`` per axis, read from the compiled TTGIR."""
    layouts = {}
    for line in ttgir.splitlines():
        m = _BLOCKED.match(line)
        if m:
            layouts[m.group(1)] = {k.strip(): [int(v) for v in re.findall(r"\d+", val)] for k, val in
                                   (f.split("=") for f in re.split(r",\s*(?=[a-zA-Z])", m.group(2)))}  # fmt: skip
    for line in ttgir.splitlines():
        m = _INPUT_LOAD.search(line)
        if m:
            return {"shape": [int(v) for v in m.group(1).split("x")], **layouts[m.group(2)]}
    return {}


def _ops(lines: Sequence[str]) -> Counter:
    return Counter(ln.split()[0] for ln in lines)


def compile_column(bf: BenchFormat, arch: int = 90, check: bool = False) -> dict:
    """PTX and SASS counts of ``bf``'s forward kernel at the Ultra production case (bf16, amax per expert)."""
    import triton  # deferred: the triton extra
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from moe_fq_parity.kernels.fwd_kernel import fake_quant_fwd_kernel as kernel

    _, n, shape = PRODUCTION
    spec = parse_spec(bf.fmt, None, bf.options)
    _, kw, used = launch.stacked_fwd_plan([shape] * n, torch.bfloat16, torch.device("cpu"), spec, False, check, launch.fwd_config(spec),
                                          facts=(True, True, arch >= 89))  # a GPU's (see the module docstring)
    kw.update(amax_se=1, amax_sr=0)  # one amax per expert
    warps = kw.pop("num_warps")
    kw.pop("enable_fp_fusion")
    options = dict(num_warps=warps, enable_fp_fusion=False, **({"maxnreg": kw.pop("maxnreg")} if "maxnreg" in kw else {}))
    sig = {"x_ptr": "*i16", "y_ptr": "*i16", "meta_ptr": "*i64", "amax_ptr": "*fp32", "flag_ptr": "*i32", "n_experts": "i32",
           "rows_u": "i32", "cols_u": "i32"}
    sig |= {k: "constexpr" for k in kw}
    attrs = {(kernel.arg_names.index(a),): [["tt.divisibility", 16]] for a in (*_POINTERS, "rows_u", "cols_u")}
    compiled = triton.compile(ASTSource(kernel, {a: sig[a] for a in kernel.arg_names}, kw, attrs), target=GPUTarget("cuda", arch, 32),
                              options=options)
    ptx = [ln.strip() for ln in compiled.asm["ptx"].splitlines()]
    ptx = [ln for ln in ptx if ln.endswith(";") and not ln.startswith((".", "//", "{", "}"))]
    ptx = [re.sub(r"^@!?%p\d+\s+", "", ln) for ln in ptx]
    with tempfile.TemporaryDirectory() as tmp:
        cubin = Path(tmp) / "k.cubin"
        cubin.write_bytes(compiled.asm["cubin"])
        tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
        dump = subprocess.run([str(tool), "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
        usage = subprocess.run([str(tool), "-res-usage", str(cubin)], capture_output=True, text=True, check=True).stdout
    sass = [m.group(1) for m in map(_SASS_LINE.match, dump.splitlines()) if m]
    regs = re.search(r"\bREG:(\d+)", usage)
    per_thread = kw["BR"] * kw["BC"] * kw["TPP"] / (warps * 32)
    return {"column": bf.key, "check": check, "arch": arch, "tile": [kw["BR"], kw["BC"]], "tiles_per_program": kw["TPP"], "warps": warps,
            "shape_tiled": list(used[0]), "elements_per_thread": per_thread, "ptx": len(ptx), "sass": len(sass),
            "sass_per_element": round(len(sass) / per_thread, 2), "registers": int(regs.group(1)) if regs else None,
            "ptx_top": _ops(ptx).most_common(12), "sass_top": Counter(sass).most_common(16), "split": kw.get("SPLIT", 1),
            "pairs": kw.get("PAIRS", False), "ties_low": kw.get("TIES_LOW", False), "input_layout": input_layout(compiled.asm["ttgir"])}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m moe_fq_parity.benchmarks.instructions", description=__doc__.split("\n\n")[0])
    p.add_argument("--columns", default="", help=f"comma-separated bench columns (default all: {','.join(b.key for b in FORMATS)})")
    p.add_argument("--arch", type=int, default=90, help="compute capability x 10 to compile for (default 90: Hopper)")
    p.add_argument("--check", action="store_true", help="the checked launch (default: checks off, as the ceilings are measured)")
    p.add_argument("--json", type=Path, default=None, help="write the rows here")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("error: TRITON_INTERPRET=1 makes the kernels interpreted functions, which do not compile; unset it", file=sys.stderr)
        return 2
    wanted = [c for c in args.columns.split(",") if c]
    unknown = sorted(set(wanted) - {b.key for b in FORMATS})
    if unknown:
        print(f"error: --columns: unknown {unknown}; known: {', '.join(b.key for b in FORMATS)}", file=sys.stderr)
        return 2
    rows = []
    print(f"{'column':16s} {'tile':>9s} {'warps':>5s} {'elem/thr':>8s} {'regs':>4s} {'PTX':>5s} {'SASS':>5s} {'SASS/elem':>9s}")
    for bf in FORMATS:
        if wanted and bf.key not in wanted:
            continue
        r = compile_column(bf, args.arch, args.check)
        rows.append(r)
        print(f"{bf.key:16s} {r['tile'][0]:>4d}x{r['tile'][1]:<4d} {r['warps']:>5d} {r['elements_per_thread']:>8.0f} {r['registers'] or 0:>4d} "
              f"{r['ptx']:>5d} {r['sass']:>5d} "
              f"{r['sass_per_element']:>9.2f}", flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
