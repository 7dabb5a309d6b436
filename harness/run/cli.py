"""Command line: ``moe-fq-parity run | compare | list | selftest`` (also ``python -m moe_fq_parity.harness``).

* ``run``: run a suite (default ``smoke``) on backends (default: every built-in that is available
  here), write ``OUT/report.json`` and ``OUT/report.html`` (default ``./parity-report``); exit 0 only
  when every check passed (1 on failures, 130 on Ctrl-C).  Exit 2 on a usage error, before any work
  and in one line naming the bad value: a value of ``--formats``, ``--backend``, ``--checks``,
  ``--case``, ``--cases``, ``--sections`` that is none or selects no case, a backend named with
  ``--backend`` that cannot run here, an ``--out`` whose report would replace the ``--baseline``.
* ``run --shard i/n``: run a deterministic 1/n of the selected cases, balanced by bytes
  (``harness.run.shard``); ``merge R1 R2 ... --out DIR`` joins the shards' report.json files into one
  report.json + report.html equal to an unsharded run's (``reports.merge``; exit 2 when they are not
  the shards of one run).
* ``compare OLD NEW [--subset]``: print regressions, improvements and changes (``harness.run.diff``);
  exit 1 on any regression, 2 when a file is not a report this version reads (``reports.schema.load``).
  A failing ``run`` prints its first failing records with offenders and repro (``core.failure_text``).
* ``list``: suites and their cases, and the backends with their availability.
* ``selftest``: run the built-in mutants (deliberately broken backends) through a suite; exit 0 only
  when every mutant is killed by some check and the unmutated backends pass.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from moe_fq_parity.cases import DEFAULT_SEED, SUITE_NAMES, marks, parse_case, select, suite
from moe_fq_parity.reference.formats import FORMATS, describe
from moe_fq_parity.reports.merge import MergeError, merge_reports
from moe_fq_parity.reports.schema import dumps, load, overall_verdict, validate
from moe_fq_parity.reports.writer import write_report

from moe_fq_parity.harness.backends import BUILTINS, NAMES, BackendLoadError, load_all
from moe_fq_parity.harness.checks import DEFAULT_CHECKS
from moe_fq_parity.harness.core.processes import sharing_cpus
from moe_fq_parity.harness.core.records import CHECKS
from moe_fq_parity.harness.core.tolerances import (CALL_TIMEOUT_S, DEFAULT_NAN_BITS, NAN_BITS_MODES, RUN_GPU_SHARE_MIB, RUN_WORKERS_MAX,
                                                     SLOWDOWN_THRESHOLD,
                                                     VERDICT_MODES)
from moe_fq_parity.harness.core.triton_env import prepare
from moe_fq_parity.harness.sections.selftest.report import print_outcome, to_json
from moe_fq_parity.harness.sections.selftest.runner import run_selftest

from .diff import diff_reports, format_diff
from .runner import OutDirBusy, RunConfig, out_lock, run, validate_config
from .shard import Shard, parse_shard, select_shard


class _Parser(argparse.ArgumentParser):
    """``argparse`` whose usage errors are one line naming the bad value (and, for a choice, the
    valid ones), exit 2, instead of the usage text followed by the error."""

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _csv(text: str) -> list[str]:
    """A comma-separated list: ``argparse.ArgumentTypeError`` on an empty item (``""``, ``"a,"``,
    ``"a,,b"``), which would otherwise widen the selection to every value or drop a value unseen."""
    items = [t.strip() for t in text.split(",")]
    if not all(items):
        raise argparse.ArgumentTypeError(f"an empty name in {text!r}: name each value (`moe-fq-parity list` shows them)")
    return items


def _finite_nonnegative(what: str, hint: str) -> Callable[[str], float]:
    """An argparse type: a finite number >= 0 (``what`` and ``hint`` word its errors: a usage error, exit 2)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what} as a number, got {text!r}") from None
        if not (0 <= value < float("inf")):
            raise argparse.ArgumentTypeError(f"expected {what} >= 0 ({hint}), got {text!r}")
        return value

    return parse


_seconds = _finite_nonnegative("seconds", "0: no limit")


def _workers(text: str) -> Optional[int]:
    """``--workers``: ``auto`` (``None``) or a count >= 1."""
    if text == "auto":
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count >= 1 or 'auto', got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a count >= 1 or 'auto', got {text!r}")
    return value
_fraction = _finite_nonnegative("a finite fraction", "0.1 = 10%")


def _parser() -> argparse.ArgumentParser:
    p = _Parser(prog="moe-fq-parity", description="Numerical parity harness for MoE per-expert fake quantization.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="run a suite and write report.json + report.html")
    r.add_argument("--suite", default="smoke", choices=SUITE_NAMES, help="case suite (default: smoke)")
    r.add_argument("--backend", action="extend", type=_csv, default=[], metavar="B",
                   help=f"{' | '.join(NAMES)} | package.module:object (repeatable or comma-separated; default: all built-ins available here)")
    r.add_argument("--formats", action="extend", type=_csv, default=[],
                   help=f"comma-separated formats to keep ({','.join(FORMATS)}; repeatable)")
    r.add_argument("--cases", action="append", default=[], metavar="GLOB", help="keep cases whose id matches this glob (repeatable)")
    r.add_argument("--case", action="append", default=[], metavar="ID",
                   help="run exactly this case id (parsed, need not be in a suite; repeatable); such a run has no report sections")
    r.add_argument("--checks", action="extend", type=_csv, default=None, help=f"comma-separated subset of {','.join(CHECKS)} (repeatable)")
    r.add_argument("--mode", default="strict", choices=VERDICT_MODES, help="forward verdict: strict (0 ULP) or 1-ulp (upstream)")
    r.add_argument("--nan-bits", default=DEFAULT_NAN_BITS, choices=NAN_BITS_MODES,
                   help="NaN payload and sign: 'any' (default) does not compare them; 'strict' demands the reference's NaN bits, "
                        "counting other NaN bits as their own class (nan_bits)")
    r.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"global seed (default {DEFAULT_SEED}); case seed = seed + crc32(case id)")
    r.add_argument("--baseline", type=Path, default=None, help="earlier report.json to diff against (regressions fail the run)")
    r.add_argument("--baseline-subset", action="store_true",
                   help="this run is a deliberate subset (--cases/--formats): compare only its cases with the baseline, counting the "
                        "others in a warning (default: the baseline's other cases are missing records, regressions)")
    r.add_argument("--timeout", type=_seconds, default=CALL_TIMEOUT_S, help=f"per backend call timeout in seconds (default {CALL_TIMEOUT_S:g}; 0: none)")
    perf = r.add_mutually_exclusive_group()
    perf.add_argument("--perf", dest="perf", action="store_true", default=None, help="record timings (default: on with CUDA)")
    perf.add_argument("--no-perf", dest="perf", action="store_false")
    sec = r.add_mutually_exclusive_group()
    sec.add_argument("--sections", action="extend", type=_csv, default=None, help="comma-separated report sections (default: all; repeatable)")
    sec.add_argument("--no-sections", action="store_true", help="run no extra report sections")
    r.add_argument("--out", type=Path, default=Path("parity-report"), help="output directory (default ./parity-report)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar")
    r.add_argument("--in-process", action="store_true",
                   help="run the cases in this process (debugging); default: a supervised worker process that a crashing or hanging backend cannot take down")
    r.add_argument("--workers", type=_workers, default=None, metavar="K",
                   help=f"case worker processes (default auto, at most {RUN_WORKERS_MAX}: on a CUDA device one per 4 CPUs, cases "
                        f"up to {RUN_GPU_SHARE_MIB} MiB sharing the GPU, large cases and timings holding it alone; on a CPU one per CPU, 1 with --perf)")
    r.add_argument("--shard", default=None, metavar="I/N",
                   help="run shard I of N: a deterministic 1/N of the selected cases, balanced by bytes (join the reports with 'merge')")
    r.add_argument("--share-cpus", type=int, default=None, metavar="K",
                   help="harness processes sharing this host's CPUs (PyTorch threads capped at CPUs/K; default: N of --shard, "
                        "as shards usually share a multi-GPU host; 1 for shards on machines of their own)")
    mg = sub.add_parser("merge", help="merge the report.json files of a sharded run into one report.json + report.html")
    mg.add_argument("reports", type=Path, nargs="+", metavar="REPORT", help="report.json of every shard (run --shard i/n)")
    mg.add_argument("--out", type=Path, required=True, help="output directory of the merged report")
    c = sub.add_parser("compare", help="diff two report.json files; exit 1 on regression")
    c.add_argument("old", type=Path)
    c.add_argument("new", type=Path)
    c.add_argument("--threshold", type=_fraction, default=SLOWDOWN_THRESHOLD,
                   help=f"slowdown counted as regression, a finite fraction >= 0 (default {SLOWDOWN_THRESHOLD})")
    c.add_argument("--subset", action="store_true",
                   help="NEW is a deliberate subset (run --cases/--formats): compare only its cases, counting the others in a warning "
                        "(default: the baseline's other cases are missing records, regressions)")
    st = sub.add_parser("selftest", help="prove every check fires: run the mutant backends; exit 1 if one survives")
    st.add_argument("--suite", default="ci", help="cases to hunt the mutants with: smoke (the fastest), ci (default) or nightly")
    st.add_argument("--mutant", action="append", default=None, metavar="NAME", help="only this mutant (repeatable)")
    st.add_argument("--case", action="append", default=[], metavar="ID", help="only this case id (repeatable)")
    st.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ctl = st.add_mutually_exclusive_group()
    ctl.add_argument("--backend", action="extend", type=_csv, default=None, metavar="B",
                     help=f"unmutated control backend to run through the same cases ({' | '.join(NAMES)} | package.module:object; "
                          "repeatable or comma-separated; default: reference and eager-loop for ci, triton for nightly)")
    ctl.add_argument("--no-controls", action="store_true", help="skip the unmutated backends")
    st.add_argument("--json", type=Path, default=None, help="write the outcome as JSON here")
    ls = sub.add_parser("list", help="list suites, cases and backends")
    ls.add_argument("--suite", choices=SUITE_NAMES, default=None, help="list the cases of this suite only")
    ls.add_argument("--cases", action="append", default=[], metavar="GLOB")
    return p


def _select_cases(args) -> tuple:
    """The cases of ``--suite`` (or the ``--case`` ids) kept by ``--cases`` and ``--formats``.

    ``ValueError`` naming the value, in one line, for a format that is none, and for any value that
    selects nothing: a glob no case id matches, a format no selected case has, a ``--case`` id the
    filters leave out.  So a typo in a list fails the run instead of narrowing it unseen."""
    unknown = [f for f in args.formats if f not in FORMATS]
    if unknown:
        raise ValueError(f"--formats: unknown formats {unknown}; known: {', '.join(FORMATS)}")
    if args.case:
        try:
            base = tuple(parse_case(cid) for cid in args.case)
        except ValueError as exc:
            raise ValueError(f"--case: {exc}") from None
        where = "the --case ids"
    else:
        base = suite(args.suite)
        where = f"suite {args.suite} ({len(base)} cases; `moe-fq-parity list --suite {args.suite}` lists them)"
    globs = " ".join(repr(g) for g in args.cases)
    for pat in args.cases:
        if not select(base, patterns=[pat]):  # the catalogue's glob rule
            raise ValueError(f"--cases {pat!r}: matches no case id of {where}")
    for fmt in dict.fromkeys(args.formats):
        if not select(base, formats=[fmt]):
            raise ValueError(f"--formats {fmt}: no case of {where} has this format")
    selection = select(base, patterns=args.cases, formats=args.formats)
    for fmt in dict.fromkeys(args.formats):
        if not select(selection, formats=[fmt]):
            raise ValueError(f"--formats {fmt}: no case of this format matches --cases {globs} in {where}")
    for pat in args.cases:
        if not select(selection, patterns=[pat]):
            raise ValueError(f"--cases {pat!r}: matches only cases outside --formats {','.join(args.formats)} in {where}")
    kept = {c.id for c in selection}
    for cid, case in zip(args.case, base):
        if case.id not in kept:
            raise ValueError(f"--case {cid}: left out by" + (f" --formats {','.join(args.formats)}" if args.formats else "")
                             + (f" --cases {globs}" if args.cases else ""))
    return selection


REPORT_FILES = ("report.json", "report.html")
"""What a run or a merge writes into its ``--out`` folder (``reports.writer.ReportWriter``)."""


def overwritten_input(out: Path, inputs: Sequence[Path]) -> Optional[Path]:
    """The first of ``inputs`` (a ``--baseline``, the reports to merge) that writing the report into
    ``out`` would replace, or ``None``.  Paths are compared resolved, symlinks followed (a link to
    the baseline, an ``--out`` that is a link to the baseline's folder), and as files when both exist."""
    targets = [out / name for name in REPORT_FILES]
    for path in inputs:
        for target in targets:
            if target.resolve() == path.resolve() or (target.exists() and path.exists() and os.path.samefile(target, path)):
                return path
    return None


def unwritable(out: Path) -> Optional[str]:
    """Why ``out`` cannot take the report (checked before any case runs), or ``None``."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=out, prefix=".write-probe-"):
            pass
    except OSError as exc:
        return f"{type(exc).__name__}: {exc.strerror or exc}"
    return None


class _RunArgs(NamedTuple):
    sections: Optional[tuple[str, ...]]
    specs: list[str]
    backends: tuple
    shard: Optional[Shard]
    selection: tuple
    cases: tuple
    share: int
    baseline: Optional[dict]


def _checked_run_args(args) -> _RunArgs:
    """``run``'s arguments checked and resolved, cheapest first; ``ValueError`` (one line) otherwise.
    A backend named with ``--backend`` that cannot run here is refused now, before any case or
    section runs (as the pytest plugin refuses it)."""
    sections = () if args.no_sections else (tuple(args.sections) if args.sections is not None else None)
    if args.case:
        if sections:
            raise ValueError("--sections run with a suite (their rows are per suite); --case runs the named cases only: "
                             "drop --sections, or use --suite")
        sections = ()  # the report sections belong to suites: a run of named cases has none
    if args.baseline_subset and args.baseline is None:
        raise ValueError("--baseline-subset compares with a baseline: give --baseline too")
    if args.baseline is not None and overwritten_input(args.out, [args.baseline]) is not None:
        raise ValueError(f"--out {args.out} would overwrite the --baseline file {args.baseline} with the new report: "
                         "choose another --out, or copy the baseline elsewhere first")
    if args.share_cpus is not None and args.share_cpus < 1:
        raise ValueError(f"--share-cpus {args.share_cpus}: expected a count >= 1")
    validate_config(tuple(args.checks or ()), sections, args.timeout, args.nan_bits, args.mode)
    shard = parse_shard(args.shard) if args.shard is not None else None
    selection = _select_cases(args)
    if shard is not None and shard.count > len(selection):
        raise ValueError(f"--shard {shard}: {len(selection)} cases are selected, so at most {len(selection)} shards "
                         "(every shard needs a case, and merge needs every shard)")
    cases = select_shard(selection, shard) if shard is not None else selection
    if not cases:
        raise ValueError(f"shard {shard} of the {len(selection)} selected cases is empty (use fewer shards)")
    baseline = load(args.baseline) if args.baseline is not None else None
    specs = list(dict.fromkeys(args.backend))
    try:
        backends = tuple(load_all(specs or None))
    except BackendLoadError as exc:
        raise ValueError(str(exc)) from None
    unavailable = [b for b in backends if not b.available] if specs else []
    if unavailable:
        raise ValueError("; ".join(f"--backend {b.spec}: unavailable here: {b.why_not}" for b in unavailable))
    share = args.share_cpus if args.share_cpus is not None else (shard.count if shard is not None else 1)
    return _RunArgs(sections, specs, backends, shard, selection, cases, share, baseline)


def _cmd_run(args) -> int:
    """``run``: every argument is checked before any work (a usage error, exit 2, names the bad value
    in one line and writes nothing: a typo never touches an earlier report), then the run."""
    try:
        sections, specs, backends, shard, selection, cases, share, baseline = _checked_run_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if (problem := unwritable(args.out)) is not None:
        print(f"error: cannot write the report to {args.out}: {problem}", file=sys.stderr)
        return 2
    cfg = RunConfig(
        suite=args.suite if not args.case else "custom", cases=cases, backends=backends,
        checks=tuple(args.checks) if args.checks else DEFAULT_CHECKS, out_dir=args.out, seed=args.seed, mode=args.mode,
        timeout_s=args.timeout or None, perf=torch.cuda.is_available() if args.perf is None else args.perf,
        sections=sections,
        baseline=baseline, baseline_path=str(args.baseline or ""), baseline_subset=args.baseline_subset, progress=not args.no_progress,
        explicit_backends=bool(specs), argv=tuple(sys.argv), shard=shard, selection=selection if shard is not None else (),
        nan_bits=args.nan_bits, isolate=not args.in_process, workers=args.workers,
    )
    try:
        with sharing_cpus(share):
            return run(cfg)
    except ValueError as exc:  # unknown checks / sections
        print(f"error: {exc}", file=sys.stderr)
        return 2


def _cmd_compare(args) -> int:
    try:
        old, new = load(args.old), load(args.new)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    diff = diff_reports(old, new, slowdown=args.threshold, subset=args.subset)
    print(format_diff(diff))
    return 1 if diff.regressions else 0


def _cmd_merge(args) -> int:
    if (lost := overwritten_input(args.out, args.reports)) is not None:
        print(f"error: --out {args.out} would overwrite the shard report {lost} with the merged one: choose another --out", file=sys.stderr)
        return 2
    if (problem := unwritable(args.out)) is not None:
        print(f"error: cannot write the merged report to {args.out}: {problem}", file=sys.stderr)
        return 2
    try:
        merged = merge_reports([(str(p), load(p)) for p in args.reports])
    except (MergeError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    validate(merged)
    try:
        with out_lock(args.out):  # the run lock of --out: never two writers of one report
            json_path, html_path = write_report(args.out, merged)
    except OutDirBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    counts = {v: sum(r["verdict"] == v for r in merged["records"]) for v in ("pass", "fail", "skip")}
    print(f"merged {len(args.reports)} shards: {len(merged['records'])} records ({counts['pass']} passed, {counts['fail']} failed, "
          f"{counts['skip']} skipped){'' if merged['complete'] else ' INCOMPLETE: ' + str(merged['error'])}; report: {json_path} and {html_path}")
    return 0 if merged["complete"] and overall_verdict(merged) == "pass" else 1


def _cmd_list(args) -> int:
    print("formats: --formats NAME,... (variants: the default first)")
    for fmt in FORMATS:
        print(f"  {describe(fmt)}")
    for name in ([args.suite] if args.suite else SUITE_NAMES):
        cs = select(suite(name), patterns=args.cases)
        print(f"suite {name}: {len(cs)} cases, {sum(c.numel for c in cs) / 1e6:.1f} M elements")
        if args.suite or args.cases:
            for c in cs:
                m = marks(c)
                print(f"  {c.id}" + (f"  [{', '.join(m)}]" if m else ""))
    print("backends: --backend NAME, or package.module:object for your own")
    width = max(map(len, NAMES))
    for b in load_all(NAMES):
        kind = "built-in" if b.spec in BUILTINS else "external"
        state = f"available on {b.device or '-'}" + (f" ({b.reason})" if b.reason else "") if b.available else f"unavailable: {b.why_not}"
        print(f"  {b.spec:{width}} {kind:9} {state}")
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    prepare()
    args = _parser().parse_args(argv)
    try:
        return {"run": _cmd_run, "compare": _cmd_compare, "list": _cmd_list, "selftest": _cmd_selftest, "merge": _cmd_merge}[args.command](args)
    except BrokenPipeError:  # e.g. `moe-fq-parity list | head`: the reader left; no traceback, and never a pass
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def console_main() -> None:
    """Entry point of the ``moe-fq-parity`` command."""
    sys.exit(main())


def _cmd_selftest(args) -> int:
    if args.json is not None and (problem := unwritable(args.json.parent)) is not None:
        print(f"error: --json {args.json}: cannot write there: {problem}", file=sys.stderr)
        return 2
    if args.json is not None and args.json.is_dir():
        print(f"error: --json {args.json}: is a directory (name the JSON file)", file=sys.stderr)
        return 2
    try:
        controls = () if args.no_controls else (args.backend or None)
        result = run_selftest(args.suite, args.seed, mutants=args.mutant, case_ids=args.case or None, controls=controls, progress=True)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print_outcome(result)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        tmp = args.json.with_suffix(".tmp")
        tmp.write_text(dumps(to_json(result)))
        tmp.replace(args.json)
    return 0 if result.ok else 1
