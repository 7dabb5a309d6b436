"""Reports of the sizes a person reads, built without running a case: for the browser tests.

``sized_report("nightly")`` is a ``triton`` nightly report: a record for every check of every
nightly case the kernel declares (its default variants; the others counted as not applicable, as a
run counts them), the skips a run gives (no amax to change for the block-scaled formats, ragged
experts for the layout invariant), timings, the four report sections (``SECTION_ROWS``) with their
columns and their longest values as a run writes them (``SECTIONS``; the columns are the section
modules' ``COLUMNS``, ``test_html_layout`` checks), and ``failing`` failing cases with offender
tables.  ``sized_report("smoke")`` is the default ``moe-fq-parity run`` on the three built-ins.
Every record is a ``CheckRecord`` (its ``to_json``), and the report passes ``reports.schema.validate``.  Deterministic: the values derive from ``seed``.

Cost on the 2-core machine: the nightly report (7,288 records) about 1.5 s, the smoke one 0.3 s;
rendering them (``render_html``: the pictures) 3-5 s and 1.5-3 s.
"""

from __future__ import annotations

import ast
import random
from pathlib import Path
from typing import Any

from moe_fq_parity.cases import suite
from moe_fq_parity.harness.core.records import CheckRecord, ExpertStats, Offender, Perf
from moe_fq_parity.harness.core.repro import repro_command
from moe_fq_parity.reference.formats import format_spec
from moe_fq_parity.reports.schema import SCHEMA_VERSION, hist_labels, validate

REPO = Path(__file__).resolve().parents[2]
CHECKS = ("forward", "backward.pass_through", "backward.clipped", "invariant.layout", "invariant.grouped", "invariant.recalibrate")
SECTION_ROWS = {"nightly": {"moe": 1041, "dist": 797, "selftest": 34, "external": 37}, "smoke": {"moe": 465, "dist": 414, "selftest": 34, "external": 37}}
"""Rows per section: a smoke run's (``moe-fq-parity run --suite smoke``, CPU, every extra installed);
the nightly's ``moe`` and ``dist`` from docs/measured.md."""
SECTION_FILES = {"moe": "harness/sections/moe/section.py", "dist": "harness/sections/checkpoint/section.py",
                 "external": "harness/sections/external/section.py"}
SECTIONS: dict[str, tuple[str, str, dict[str, str]]] = {
    # name: (title, row id, {column: value}) as a smoke run writes its longest rows; {k} is the row's number
    "moe": ("MoE calibration semantics: grouped vs sequential experts",
            "twin/int8/per_channel/N4/64x32/grouped_linear/input/fc2/equivalence/sequential_per_expert~sequential_synced/all_routed/s{k}",
            {"backend": "twin", "spec": "int8/per_channel", "shape": "N4/32x64", "role": "grouped_linear/weight/fc1",
             "check": "state_dict/early_return/target_present",
             "expected": "converted x4, grouped shapes {{'weight': (4, 32, 64), 'bias': (4, 32)}}, bits equal",
             "measured": "['converted', 'converted', 'converted', 'converted'], {{'weight': (4, 32, 64), 'bias': (4, 32)}}, equal", "mismatches": "{k}"}),
    "dist": ("Distributed checkpoints: save and load under other TP/EP layouts",
             "megatron/negative/no_ep_sync/tp1ep2/nvfp4/static_shared_experts/{k}",
             {"save": "tp1ep2", "load": "tp2ep1", "qlayout": "static_shared_experts", "format": "nvfp4/per_expert", "engine": "megatron",
              "tensors": "{k}", "mismatches": "0"}),
    "selftest": ("Self-test: mutants every check must catch", "mutant/stale-amax-cache-{k}",
                 {"bug": "scale computed as reciprocal(amax) * qmax (two roundings)", "killed_by": "forward",
                  "case": "int8.cuda/per_expert/list/N4/8x40/ties@design/s0", "cases_tried": "{k}", "seconds": "0.26"}),
    "external": ("External implementations vs reference variants", "external/torchao-rceil/mxfp8/variants/{k}",
                 {"backend": "modelopt-eager", "format": "int8", "options": "default", "version": "0.47.0", "expected": "eager", "matched": "eager",
                  "mismatches": "cuda=104963; eager=0; reciprocal=15629; step=124122", "tie_flips": "cuda=4; reciprocal=0 (+30 near); step=22 (+26 near)",
                  "per_case": "all_bf16: eager; near_tie/per_tensor: cuda, eager; near_tie/per_channel: cuda, eager; fp32: cuda, eager; calibrated: eager",
                  "elements": "1202688", "near_ties": "{k}"}),
}
NOTES = {"moe": "seed 1234; grouped layer: twin only (device cpu is not CUDA). Experts that receive no calibration tokens keep input amax +0 "
                "(max over the empty set); fake quant then applies the format's zero-amax rule.",
         "dist": "gloo ranks per layout; layouts tp1ep1, tp1ep2, tp2ep1; model E8/h48/f64; seed 1234; engines dcp, megatron (megatron-core 0.16.1)",
         "selftest": "suite smoke, seed 1234; a mutant passes this table when some check kills it on a generated case",
         "external": "nvidia-modelopt 0.47.0; transformer_engine not importable; torchao 0.18.0; torch 2.13.0+cpu"}


def section_columns(name: str) -> list[str]:
    """``COLUMNS`` of a section's module, read from its source (its import costs seconds)."""
    tree = ast.parse((REPO / SECTION_FILES[name]).read_text())
    value = next(n.value for n in tree.body if isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "COLUMNS" for t in n.targets))
    return list(ast.literal_eval(value))


def _failing(case: Any, backend: str, check: str, rng: random.Random) -> CheckRecord:
    numel, bad = case.numel, rng.randint(3, 60)
    offenders = tuple(Offender(expert=1, row=k // 5, col=7 * k % case.shape[1], input=0.103515625 + k / 512, expected=0.1015625 + k / 512,
                               got=0.10546875 + k / 512, pre_round=26.5 + k, ulp=None, cls="tie_flip") for k in range(10))
    per = case.numel // case.n
    experts = tuple(ExpertStats(expert=e, numel=per, max_ulp=0, counts={"exact": per - (bad if e == 1 else 0), "ulp1": 0,
                                "tie_flip": bad if e == 1 else 0, "error": 0}, amax=0.875 + e / 8) for e in range(case.n))
    return CheckRecord(case_id=case.id, backend=backend, check=check, verdict="fail", fmt=case.fmt, n=case.n, numel=numel,
                       message=f"{bad} of {numel} elements differ in experts [1]: {bad} are tie flips (a value on a rounding tie, "
                               "rounded the other way: one grid step)",
                       counts={"exact": numel - bad, "ulp1": 0, "tie_flip": bad, "error": 0}, per_expert=experts, offenders=offenders,
                       histogram=(numel - bad,) + (0,) * (len(hist_labels()) - 1), repro=repro_command(case.id, backend, check, 1234),
                       duration_s=0.01, case_bytes=4 * numel)


def _record(case: Any, backend: str, check: str, rng: random.Random) -> CheckRecord:
    base = dict(case_id=case.id, backend=backend, check=check, fmt=case.fmt, n=case.n, numel=case.numel, duration_s=0.01,
                case_bytes=4 * case.numel, repro=repro_command(case.id, backend, check, 1234))
    if check == "invariant.recalibrate" and not format_spec(case.fmt).takes_amax:
        return CheckRecord(verdict="skip", message=f"{case.fmt} takes no amax (its scales come from the data): there is no amax to change", **base)
    if check == "invariant.layout" and case.layout == "list" and rng.random() < 0.1:
        return CheckRecord(verdict="skip", message="layout invariant needs experts of one shape", **base)
    if check == "perf":
        timing = Perf(time_us=rng.uniform(10, 900), gbps=rng.uniform(50, 3000), pct_of_copy=rng.uniform(40, 99),
                      timer="cuda_events; fake_quant_stacked (public default call)", samples_us=(100.0,), bytes_moved=8 * case.numel)
        return CheckRecord(verdict="pass", perf=timing, **base)
    hist = (case.numel,) + (0,) * (len(hist_labels()) - 1) if check == "forward" else ()
    return CheckRecord(verdict="pass", counts={"exact": case.numel, "ulp1": 0, "tie_flip": 0, "error": 0}, histogram=hist, **base)


def _sections(size: str, rng: random.Random, failing: int) -> list[dict[str, Any]]:
    out = []
    for name, rows in SECTION_ROWS[size].items():
        title, row_id, fields = SECTIONS[name]
        made = []
        for k in range(rows):
            verdict = "fail" if k < min(failing, 1) and name == "external" else ("skip" if k % 9 == 4 else "pass")
            made.append({"id": row_id.format(k=k), "verdict": verdict, "fields": {c: v.format(k=k) for c, v in fields.items()},
                         "message": ("device cpu is not CUDA: the section needs a GPU" if verdict == "skip" else
                                     "bits differ from the expected variant in 3 of 4,096 elements" if verdict == "fail" else ""),
                         **({"repro": f"python -m moe_fq_parity.harness.sections.{name} --row {k}"} if verdict == "fail" else {})})
        out.append({"name": name, "title": title, "verdict": "fail" if any(r["verdict"] == "fail" for r in made) else "pass",
                    "columns": list(fields), "notes": NOTES[name], "rows": made, "seconds": rng.uniform(1, 60)})
    if size == "nightly":  # the atlas as the nightly writes it: real rows of two formats (the whole atlas costs half a minute)
        from moe_fq_parity.harness.sections import Section, atlas

        rows = atlas._rows("fp8_block", {}, 0) + atlas._rows("nvfp4", {}, 0)
        out.append(dict(Section(atlas.NAME, atlas.TITLE, atlas.COLUMNS, rows, "the atlas of fp8_block 1x128 and nvfp4 1x16").to_json(),
                        seconds=rng.uniform(20, 40)))
    return out


def sized_report(size: str, *, failing: int = 0, seed: int = 0) -> dict[str, Any]:
    """A schema-valid report of suite ``size`` (``nightly``: the ``triton`` backend with timings;
    ``smoke``: the three built-ins) with ``failing`` failing cases (module docstring)."""
    rng = random.Random(seed)
    cases = suite(size)
    backends = ("triton",) if size == "nightly" else ("reference", "triton", "eager-loop")
    records, na = [], {}
    fail_ids = {c.id for c in rng.sample([c for c in cases if c.variant == format_spec(c.fmt).default_variant], failing)}
    for case in cases:
        for backend in backends:
            if backend == "triton" and case.variant != format_spec(case.fmt).default_variant:
                why = f"triton implements the {case.fmt} variants ['{format_spec(case.fmt).default_variant}'], not {case.variant!r}"
                entry = na.setdefault(backend, {"records": 0, "cases": 0, "reasons": {}})
                entry["records"], entry["cases"] = entry["records"] + 4, entry["cases"] + 1
                entry["reasons"][why] = entry["reasons"].get(why, 0) + 1
                checks = CHECKS[1:3]  # the straight-through backward takes no variant: it still runs
            else:
                checks = CHECKS + (("perf",) if size == "nightly" else ())
            for check in checks:
                if case.id in fail_ids and backend == backends[0] and check in ("forward", "invariant.grouped"):
                    records.append(_failing(case, backend, check, rng).to_json())
                else:
                    records.append(_record(case, backend, check, rng).to_json())
    meta = {"git_commit": "0123456789abcdef0123456789abcdef01234567", "git_dirty": False, "python": "3.11.7", "platform": "Linux-x86_64",
            "torch": "2.13.0", "triton": "3.6.0", "device": "NVIDIA H200" if size == "nightly" else "cpu (x86_64, 2 threads)",
            "copy_gbps": 4229.0 if size == "nightly" else None, "suite": size, "formats": sorted({c.fmt for c in cases}),
            "checks": list(CHECKS) + (["perf"] if size == "nightly" else []), "mode": "strict", "seed": 1234, "timeout_s": 120.0,
            "source": "cli", "cases_planned": len(cases), "started": "2026-12-01T02:00:00+00:00", "finished": "2026-12-01T02:04:38+00:00",
            "argv": ["moe-fq-parity", "run", "--suite", size, "--out", "/srv/nightly/parity-report"],
            "backends": [{"spec": b, "name": b, "available": True, "reason": "", "device": "cuda" if size == "nightly" else "cpu",
                          "formats": sorted({c.fmt for c in cases})} for b in backends]
            + [{"spec": "te", "name": "te", "available": False, "reason": "Transformer Engine needs a CUDA GPU (and cuDNN); none here",
                "device": "", "formats": []}]}
    report = {"schema_version": SCHEMA_VERSION, "complete": True, "error": None, "meta": meta, "records": records,
              "sections": _sections(size, rng, failing), "baseline": None,
              "not_applicable": {b: {"records": v["records"], "cases": v["cases"],
                                     "reasons": [{"reason": r, "records": 4 * n, "cases": n} for r, n in sorted(v["reasons"].items())]}
                                 for b, v in na.items()}}
    # the schema over every record costs seconds at this size: every record comes from the same few
    # lines, so a stride through them (the failing ones included) stands for all of them
    stride = max(1, len(records) // 400)
    validate(dict(report, records=records[::stride] + [r for r in records if r["verdict"] == "fail"]))
    return report
