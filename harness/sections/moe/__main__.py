"""``python -m moe_fq_parity.harness.sections.moe --suite S --seed N --device D [--filter SUBSTR]``: run the MoE section.

Prints one line per row (verdict, id, measured) and the detail of failing rows; exits 1 when
any row fails.  ``--filter`` keeps rows whose id contains the substring (the repro of a row).
"""

from __future__ import annotations

import argparse
import sys

from moe_fq_parity.cases import SUITE_NAMES
from moe_fq_parity.harness.sections.cli_args import device

from .section import run


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m moe_fq_parity.harness.sections.moe", description=__doc__)
    p.add_argument("--suite", choices=SUITE_NAMES, default="smoke")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", type=device, default="cpu", help="cpu, cuda or cuda:N (default cpu)")
    p.add_argument("--filter", default="", help="only rows whose id contains this substring")
    args = p.parse_args(argv)
    section = run(args.suite, args.seed, args.device)
    rows = [r for r in section.rows if args.filter in r.id]
    for r in rows:
        print(f"{r.verdict:4}  {r.id}  {r.fields.get('measured', '')}")
        if r.verdict == "fail":
            print(f"      {r.message}")
    counts = {v: sum(r.verdict == v for r in rows) for v in ("pass", "fail", "skip")}
    print(f"{len(rows)} rows: {counts}")
    return 1 if counts["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
