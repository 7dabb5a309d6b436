"""Is the reference bit-identical on CPU and on another device?  ``python -m moe_fq_parity.harness.run.device_parity``.

Runs every format and variant over every bf16 bit pattern (for a sweep of amax values, per tensor)
and over seeded random stacked weights (per expert and per channel, fp16/fp32 too) on the CPU and on
``--device``, and compares output bits and pre-rounding values.  Prints a table; ``--json`` writes it.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

import torch

from moe_fq_parity.reference.api import fake_quant_traced, variants
from moe_fq_parity.reference.formats import FORMATS, format_spec
from moe_fq_parity.reports.schema import dumps  # strict JSON (non-finite floats as strings)

AMAX_SWEEP = (1.0, 0.75, 3.1415927, 448.0, 1e-3, 2.0**-20, 6.1e-5, 1e4, 0.7, 1.3, 123.0, 2.0**-25, 0.0)


def _inputs(seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    allbits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)
    finite = torch.where(torch.isfinite(allbits), allbits, torch.zeros((), dtype=torch.bfloat16))
    out: list[tuple[str, torch.Tensor, torch.Tensor]] = []
    for a in AMAX_SWEEP:
        out.append((f"all_bf16/amax={a!r}", allbits, torch.tensor(a)))
        out.append((f"finite_bf16/amax={a!r}", finite, torch.tensor(a)))
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        w = (torch.randn(8, 64, 200, generator=g) * torch.logspace(-6, 2, 8).reshape(8, 1, 1)).to(dtype)
        amax = w.float().abs().amax(dim=(1, 2)) * torch.linspace(0.5, 1.0, 8)
        out.append((f"stacked_per_expert/{str(dtype)[6:]}", w, amax))
        out.append((f"stacked_per_channel/{str(dtype)[6:]}", w, w.float().abs().amax(dim=-1) * 0.9))
    return out


def compare_devices(device: str, seed: int = 0) -> list[dict[str, Any]]:
    """One row per (format, variant): inputs compared, differing output bits, differing pre-round values."""
    rows = []
    cases = _inputs(seed)
    for fmt in FORMATS:
        spec = format_spec(fmt)
        for var in variants(fmt):
            n_cmp = n_out = n_pre = 0
            first = ""
            flags = [o for o in spec.options_for(var) if o.type is bool]
            for name, x, amax in cases:
                if (spec.rejects_nan_for(var) and torch.isnan(x).any()) or ("per_channel" in name and "per_channel" not in spec.amax_granularities):
                    continue
                if not spec.takes_amax:  # scales from the data: one row per input, no amax
                    if "amax=" in name and not name.endswith(f"amax={AMAX_SWEEP[0]!r}"):
                        continue
                    amax = None
                opts = [{}]
                if flags and "all_bf16" not in name:
                    opts += [{o.name: True} for o in flags if not o.nonnegative_input]
                    if name.startswith("finite") or name.startswith("stacked"):
                        x = x.abs()  # unsigned takes non-negative input (-0.0 included)
                        opts += [{o.name: True} for o in flags if o.nonnegative_input]
                a = [fake_quant_traced(x, amax, fmt, var, **o) for o in opts]
                b = [fake_quant_traced(x.to(device), None if amax is None else amax.to(device), fmt, var, **o) for o in opts]
                bits = torch.int16 if x.dtype != torch.float32 else torch.int32
                d_out = sum(int((ra.out.view(bits) != rb.out.cpu().view(bits)).sum()) for ra, rb in zip(a, b))
                d_pre = sum(int(((ra.pre_round.view(torch.int32) != rb.pre_round.cpu().view(torch.int32))
                                 & ~(torch.isnan(ra.pre_round) & torch.isnan(rb.pre_round.cpu()))).sum()) for ra, rb in zip(a, b))
                n_cmp += x.numel() * len(opts)
                n_out += d_out
                n_pre += d_pre
                if (d_out or d_pre) and not first:
                    first = name
            rows.append({"format": fmt, "variant": var, "elements": n_cmp, "output_bits_differ": n_out, "pre_round_differ": n_pre,
                         "first_failing_input": first})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device: nothing to compare", file=sys.stderr)
        return 2
    rows = compare_devices(args.device, args.seed)
    print(f"reference CPU vs {args.device} ({torch.cuda.get_device_name() if args.device.startswith('cuda') else args.device}), torch {torch.__version__}")
    print(f"{'format':10} {'variant':16} {'elements':>10} {'out differ':>10} {'pre differ':>10}  first failing input")
    for r in rows:
        print(f"{r['format']:10} {r['variant']:16} {r['elements']:>10} {r['output_bits_differ']:>10} {r['pre_round_differ']:>10}  {r['first_failing_input']}")
    if args.json:
        with open(args.json, "w") as f:
            f.write(dumps({"device": args.device, "torch": torch.__version__, "rows": rows}))
    return 0 if all(r["output_bits_differ"] == 0 and r["pre_round_differ"] == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
