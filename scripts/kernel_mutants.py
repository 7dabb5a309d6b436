"""Kernel mutants: planted bugs in the Triton kernels' source, each run against a test command.

    python scripts/kernel_mutants.py [--only NAME[,NAME]] [--json FILE] [--timeout S] [-- PYTEST ARGS]

Each mutant replaces one line fragment of one file under ``kernels/`` (the fragment must occur
exactly once), runs ``python -m pytest PYTEST ARGS`` (default ``DEFAULT_ARGS``: the README's test
command's markers, ``-x``, on the test files that run the kernels), and puts the file back, also
when interrupted.  A mutant is *killed* when a test failed (its first ``FAILED`` line is recorded; with
``-x`` under xdist pytest exits 2, interrupted), *broke* when the command exits non-zero with no
failed test (a collection error, a crash: not a survivor, but no test's verdict), and *survived*
when it exits 0.  The exit status is 1 when
any mutant survived.

Killed by a subset of the README's test command means killed by the command: the tests are the
same, deterministic (every input derives from the printed seed) and ``-x`` only stops early.  Cost:
one pytest session per mutant; a killed mutant stops at its first failure (seconds to a minute on
2 cores), a survivor runs the whole command (about 3 minutes on 2 cores with the default args).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_ARGS = ("-n", "2", "-m", "not slow", "-x", "-q", "-p", "no:cacheprovider", "tests/kernels", "tests/harness/test_parity.py")


@dataclass(frozen=True)
class KernelMutant:
    name: str
    path: str
    old: str
    new: str
    what: str


MUTANTS: tuple[KernelMutant, ...] = (
    KernelMutant("int-ties-away", "kernels/tl_rounding.py", "return (tl.abs(w) + 12582912.0) - 12582912.0",
                 "return tl.floor(tl.abs(w) + 0.5)", "INT rint rounds half away from zero"),
    KernelMutant("int-qmax-plus-one", "kernels/fwd_kernel.py", "propagate_nan=tl.PropagateNan.ALL), QMAX, propagate_nan",
                 "propagate_nan=tl.PropagateNan.ALL), QMAX + 1, propagate_nan", "INT clamp one code above qmax"),
    KernelMutant("int-tiny-amax-kept", "kernels/fwd_kernel.py", "    zero = a < _TINY\n", "    zero = a < 0.0\n",
                 "INT amax below 2**-24 not written as +0"),
    KernelMutant("fp8-saturate-480", "kernels/tl_rounding.py", "return round_mag_e4m3(tl.minimum(c, 448.0))",
                 "return round_mag_e4m3(tl.minimum(c, 480.0))", "E4M3 saturates above 448 (software rounding)"),
    KernelMutant("fp8-zero-amax-scale", "kernels/fwd_kernel.py", "    a1 = tl.where(a <= _TINY, 1.0, a)\n", "    a1 = a\n",
                 "FP8 amax <= 2**-24 not replaced by 1"),
    KernelMutant("minifloat-grid-coarse", "kernels/tl_rounding.py", "big = (e + (SHIFT_BITS + 0x400000)).to(tl.float32, bitcast=True)",
                 "big = (e + (SHIFT_BITS + 0xC00000)).to(tl.float32, bitcast=True)", "E4M3/E2M1 rounding on a grid twice as coarse"),
    KernelMutant("e2m1-saturate-4", "kernels/fwd_kernel.py", "q = round_mag_e2m1(tl.minimum(v, 6.0))", "q = round_mag_e2m1(tl.minimum(v, 4.0))",
                 "NVFP4 element saturates at 4 instead of 6"),
    KernelMutant("nvfp4-block-scale-unrounded", "kernels/fwd_kernel.py", "ds8 = round_sat_e4m3(vmax * mult, HW_E4M3)",
                 "ds8 = tl.minimum(vmax * mult, 448.0)", "NVFP4 block scale not rounded to E4M3"),
    KernelMutant("nvfp4-dequant-order", "kernels/fwd_kernel.py", "return q * ((ds8 * g) * _INV_GSCALE), v == 0.0",
                 "return (q * ds8) * (g * _INV_GSCALE), v == 0.0", "NVFP4 dequantized in another op order"),
    KernelMutant("mx-code-plus-one", "kernels/fwd_kernel.py", "c = tl.maximum(e - EMAX, 0)", "c = tl.maximum(e - EMAX + 1, 0)",
                 "MX E8M0 scale code one too high"),
    KernelMutant("mx-code0-decode", "kernels/fwd_kernel.py", "dec = tl.where(c == 0, 0x00400000, c << 23)",
                 "dec = tl.where(c == 0, 0x00800000, c << 23)", "MX code 0 decoded as 2**-126"),
    KernelMutant("fp8-block-pow2-up", "kernels/fwd_kernel.py", "sb = s.to(tl.int32, bitcast=True) & 0x7F800000",
                 "sb = (s.to(tl.int32, bitcast=True) & 0x7F800000) + 0x00800000", "FP8 block-wise pow2 scale rounded up"),
    KernelMutant("bf16-truncate", "kernels/tl_rounding.py", "r = ((b + (0x7FFF + ((b >> 16) & 1))) >> 16).to(tl.int16) | sign",
                 "r = (b >> 16).to(tl.int16) | sign", "bf16 output truncated (software rounding)"),
    KernelMutant("nan-bits-dropped", "kernels/tl_rounding.py", "    return tl.where(is_nan, nan_bits, r)\n", "    return r\n",
                 "NaN outputs not written with the NaN pattern"),
    KernelMutant("per-channel-row-shift", "kernels/fwd_kernel.py",
                 "                            a = tl.load(amax_ptr + e * amax_se + r * amax_sr, mask=rmask, other=1.0)\n"
                 "                            s, s2, r2, zero = _int_scales(a, QMAX, INT_DIV)",
                 "                            a = tl.load(amax_ptr + e * amax_se + (r // 2) * amax_sr, mask=rmask, other=1.0)\n"
                 "                            s, s2, r2, zero = _int_scales(a, QMAX, INT_DIV)", "INT per-channel amax of another row"),
    KernelMutant("tile-row-mask", "kernels/tiles.py", "    rmask = (r0 + rl) < rows\n", "    rmask = (r0 + rl) <= rows\n",
                 "a tile's row mask one row too long"),
    KernelMutant("unsigned-negative-kept", "kernels/fwd_kernel.py", "                                out = tl.where(x < 0.0, nan_all, out)\n",
                 "", "INT unsigned: a negative input not written as NaN"),
    KernelMutant("narrow-range-ignored", "kernels/formats.py", 'narrow_range=bool(options.get("narrow_range", False))',
                 "narrow_range=False", "INT narrow_range ignored (-128 kept)"),
    KernelMutant("clipped-lt", "kernels/bwd_kernel.py", "tl.where(tl.abs(x) <= a, g, tl.zeros_like(g))",
                 "tl.where(tl.abs(x) < a, g, tl.zeros_like(g))", "clipped backward zeroes |x| == amax"),
)


def _first_failed(out: str) -> str:
    m = re.search(r"^FAILED (\S+)", out, re.M)
    return m.group(1) if m else ""


def run_mutant(m: KernelMutant, args: tuple[str, ...], timeout_s: float) -> dict:
    """Apply ``m``, run pytest, restore; the outcome as a dict."""
    path = ROOT / m.path
    source = path.read_text()
    if source.count(m.old) != 1:
        raise SystemExit(f"mutant {m.name}: its fragment occurs {source.count(m.old)} times in {m.path} (needs exactly 1)")
    start = time.perf_counter()
    try:
        path.write_text(source.replace(m.old, m.new))
        try:
            proc = subprocess.run([sys.executable, "-m", "pytest", *args], cwd=ROOT, capture_output=True, text=True, timeout=timeout_s)
            rc, out = proc.returncode, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            rc, out = -1, f"timed out after {timeout_s} s\n{exc.stdout or ''}"
    finally:
        path.write_text(source)
    by = _first_failed(out)
    outcome = "survived" if rc == 0 else ("killed" if by else "broke")
    return asdict(m) | {"outcome": outcome, "rc": rc, "by": by, "seconds": round(time.perf_counter() - start, 1),
                        "tail": "" if outcome == "killed" else out[-1500:]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    pytest_args = tuple(argv[argv.index("--") + 1:]) if "--" in argv else DEFAULT_ARGS
    own = argv[:argv.index("--")] if "--" in argv else argv
    ap = argparse.ArgumentParser(description="planted bugs in the Triton kernels, each run against a pytest command")
    ap.add_argument("--only", default="", help="comma-separated mutant names (default: all)")
    ap.add_argument("--json", type=Path, help="write the outcomes here")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per mutant's pytest session")
    args = ap.parse_args(own)
    names = [n for n in args.only.split(",") if n]
    unknown = sorted(set(names) - {m.name for m in MUTANTS})
    if unknown:
        ap.error(f"unknown mutants {unknown}; known: {', '.join(m.name for m in MUTANTS)}")
    chosen = [m for m in MUTANTS if not names or m.name in names]
    print(f"{len(chosen)} kernel mutants against: python -m pytest {' '.join(pytest_args)}", flush=True)
    results = []
    for m in chosen:
        r = run_mutant(m, pytest_args, args.timeout)
        results.append(r)
        print(f"{r['outcome']:8s} {m.name:30s} {r['seconds']:6.1f} s  {r['by'] or r['tail'][-300:].strip()}", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"pytest_args": list(pytest_args), "mutants": results}, indent=1))
    survived = [r["name"] for r in results if r["outcome"] == "survived"]
    print(f"{sum(r['outcome'] == 'killed' for r in results)} killed, {len(survived)} survived, "
          f"{sum(r['outcome'] == 'broke' for r in results)} broke the run" + (f": survivors {survived}" if survived else ""))
    return 1 if survived else 0


if __name__ == "__main__":
    sys.exit(main())
