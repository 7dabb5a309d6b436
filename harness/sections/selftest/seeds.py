"""No false positives: correct backends must pass a suite under many seeds in a row.

``python -m moe_fq_parity.harness.sections.selftest.seeds --suite ci --backend triton,eager-loop --seeds 20 [--json PATH]``
runs every check of the suite once per seed (seed = base + k) and prints one line per seed; exit 0
only when no check failed under any seed.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Optional, Sequence

from moe_fq_parity.cases import DEFAULT_SEED, make_inputs, suite as suite_cases
from moe_fq_parity.harness.backends import BackendLoadError, load
from moe_fq_parity.harness.checks import DEFAULT_CHECKS, CheckContext, expected_forward, run_case_checks
from moe_fq_parity.harness.core.triton_env import prepare
from moe_fq_parity.harness.sections.cli_args import at_least, json_path, suite as suite_arg
from moe_fq_parity.reports.schema import dumps


def run_seeds(suite: str, specs: Sequence[str], seeds: Sequence[int]) -> list[dict]:
    """One row per seed: checks run, failures (with the first failure's repro)."""
    backends = [load(s) for s in specs]
    missing = [f"{b.spec}: {b.reason}" for b in backends if not b.available]
    if missing:
        raise RuntimeError("unavailable backends: " + "; ".join(missing))
    cases = suite_cases(suite)
    rows = []
    for seed in seeds:
        start, n, failures = time.perf_counter(), 0, []
        for case in cases:
            for b in backends:
                inputs = make_inputs(case, seed, b.device or "cpu")
                recs = run_case_checks(CheckContext(b, inputs, seed), DEFAULT_CHECKS, expected_forward(inputs))
                n += len(recs)
                failures += [r for r in recs if r.verdict == "fail"]
        rows.append({"seed": seed, "checks": n, "failures": len(failures), "seconds": round(time.perf_counter() - start, 2),
                     "first_failure": failures[0].repro if failures else ""})
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m moe_fq_parity.harness.sections.selftest.seeds", description=__doc__.splitlines()[0])
    p.add_argument("--suite", type=suite_arg, default="ci")
    p.add_argument("--backend", default="reference,eager-loop", help="comma-separated backend names or module:object specs")
    p.add_argument("--seeds", type=at_least(1), default=20)
    p.add_argument("--base-seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--json", type=json_path, default=None)
    args = p.parse_args(argv)
    prepare()
    specs = [s.strip() for s in args.backend.split(",") if s.strip()]
    if not specs:
        p.error(f"--backend: no backend in {args.backend!r}")
    try:
        backends = [load(s) for s in specs]
    except BackendLoadError as exc:
        p.error(f"--backend: {exc}")
    missing = [f"{b.spec}: {b.why_not}" for b in backends if not b.available]
    if missing:
        print("error: unavailable backends: " + "; ".join(missing), file=sys.stderr)
        return 2
    rows = run_seeds(args.suite, specs, [args.base_seed + k for k in range(args.seeds)])
    for r in rows:
        print(f"seed {r['seed']}: {r['checks']} checks, {r['failures']} failed, {r['seconds']} s {r['first_failure']}")
    bad = sum(r["failures"] for r in rows)
    print(f"{len(rows)} seeds x suite {args.suite} x {specs}: {sum(r['checks'] for r in rows)} checks, {bad} failed")
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps({"suite": args.suite, "backends": specs, "rows": rows}))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
