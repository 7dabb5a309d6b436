"""``python -m moe_fq_parity.harness.sections.dist``: run (part of) the distributed checkpoint matrix and print verdicts.

Example: ``python -m moe_fq_parity.harness.sections.dist --save tp2ep2 --load tp1ep4,tp1ep8 --seed 1234`` saves under
TP=2/EP=2, loads under EP=4 and EP=8, and prints one line per row; ``--json FILE`` writes the
rows; exit status 1 when any row fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from moe_fq_parity.reports.schema import dumps

from .layout import matrix_layouts, parse_layout
from .matrix import DistPlan, run_plan


def _layouts(text: str) -> tuple:
    return tuple(parse_layout(t.strip()) for t in text.split(",") if t.strip())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_fq_parity.harness.sections.dist", description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=_layouts, default=None, help="comma-separated save layouts, e.g. tp1ep2,tp2ep4 (default: all up to --max-world)")
    ap.add_argument("--load", type=_layouts, default=None, help="comma-separated load layouts (default: all up to --max-world)")
    ap.add_argument("--max-world", type=int, default=8, help="largest world size of the default layouts (default 8)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--engine", choices=("dcp", "megatron"), default="dcp")
    ap.add_argument("--json", default=None, help="write the rows as JSON to this file")
    args = ap.parse_args(argv)
    every = tuple(matrix_layouts(args.max_world))
    plan = DistPlan(args.seed, args.save or every, args.load or every, device=args.device, engine=args.engine)
    with tempfile.TemporaryDirectory(prefix="parity-dist-") as workdir:
        verdicts = run_plan(plan, workdir)
    for v in verdicts:
        print(f"{v.verdict:4}  {v.id}" + (f"  {v.message[:200]}" if v.verdict != "pass" else ""))
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps([v.to_json() for v in verdicts]))
    return 1 if any(v.failed for v in verdicts) else 0


if __name__ == "__main__":
    sys.exit(main())
