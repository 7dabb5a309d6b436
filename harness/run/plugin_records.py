"""The pytest plugin's records and report: every check record of the session goes to
``--parity-report DIR`` (``DIR/report.json`` and ``DIR/report.html``), xdist workers' records are
merged by the controller, and a parity test that failed without a failing record is never hidden.

Imported by the plugin once tests run (it imports torch through the records and the report writer).
"""

from __future__ import annotations


import pytest
import torch

from moe_fq_parity.reports.writer import ReportWriter, now_iso

from moe_fq_parity.harness.backends import load
from moe_fq_parity.harness.core.equality import MAX_OFFENDERS
from moe_fq_parity.harness.core.failure_text import failure_lines
from moe_fq_parity.harness.core.meta import run_meta
from moe_fq_parity.harness.core.records import CHECKS, CheckRecord
from moe_fq_parity.harness.core.repro import repro_command

from .plugin_state import ITEM_RECORDS, ParitySession

NOT_WRITTEN = (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.NO_TESTS_COLLECTED)
"""pytest exit statuses after which no report is written (an earlier report stays as it was)."""


def add_record(state: ParitySession, item: pytest.Item, rec: CheckRecord) -> None:
    """Add ``rec`` (a check of ``item``) to the session's records and the report being written."""
    data = rec.to_json()
    state.records.append(data)
    if state.writer is not None:
        state.writer.add([data])
    item.stash.setdefault(ITEM_RECORDS, []).append(rec)


def assert_record(rec: CheckRecord) -> None:
    """Skip on a ``skip`` record; fail on a ``fail`` record with its message, the offender table
    and the repro command (``harness.core.failure_text``, as a failing ``run`` prints them)."""
    if rec.verdict == "skip":
        pytest.skip(rec.message)
    if rec.verdict == "fail":
        pytest.fail("\n".join(failure_lines(rec)), pytrace=False)


def failed_test(state: ParitySession, item: pytest.Item, call: pytest.CallInfo, when: str) -> None:
    """A parity test failed in pytest (setup, call or teardown) with no failing record of its own:
    a failing record of its check (the ready test's ``check`` parameter) with the error and the
    repro command when that check has no record yet; otherwise (a test of the user's own, a failure
    after a passing check) it is listed in ``state.unrecorded`` and the report is not complete.  So
    the report never passes beside failed parity tests."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    case, spec = params.get("parity_case"), params.get("parity_backend")
    if case is None:
        return
    mine = item.stash.get(ITEM_RECORDS, [])
    if any(r.verdict == "fail" for r in mine):
        return
    error = (call.excinfo.exconly().strip().splitlines() or [""])[0][:300]
    check = params.get("check")
    if spec is not None and check in CHECKS and not any(r.check == check for r in mine):
        s = state.settings
        rec = CheckRecord(case_id=case.id, backend=spec, check=check, verdict="fail", fmt=case.fmt, n=case.n, numel=case.numel,
                          mode=s.mode, message=f"the test failed in pytest ({when}) before its check recorded a verdict: {error}",
                          repro=repro_command(case.id, spec, check, s.seed, s.mode, timeout_s=s.timeout_s, nan_bits=s.nan_bits))
        add_record(state, item, rec)
        return
    state.unrecorded.append(f"{item.nodeid} ({when}): {error}")


def start_report(config: pytest.Config, state: ParitySession) -> None:
    """Open the report of ``--parity-report`` (called when tests are about to run)."""
    s = state.settings
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    meta = run_meta(device) | {
        "copy_gbps": None, "suite": s.suite or "ci", "formats": [], "checks": [], "seed": s.seed, "mode": s.mode, "nan_bits": s.nan_bits,
        "backends": [], "started": now_iso(), "finished": None, "source": "pytest", "argv": list(config.invocation_params.args),
        "cases_planned": None, "timeout_s": s.timeout_s, "hypothesis_profile": s.hypothesis_profile,
    }
    state.writer = ReportWriter(s.report_dir, meta)


def merge_worker(state: ParitySession, output: dict) -> None:
    """xdist controller: merge a finished worker's records (its ``workeroutput``)."""
    state.unrecorded.extend(output.get("parity_unrecorded", []))
    state.not_applicable = state.not_applicable or output.get("parity_not_applicable", {})  # the same in every worker
    records = output.get("parity_records", [])
    if state.writer is not None and records:
        state.writer.add(records)


def finish_report(session: pytest.Session, state: ParitySession, exitstatus: int) -> None:
    """Finish the report: complete only when pytest ran every selected test to its end and every
    failed parity test has a failing record (``failed_test``)."""
    writer = state.writer
    if writer is None or exitstatus in NOT_WRITTEN:
        return
    specs = sorted({r["backend"] for r in writer.report["records"]} | set(state.settings.backends))
    writer.report["meta"]["backends"] = [(state.loaded[s] if s in state.loaded else load(s)).to_json() for s in specs]
    writer.report["meta"]["formats"] = sorted({r["fmt"] for r in writer.report["records"]})
    writer.report["meta"]["checks"] = sorted({r["check"] for r in writer.report["records"]})
    writer.report["not_applicable"] = state.not_applicable
    error = None
    if exitstatus in (pytest.ExitCode.INTERRUPTED, pytest.ExitCode.INTERNAL_ERROR):
        error = f"pytest exit status {int(exitstatus)}"
    elif session.shouldstop or session.shouldfail:
        error = f"pytest stopped early ({session.shouldstop or session.shouldfail}): not every selected test ran"
    elif unrecorded := state.unrecorded:
        error = (f"{len(unrecorded)} parity tests failed in pytest without a failing record: "
                 + "; ".join(unrecorded[:MAX_OFFENDERS])
                 + (f"; ... and {len(unrecorded) - MAX_OFFENDERS} more" if len(unrecorded) > MAX_OFFENDERS else ""))
    writer.finish(complete=error is None, error=error)
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.write_line(f"parity report: {writer.json_path} and {writer.html_path} ({len(writer.report['records'])} records)"
                      + (f"; INCOMPLETE: {error}" if error else ""))
