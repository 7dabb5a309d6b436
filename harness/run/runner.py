"""Run a suite: cases x backends x checks, written incrementally to report.json and report.html."""

from __future__ import annotations

import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Sequence

import torch

from moe_fq_parity.cases import Case, make_inputs
from moe_fq_parity.reports.schema import overall_verdict
from moe_fq_parity.reports.writer import ReportWriter, now_iso

from moe_fq_parity.harness.backends import LoadedBackend
from moe_fq_parity.harness.checks import CheckContext, case_oom_record, expected_forward, run_case_checks
from .diff import diff_reports, format_diff
from .shard import Shard, sections_of_shard, shard_meta
from moe_fq_parity.harness.core.memory import OOM_ERRORS, allocated, case_bytes, forget, release
from moe_fq_parity.harness.core.meta import run_meta
from moe_fq_parity.harness.core.records import CheckRecord
from moe_fq_parity.harness.core.equality import DEFAULT_NAN_BITS
from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S
from moe_fq_parity.harness import sections as report_sections

EXIT_PASS, EXIT_FAIL, EXIT_UNAVAILABLE, EXIT_INTERRUPTED = 0, 1, 2, 130


@dataclass(frozen=True)
class RunConfig:
    """Everything a run needs (built by the CLI)."""

    suite: str
    cases: tuple[Case, ...]
    backends: tuple[LoadedBackend, ...]
    checks: tuple[str, ...]
    out_dir: Path
    seed: int
    mode: str = "strict"
    timeout_s: Optional[float] = CALL_TIMEOUT_S
    perf: bool = False
    sections: Optional[tuple[str, ...]] = None
    baseline: Optional[dict] = None
    baseline_path: str = ""
    progress: bool = True
    explicit_backends: bool = False
    argv: tuple[str, ...] = field(default_factory=tuple)
    shard: Optional[Shard] = None
    """With a shard, ``cases`` are this shard's cases and ``selection`` every selected case."""
    selection: tuple[Case, ...] = ()
    nan_bits: str = DEFAULT_NAN_BITS
    """NaN policy of every comparison (``harness.core.equality``)."""

    def chosen_sections(self) -> tuple[str, ...]:
        """The report sections of the whole run (all shards together)."""
        return tuple(report_sections.SECTION_RUNNERS) if self.sections is None else self.sections

    def section_names(self) -> tuple[str, ...]:
        """The report sections this run produces (a shard runs its share of them)."""
        return sections_of_shard(self.chosen_sections(), self.shard)


def _run_device(backends: Sequence[LoadedBackend]) -> torch.device:
    for b in backends:
        if b.available and b.device:
            return torch.device(b.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _input_failure(case: Case, backend: LoadedBackend, seed: int, exc: BaseException) -> CheckRecord:
    from moe_fq_parity.harness.core.repro import repro_command

    return CheckRecord(case_id=case.id, backend=backend.spec, check="forward", verdict="fail", fmt=case.fmt, n=case.n,
                       numel=case.numel, message=f"building the case inputs raised {type(exc).__name__}: {exc}",
                       repro=repro_command(case.id, backend.spec, "forward", seed))


def _case_records(cfg: RunConfig, case: Case, device: str, group: list[LoadedBackend], checks: tuple[str, ...],
                  copy_gbps: Optional[float]) -> list[CheckRecord]:
    """Every record of ``case`` on the backends of one device; the case's tensors are dropped on return.

    Out of memory while building the inputs or the reference outputs gives ``oom`` records (the
    memory is released first, so the message's "free" is what the next case gets).
    """
    dev = torch.device(device)
    base = allocated(dev)
    oom_detail = None
    try:
        inputs = make_inputs(case, cfg.seed, device)
        expected = expected_forward(inputs)
    except KeyboardInterrupt:
        raise
    except OOM_ERRORS as exc:
        oom_detail = f"{type(exc).__name__}: {exc}"
        forget(exc)
    except Exception as exc:  # noqa: BLE001 - a case that cannot be built fails, the run goes on
        return [_input_failure(case, b, cfg.seed, exc) for b in group]
    if oom_detail is not None:
        release(dev)
        return [case_oom_record(case, b.spec, "forward", cfg.seed, cfg.mode, case_bytes(case), dev,
                                "building the case inputs and reference outputs", oom_detail) for b in group]
    recs: list[CheckRecord] = []
    for b in group:
        ctx = CheckContext(b, inputs, cfg.seed, cfg.mode, cfg.timeout_s, copy_gbps, mem_base=base, nan_bits=cfg.nan_bits)
        recs += run_case_checks(ctx, checks, expected)
    return recs


def _run_cases(cfg: RunConfig, writer: ReportWriter, copy_gbps: Optional[float]) -> None:
    from tqdm import tqdm

    runnable = [b for b in cfg.backends if b.available]
    checks = cfg.checks + (("perf",) if cfg.perf and "perf" not in cfg.checks else ())
    failures = 0
    bar = tqdm(cfg.cases, desc=f"parity {cfg.suite}" + (f" shard {cfg.shard}" if cfg.shard else ""), unit="case",
               disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
    for case in bar:
        by_device: dict[str, list[LoadedBackend]] = {}
        for b in runnable:
            by_device.setdefault(b.device or "cpu", []).append(b)
        for device, group in by_device.items():
            recs = _case_records(cfg, case, device, group, checks, copy_gbps)
            failures += sum(r.verdict == "fail" for r in recs)
            writer.add(r.to_json() for r in recs)
        bar.set_postfix(fail=failures, refresh=False)
    bar.close()


def run(cfg: RunConfig) -> int:
    """Run ``cfg`` and return the exit code (0 only when every check passed)."""
    device = _run_device(cfg.backends)
    copy_gbps = None
    if cfg.perf:
        from moe_fq_parity.harness.core.timing import copy_bandwidth_gbps

        copy_gbps = copy_bandwidth_gbps(device)
    meta = run_meta(device) | {
        "copy_gbps": copy_gbps, "suite": cfg.suite, "formats": sorted({c.fmt for c in cfg.cases}), "checks": list(cfg.checks) + (["perf"] if cfg.perf and "perf" not in cfg.checks else []),
        "backends": [b.to_json() for b in cfg.backends], "seed": cfg.seed, "mode": cfg.mode, "nan_bits": cfg.nan_bits, "started": now_iso(),
        "finished": None, "source": "cli", "argv": list(cfg.argv), "cases_planned": len(cfg.cases), "timeout_s": cfg.timeout_s,
    }
    if cfg.shard is not None:
        meta["shard"] = shard_meta(cfg.selection, cfg.shard, cfg.chosen_sections())
    writer = ReportWriter(cfg.out_dir, meta)
    writer.write_json()
    try:
        _run_cases(cfg, writer, copy_gbps)
        names = cfg.section_names()
        writer.set_sections(report_sections.run_sections(cfg.suite, cfg.seed, str(device), names) if names else [])
        if cfg.baseline is not None:
            diff = diff_reports(cfg.baseline, writer.report)
            writer.set_baseline(diff.to_json(cfg.baseline_path))
            print(format_diff(diff))
        writer.finish(complete=True)
    except KeyboardInterrupt:
        writer.finish(complete=False, error="interrupted (KeyboardInterrupt)")
        print(f"interrupted: partial report in {writer.json_path}", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BaseException as exc:
        writer.finish(complete=False, error=f"{type(exc).__name__}: {exc}")
        traceback.print_exc()
        print(f"run died: partial report in {writer.json_path}", file=sys.stderr)
        return EXIT_FAIL
    return _exit_code(cfg, writer)


def _exit_code(cfg: RunConfig, writer: ReportWriter) -> int:
    report = writer.report
    counts = {v: sum(r["verdict"] == v for r in report["records"]) for v in ("pass", "fail", "skip")}
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped; report: {writer.json_path} and {writer.html_path}")
    oom = [r for r in report["records"] if r.get("outcome") == "oom"]
    if oom:
        print(f"{len(oom)} checks ran out of memory (no parity verdict; the run fails):", file=sys.stderr)
        for r in oom[:20]:
            print(f"  {r['check']} on {r['backend']}: {r['message']}", file=sys.stderr)
    for b in cfg.backends:
        if not b.available:
            print(f"backend {b.spec} skipped: {b.why_not}")
    verdict = overall_verdict(report)
    if verdict == "fail":
        return EXIT_FAIL
    if cfg.explicit_backends and any(not b.available for b in cfg.backends):
        return EXIT_UNAVAILABLE
    if verdict == "skip":
        print("no check passed: everything was skipped")
        return EXIT_FAIL
    return EXIT_PASS
