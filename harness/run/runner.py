"""Run a suite: cases x backends x checks, written incrementally to report.json and report.html."""

from __future__ import annotations

import os
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from queue import Queue
from typing import Any, Iterator, Optional, Sequence

import torch
from tqdm import tqdm

from moe_fq_parity.cases import Case
from moe_fq_parity.reports.schema import overall_verdict
from moe_fq_parity.reports.writer import ReportWriter, now_iso

from moe_fq_parity.harness import sections as report_sections
from moe_fq_parity.harness.backends import LoadedBackend
from moe_fq_parity.harness.checks.plan import NotApplicable, applicable, summary_line
from moe_fq_parity.harness.core.failure_text import failures_summary
from moe_fq_parity.harness.core.guard import Terminated, run_signals
from moe_fq_parity.harness.core.meta import run_meta
from moe_fq_parity.harness.core.records import CHECKS, CheckRecord
from moe_fq_parity.harness.core.timing import CopyCurve, copy_curve, curve_gbps
from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S, DEFAULT_NAN_BITS, NAN_BITS_MODES, RUN_GPU_SHARE_MIB, RUN_WORKERS_MAX, VERDICT_MODES

from .chunks import PHASES, case_chunks, check_chunks, in_check_order  # noqa: F401 - PHASES, check_chunks: part of the runner's API
from .diff import diff_reports, format_diff
from .gpu_lease import held_here
from .isolation import NotIsolatable, Supervisor, WorkerSettings, done_with, isolatable, supervisor as get_supervisor
from .shard import Shard, sections_of_shard, shard_meta
from moe_fq_parity.harness.sections.processes import start_sections

EXIT_PASS, EXIT_FAIL, EXIT_UNAVAILABLE, EXIT_INTERRUPTED, EXIT_TERMINATED = 0, 1, 2, 130, 143
EXIT_USAGE = 2

LOCK_NAME = ".parity-run.lock"
"""Lock file in ``--out``: one run writes a report directory at a time (``out_lock``)."""


class OutDirBusy(RuntimeError):
    """Another run holds the lock of the output directory."""


@contextmanager
def out_lock(out_dir: Path) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``out_dir/.parity-run.lock`` (created), or raise ``OutDirBusy``
    naming the holder's pid at once: two runs never write one report.json/report.html pair.

    The file is removed when the block ends (while still locked), so a finished run leaves only its
    report behind.  A run that opened the file just before its holder removed it locks a file no
    longer in the folder: it sees that (the path's inode is not the one it locked) and opens the
    path again, so two runs never both hold "the" lock."""
    import fcntl

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / LOCK_NAME
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise OutDirBusy(f"another run (pid {holder}) is writing to {out_dir}; wait for it or choose another --out") from None
        try:
            if os.stat(path).st_ino == os.fstat(fd).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)  # the holder removed the file we locked: lock the one in the folder now
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
        yield
    finally:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        os.close(fd)  # releases the lock


MAX_TIMEOUT_S = 365 * 24 * 3600
"""The longest per-call timeout: the interval timer behind it overflows from about 1e10 s (``OverflowError``
in every check)."""


def validate_config(checks: Sequence[str], sections: Optional[Sequence[str]], timeout_s: Optional[float], nan_bits: str, mode: str) -> None:
    """``ValueError`` naming the argument and the accepted values for anything a run would reject
    later; called before anything is written, so a typo never touches an earlier report."""
    unknown = [c for c in checks if c not in CHECKS]
    if unknown:
        raise ValueError(f"--checks: unknown checks {unknown}; known: {', '.join(CHECKS)}")
    if sections is not None:
        bad = [s for s in sections if s not in report_sections.SECTION_RUNNERS]
        if bad:
            raise ValueError(f"--sections: unknown sections {bad}; known: {', '.join(report_sections.SECTION_RUNNERS)}")
    if timeout_s is not None and not (isinstance(timeout_s, (int, float)) and 0 <= timeout_s <= MAX_TIMEOUT_S):
        raise ValueError(f"--timeout: seconds from 0 (no limit) to {MAX_TIMEOUT_S} (a year) expected, got {timeout_s!r}")
    if nan_bits not in NAN_BITS_MODES:
        raise ValueError(f"--nan-bits: one of {', '.join(NAN_BITS_MODES)} expected, got {nan_bits!r}")
    if mode not in VERDICT_MODES:
        raise ValueError(f"--mode: one of {', '.join(VERDICT_MODES)} expected, got {mode!r}")


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
    baseline_subset: bool = False
    """The run is a deliberate subset: compare only its cases with the baseline (``diff_reports(subset=True)``)."""
    progress: bool = True
    explicit_backends: bool = False
    argv: tuple[str, ...] = field(default_factory=tuple)
    shard: Optional[Shard] = None
    """With a shard, ``cases`` are this shard's cases and ``selection`` every selected case."""
    selection: tuple[Case, ...] = ()
    nan_bits: str = DEFAULT_NAN_BITS
    """NaN policy of every comparison (``harness.core.equality``)."""
    isolate: bool = True
    """Run the cases in a supervised worker process (``harness.run.isolation``): a backend that exits,
    crashes or hangs gives ``crash``/``timeout`` records and the run goes on; ``False`` (``run
    --in-process``): in this process, for debugging."""
    workers: Optional[int] = 1
    """Case workers (``run --workers``; ``None``: ``auto_workers``): with more than one (isolated runs
    only), that many worker processes take the cases in turn and lease their device per case, the
    GPU or on a CPU the host's memory (``gpu_lease.CaseTurns``: cases up to ``run_share_mib`` share
    it, larger cases and timings hold it alone).  The records are written in case order whatever
    order the cases finish in."""

    def __post_init__(self) -> None:
        validate_config(self.checks, self.sections, self.timeout_s, self.nan_bits, self.mode)
        if self.workers is not None and not (isinstance(self.workers, int) and self.workers >= 1):
            raise ValueError(f"--workers: a count >= 1 or 'auto' expected, got {self.workers!r}")

    def chosen_sections(self) -> tuple[str, ...]:
        """The report sections of the whole run (all shards together)."""
        return tuple(report_sections.SECTION_RUNNERS) if self.sections is None else self.sections

    def section_names(self) -> tuple[str, ...]:
        """The report sections this run produces (a shard runs its share of them)."""
        return sections_of_shard(self.chosen_sections(), self.shard)


def auto_workers(device: torch.device, isolate: bool, perf: bool = False) -> int:
    """``run --workers auto``: on a CUDA device one case worker per 4 of this process's PyTorch
    threads; on a CPU device one per thread, or one when the run times its calls (no lease keeps a
    CPU timing apart from the other workers); at most ``RUN_WORKERS_MAX``, one with ``--in-process``."""
    if not isolate:
        return 1
    if device.type == "cuda":
        return max(1, min(RUN_WORKERS_MAX, torch.get_num_threads() // 4))
    return 1 if perf else max(1, min(RUN_WORKERS_MAX, torch.get_num_threads()))


def _workers(cfg: RunConfig, device: torch.device) -> int:
    """The case workers of ``cfg`` on ``device``: one when the GPU is leased already on this
    process's behalf (a run inside a GPU test: its workers would wait for that lease forever)."""
    want = auto_workers(device, cfg.isolate, cfg.perf) if cfg.workers is None else cfg.workers
    if want > 1 and not cfg.isolate:
        print(f"note: one case worker, not {want}: --in-process runs the cases in this process", file=sys.stderr)
        return 1
    if want > 1 and device.type == "cuda" and held_here():
        print(f"note: one case worker, not {want}: this process holds a lease on the GPU already", file=sys.stderr)
        return 1
    return want


def _run_device(backends: Sequence[LoadedBackend]) -> torch.device:
    for b in backends:
        if b.available and b.device:
            return torch.device(b.device)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _case_records(cfg: RunConfig, case: Case, device: str, group: list[LoadedBackend], checks: tuple[str, ...],
                  curve: Optional[CopyCurve], phases: dict[str, float]) -> list[CheckRecord]:
    """Every record of ``case`` on the backends of one device, in this process (``case_chunks``)."""
    return in_check_order([r for recs in case_chunks(cfg, case, device, group, checks, curve, phases) for r in recs], group)


def _plan(runnable: Sequence[LoadedBackend], case: Case, checks: tuple[str, ...], tally: NotApplicable) -> dict[str, list[LoadedBackend]]:
    """The backends with checks planned for ``case``, by device (the others: counted in ``tally``)."""
    by_device: dict[str, list[LoadedBackend]] = {}
    for b in applicable(runnable, case, checks, tally):  # the others: not applicable, counted (harness.checks.plan)
        by_device.setdefault(b.device or "cpu", []).append(b)
    return by_device


def _records(cfg: RunConfig, case: Case, by_device: dict[str, list[LoadedBackend]], checks: tuple[str, ...], curve: Optional[CopyCurve],
             phases: dict[str, float], supervisor: Any, notes: set[str], in_process: bool = True) -> Optional[list[CheckRecord]]:
    """Every record of ``case``: through ``supervisor`` (a worker process) when there is one, else in
    this process; ``None`` when the case must run in this process and ``in_process`` is off."""
    out: list[CheckRecord] = []
    for device, group in by_device.items():
        recs = None
        if supervisor is not None:
            try:
                recs = supervisor.records(case, device, group, checks, phases)
            except NotIsolatable as exc:
                if exc.args[0] not in notes:
                    notes.add(exc.args[0])
                    print(f"note: case {case.id} runs in this process: {exc}", file=sys.stderr)
        if recs is None:
            if not in_process:
                return None
            recs = _case_records(cfg, case, device, group, checks, curve, phases)
        out += recs
    return out


def run_share_mib(device: torch.device, workers: int) -> int:
    """The largest case (MiB) that ``workers`` case workers run beside each other on ``device``:
    ``RUN_GPU_SHARE_MIB``, or 1/16 of the GPU's memory per worker where that is less."""
    if device.type != "cuda":
        return RUN_GPU_SHARE_MIB
    total = torch.cuda.get_device_properties(device).total_memory
    return max(1, min(RUN_GPU_SHARE_MIB, int(total // (16 * workers)) >> 20))


def _case_workers(cfg: RunConfig, runnable: Sequence[LoadedBackend], curve: Optional[CopyCurve]) -> list[Any]:
    """The run's worker processes (supervisors, started on first use): ``cfg.workers`` of them, each
    with an equal share of this process's PyTorch threads; several lease the GPU per case."""
    threads = torch.get_num_threads()
    if cfg.workers == 1:
        return [get_supervisor([b.spec for b in runnable], WorkerSettings(cfg.seed, cfg.mode, cfg.timeout_s, cfg.nan_bits, threads), curve)]
    settings = WorkerSettings(cfg.seed, cfg.mode, cfg.timeout_s, cfg.nan_bits, max(1, threads // cfg.workers),
                              gpu_share_mib=run_share_mib(_run_device(runnable), cfg.workers))
    return [get_supervisor([b.spec for b in runnable], settings, curve) if i == 0 else Supervisor([b.spec for b in runnable], settings, curve)
            for i in range(cfg.workers)]


def _run_cases(cfg: RunConfig, writer: ReportWriter, curve: Optional[CopyCurve], phases: dict[str, float]) -> None:
    t0 = time.perf_counter()
    runnable = [b for b in cfg.backends if b.available]
    checks = cfg.checks + (("perf",) if cfg.perf and "perf" not in cfg.checks else ())
    failures, na = 0, NotApplicable()
    bar = tqdm(cfg.cases, desc=f"parity {cfg.suite}" + (f" shard {cfg.shard}" if cfg.shard else ""), unit="case",
               disable=not cfg.progress, file=sys.stderr, dynamic_ncols=True)
    workers: list[Any] = []
    if cfg.isolate and runnable:
        why = isolatable(runnable)
        if why is None:
            workers = _case_workers(cfg, runnable, curve)
            starts = [w.starts for w in workers]
        else:
            print(f"note: the cases run in this process ({why})", file=sys.stderr)
    writer.report["meta"]["isolation"] = "worker" if workers else "in-process"
    writer.report["meta"]["workers"] = max(1, len(workers))
    finished, notes = False, set()
    pool = ThreadPoolExecutor(len(workers), thread_name_prefix="parity-case") if len(workers) > 1 else None
    try:
        if pool is None:
            def results() -> Iterator[tuple[Case, NotApplicable, Optional[list[CheckRecord]]]]:
                for case in bar:
                    tally = NotApplicable()
                    by_device = _plan(runnable, case, checks, tally)
                    yield case, tally, _records(cfg, case, by_device, checks, curve, phases, workers[0] if workers else None, notes)
        else:
            idle: Queue = Queue()
            for w in workers:
                idle.put(w)
            lock = threading.Lock()

            def one(case: Case, by_device: dict[str, list[LoadedBackend]]) -> Optional[list[CheckRecord]]:
                mine = dict.fromkeys(PHASES, 0.0)
                w = idle.get()
                try:
                    return _records(cfg, case, by_device, checks, curve, mine, w, notes, in_process=False)
                finally:
                    idle.put(w)
                    with lock:
                        for k, v in mine.items():
                            phases[k] = phases.get(k, 0.0) + v

            planned = []
            for case in cfg.cases:
                tally = NotApplicable()
                by_device = _plan(runnable, case, checks, tally)
                planned.append((case, tally, by_device, pool.submit(one, case, by_device)))

            def results() -> Iterator[tuple[Case, NotApplicable, Optional[list[CheckRecord]]]]:
                for case, tally, by_device, future in planned:
                    recs = future.result()
                    if recs is None:  # a case only this process can run (``NotIsolatable``): here, in turn
                        recs = _records(cfg, case, by_device, checks, curve, phases, None, notes)
                    bar.update()
                    yield case, tally, recs

        for case, tally, recs in results():
            na.merge(tally)
            writer.report["not_applicable"] = na.to_json()
            failures += sum(r.verdict == "fail" for r in recs)
            phases["report_writes"] = writer.write_s
            phases["total"] = phases.get("_before_cases", 0.0) + time.perf_counter() - t0
            writer.report["meta"]["phase_s"] = {k: round(v, 3) for k, v in phases.items() if k in PHASES}  # so far: a cut-off run still tells
            writer.add(r.to_json() for r in recs)
            bar.set_postfix(fail=failures, refresh=False)
        finished = True
    finally:
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        if workers:
            writer.report["meta"]["workers_started"] = sum(w.starts - s for w, s in zip(workers, starts))
            done_with(workers[0], keep=finished)
            for w in workers[1:]:
                w.close()
        if pool is not None:
            pool.shutdown(wait=True)
    bar.close()


def run(cfg: RunConfig) -> int:
    """Run ``cfg`` and return the exit code (0 only when every check passed; 2 when another run is
    writing to the same ``out_dir``; 130 on Ctrl-C and 143 on SIGTERM, each with a partial report)."""
    # The HTML renderer (matplotlib, jinja2) must be loaded before SIGTERM can raise: an import cut
    # off midway leaves half-initialised modules behind, and the partial report's HTML then fails to
    # import them (seen on a slow host: exit 1 instead of 143, no partial HTML).  Imported here, not
    # with this module: every process spawned from a run (case and isolation workers, sections)
    # re-imports the run's main module, and 0.25 s of its start-up went to the renderer it never uses.
    from moe_fq_parity.reports import html  # noqa: F401

    try:
        with out_lock(cfg.out_dir), run_signals():
            return _run_locked(cfg)
    except OutDirBusy as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _run_locked(cfg: RunConfig) -> int:
    started_at = time.perf_counter()
    device = _run_device(cfg.backends)
    cfg = replace(cfg, workers=_workers(cfg, device))
    copy_gbps, curve = None, None
    if cfg.perf:
        curve = copy_curve(device)
        copy_gbps = curve_gbps(curve)
    meta = run_meta(device) | {
        "copy_gbps": copy_gbps, "copy_curve": [list(p) for p in curve] if curve else None, "suite": cfg.suite, "formats": sorted({c.fmt for c in cfg.cases}),
        "checks": list(cfg.checks) + (["perf"] if cfg.perf and "perf" not in cfg.checks else []),
        "backends": [b.to_json() for b in cfg.backends], "cases": [c.id for c in cfg.cases], "seed": cfg.seed, "mode": cfg.mode, "nan_bits": cfg.nan_bits,
        "started": now_iso(),
        "finished": None, "source": "cli", "argv": list(cfg.argv), "cases_planned": len(cfg.cases), "timeout_s": cfg.timeout_s,
    }
    if cfg.shard is not None:
        meta["shard"] = shard_meta(cfg.selection, cfg.shard, cfg.chosen_sections())
    writer = ReportWriter(cfg.out_dir, meta)
    writer.write_json()
    phases = dict.fromkeys(PHASES, 0.0)
    names = cfg.section_names()
    part = report_sections.Part(cfg.shard.index, cfg.shard.count) if cfg.shard is not None else None
    try:
        # The section processes start now and prepare (interpreter, imports) while the cases run.
        with start_sections(cfg.suite, cfg.seed, str(device), names, part=part) as started:
            writer.write_html()
            phases["_before_cases"] = time.perf_counter() - started_at
            _run_cases(cfg, writer, curve, phases)
            t0 = time.perf_counter()

            def section_done(done: list[dict], last: dict) -> None:
                of = f" (part {last['part']['index']}/{last['part']['count']})" if last.get("part") else ""
                print(f"section {last['name']}{of}: {last['verdict']}, {len(last['rows'])} rows in {last['seconds']:.1f} s", file=sys.stderr)
                phases["sections"] = time.perf_counter() - t0
                phases["total"] = time.perf_counter() - started_at
                writer.report["meta"]["phase_s"] = {k: round(phases[k], 3) for k in PHASES}
                writer.set_sections(done)

            sections = started.run(on_done=section_done) if names else []
        phases["sections"] = time.perf_counter() - t0
        writer.set_sections(sections)
        if cfg.baseline is not None:
            writer.report["complete"] = True  # everything ran: the diff sees a complete report
            diff = diff_reports(cfg.baseline, writer.report, subset=cfg.baseline_subset)
            writer.set_baseline(diff.to_json(cfg.baseline_path))
            print(format_diff(diff))
        phases["report_writes"] = writer.write_s
        phases["total"] = time.perf_counter() - started_at
        writer.report["meta"]["phase_s"] = {k: round(phases[k], 3) for k in PHASES}
        writer.finish(complete=True)
        per_section = ", ".join(f"{s['name']} {s['seconds']:.1f}" for s in sections if "seconds" in s)
        print("time: " + ", ".join(f"{k} {phases[k]:.1f} s" + (f" ({per_section})" if k == "sections" and per_section else "") for k in PHASES),
              file=sys.stderr)
    except Terminated:
        writer.finish(complete=False, error="terminated (SIGTERM)")
        print(f"terminated: partial report in {writer.json_path}", file=sys.stderr)
        return EXIT_TERMINATED
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
    for block in failures_summary(report["records"]):
        print(block)
    print(f"{counts['pass']} passed, {counts['fail']} failed, {counts['skip']} skipped; report: {writer.json_path} and {writer.html_path}")
    if summary_line(report):
        print(summary_line(report))
    for outcome, what in (("oom", "ran out of memory"), ("crash", "crashed their worker process"), ("timeout", "timed out (worker killed)")):
        hit = [r for r in report["records"] if r.get("outcome") == outcome]
        if hit:
            print(f"{len(hit)} checks {what} (no parity verdict; the run fails):", file=sys.stderr)
            for r in hit[:20]:
                print(f"  {r['check']} on {r['backend']}, case {r['case_id']}: {r['message']}\n    repro: {r['repro']}", file=sys.stderr)
    for b in cfg.backends:
        if not b.available:
            print(f"backend {b.spec} skipped: {b.why_not}")
        elif b.built is not None and b.built.changes:
            print(f"backend {b.spec}: {b.built.note()}", file=sys.stderr)
    verdict = overall_verdict(report)
    if verdict == "fail":
        return EXIT_FAIL
    if cfg.explicit_backends and any(not b.available for b in cfg.backends):
        return EXIT_UNAVAILABLE
    if verdict == "skip":
        print("no check passed: everything was skipped")
        return EXIT_FAIL
    return EXIT_PASS
