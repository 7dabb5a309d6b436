"""``python -m moe_fq_parity.harness.sections.checkpoint``: run (part of) the distributed checkpoint matrix and print verdicts.

Example: ``python -m moe_fq_parity.harness.sections.checkpoint --save tp2ep2 --load tp1ep4,tp1ep8 --seed 1234`` saves under
TP=2/EP=2, loads under EP=4 and EP=8, and prints one line per row; ``--json FILE`` writes the
rows; exit status 1 when any row fails.
"""

from __future__ import annotations

import argparse
import sys
import tempfile

from moe_fq_parity.reports.schema import dumps

from moe_fq_parity.harness.sections.cli_args import cuda_state, gpu_count, json_path

from .layout import matrix_layouts, parse_layout
from .engines import ENGINES
from .matrix import DistPlan, run_plan


def _layouts(text: str) -> tuple:
    """Comma-separated layout ids (argparse type: a usage error, exit 2, for a bad or empty list)."""
    try:
        found = tuple(parse_layout(t.strip()) for t in text.split(",") if t.strip())
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not found:
        raise argparse.ArgumentTypeError(f"no layout in {text!r}; expected ids like tp1ep2,tp2ep4")
    return found


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m moe_fq_parity.harness.sections.checkpoint", description=__doc__.splitlines()[0])
    ap.add_argument("--save", type=_layouts, default=None, help="comma-separated save layouts, e.g. tp1ep2,tp2ep4 (default: all up to --max-world)")
    ap.add_argument("--load", type=_layouts, default=None, help="comma-separated load layouts (default: all up to --max-world)")
    ap.add_argument("--max-world", type=int, default=8, help="largest world size of the default layouts (default 8)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--engine", choices=("dcp", "megatron"), default="dcp")
    ap.add_argument("--json", type=json_path, default=None, help="write the rows as JSON to this file")
    args = ap.parse_args(argv)
    try:  # every argument is checked before any rank starts
        every = tuple(matrix_layouts(args.max_world)) if args.save is None or args.load is None else ()
        plan = DistPlan(args.seed, args.save or every, args.load or every, device=args.device, engine=args.engine)
        plan.validate()
    except ValueError as exc:
        ap.error(f"{exc}" if "max_world" not in str(exc) else f"--max-world: {exc}")
    if args.device == "cuda":  # one GPU per rank (NCCL): the largest layout decides
        widest = max(plan.save_layouts + plan.load_layouts, key=lambda lay: lay.world)
        if widest.world > gpu_count():
            ap.error(f"--device cuda: layout {widest.id} needs {widest.world} GPUs, one per rank ({cuda_state()}); "
                     f"use --device cpu (gloo) or layouts of at most {gpu_count()} ranks")
    ok, why = ENGINES[args.engine].available(args.device)
    if not ok:
        print(f"error: engine {args.engine} is unavailable here: {why}", file=sys.stderr)
        return 2
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
