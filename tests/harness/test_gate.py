"""The gate: ``compare``, ``run --baseline`` and ``merge`` never pass on less coverage or a report that
contradicts itself, and count what they list; CLI misuse is a one-line usage error (exit 2)."""

from __future__ import annotations

import copy
import json
import re
import time
from pathlib import Path

import pytest

from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.cases import suite
from moe_fq_parity.harness.run.diff import MAX_LISTED, diff_reports, format_diff
from moe_fq_parity.reports.merge import MergeError, merge_reports
from moe_fq_parity.reports.schema import check_consistency, load

BROKEN = "tests.harness.broken_backends"
ONE = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _run(out: Path, *args: str) -> int:
    """A run in this process: these tests judge the reports it writes, never its isolation (a worker start per run cost ~1.5 CPU-s)."""
    return main(["run", "--suite", "smoke", "--backend", "reference", "--no-progress", "--no-sections", "--in-process", "--out", str(out), *args])


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("full")
    assert _run(out) == 0
    return out / "report.json"


@pytest.fixture(scope="module")
def subset(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("subset")
    assert _run(out, "--formats", "int8") == 0
    return out / "report.json"


def _write(path: Path, report: dict) -> Path:
    path.write_text(json.dumps(report))
    return path


# --- a new run of fewer cases -----------------------------------------------------------------------

def test_compare_with_a_subset_run_is_a_regression_unless_declared(full, subset, capsys):
    old, new = load(full), load(subset)
    lost = [r for r in old["records"] if r["fmt"] != "int8"]
    n_cases = len({r["case_id"] for r in lost})
    assert main(["compare", str(full), str(subset)]) == 1
    out = capsys.readouterr().out
    first = out.splitlines()[0]
    assert first.startswith(f"WARNING: {n_cases} baseline cases") and f"({len(lost)} records)" in first and "--subset" in first
    checked = [r for r in lost if r["verdict"] != "skip"]  # a lost skip is a change (it checked nothing), not a regression
    assert f"{len(checked)} regressions ({len(checked)} missing record)" in out
    assert main(["compare", "--subset", str(full), str(subset)]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0] == (f"WARNING: SUBSET: {n_cases} baseline cases ({len(lost)} records) are outside the new run's selection "
                                   "and were NOT compared (--subset)")
    assert diff_reports(old, new, subset=True).regressions == []


def test_run_baseline_with_a_subset_is_a_regression_unless_declared(tmp_path, full, capsys):
    assert _run(tmp_path / "a", "--formats", "int8", "--baseline", str(full)) == 1
    report = load(tmp_path / "a" / "report.json")
    assert report["baseline"]["totals"]["regressions"] == {"missing record": sum(r["fmt"] != "int8" and r["verdict"] != "skip" for r in load(full)["records"])}
    capsys.readouterr()
    assert _run(tmp_path / "b", "--formats", "int8", "--baseline", str(full), "--baseline-subset") == 0
    report = load(tmp_path / "b" / "report.json")
    n_cases = len({r["case_id"] for r in load(full)["records"] if r["fmt"] != "int8"})
    assert report["baseline"]["regressions"] == [] and report["baseline"]["warnings"][0].startswith(f"SUBSET: {n_cases} baseline cases")
    assert f"WARNING: SUBSET: {n_cases} baseline cases" in capsys.readouterr().out
    assert _run(tmp_path / "c", "--baseline-subset") == 2
    assert "give --baseline too" in capsys.readouterr().err and not (tmp_path / "c").exists()


# --- reports that contradict themselves are refused -------------------------------------------------

def _first_pass(report: dict, mode: str = "strict") -> dict:
    return next(r for r in report["records"] if r["verdict"] == "pass" and r["check"] == "forward" and r["counts"])


def _offender(cls: str) -> dict:
    return {"expert": 0, "row": 0, "col": 1, "input": 0.5, "expected": 0.5, "got": 0.5078125, "pre_round": 63.5, "ulp": 1, "cls": cls}


def _move(r: dict, cls: str, k: int = 1) -> None:
    """Recount ``k`` exact elements of ``r`` as ``cls``, in the record and in its first expert."""
    for c in (r["counts"], r["per_expert"][0]["counts"]):
        c.update({"exact": c["exact"] - k, cls: c.get(cls, 0) + k})


def _fewer(r: dict) -> None:
    """One element fewer compared, in the counts and in expert 0's numel (consistent but for the total)."""
    _move(r, "exact", 0)
    r["counts"]["exact"] -= 1
    r["per_expert"][0]["counts"]["exact"] -= 1
    r["per_expert"][0]["numel"] -= 1


INCONSISTENT = {
    "error count": (lambda r: _move(r, "error"), "error 1", 1),
    "tie flip": (lambda r: _move(r, "tie_flip", 2), "tie_flip 2", 1),
    "nan bits": (lambda r: _move(r, "nan_bits"), "nan_bits 1", 1),
    "ulp1 under strict": (lambda r: _move(r, "ulp1"), "ulp1 1", 1),
    "max ulp": (lambda r: r.update(max_ulp=3), "max_ulp 3", 1),
    "histogram": (lambda r: r.update(histogram=[0, 0, 4] + [0] * 6), "4 histogram entries above 0 ULP", 1),
    "signed zero": (lambda r: r.update(signed_zero=1), "signed_zero 1", 1),
    "nan mismatch": (lambda r: r.update(nan_mismatch=1), "nan_mismatch 1", 1),
    "offender": (lambda r: r["offenders"].append(_offender("ulp1")), "1 offenders", 1),
    "oom pass": (lambda r: r.update(outcome="oom"), "outcome oom with verdict 'pass'", 1),
    "crash pass": (lambda r: r.update(outcome="crash"), "outcome crash with verdict 'pass' (its worker died", 1),
    "timeout pass": (lambda r: r.update(outcome="timeout"), "outcome timeout with verdict 'pass'", 1),
    "key": (lambda r: r.update(key=r["key"] + "x"), "is not case_id|backend|check", 1),
    "fmt": (lambda r: r.update(fmt="int4"), "fmt 'int4' contradicts the case id (format 'int8')", 1),
    "n": (lambda r: r.update(n=5), "n 5 contradicts the case id (N4)", 1),
    "numel 0": (lambda r: r.update(numel=0), "numel 0 contradicts the case id (1 to 1280", 2),
    "numel below the counts": (lambda r: r.update(numel=r["numel"] - 1), "counts 1280 elements, more than its numel 1279", 1),
    "a pass that compared fewer": (_fewer, "counts 1279 of its numel 1280", 1),
    "per-expert counts": (lambda r: r["per_expert"][0]["counts"].update(exact=0, error=r["per_expert"][0]["counts"]["exact"]),
                          "per_expert counts add up to", 1),
    "per-expert numel": (lambda r: r["per_expert"][1].update(numel=1), "per_expert expert 1 counts 320 elements of its numel 1", 1),
    "expert index": (lambda r: r["per_expert"][3].update(expert=4), "per_expert names experts [0, 1, 2, 4] (N4: 0 to 3", 1),
    "negative count": (lambda r: r["counts"].update(exact=r["counts"]["exact"] + 1, ulp1=-1), "negative counts (ulp1 -1)", 2),
    "case id": (lambda r: r.update(case_id="int8", key=f"int8|{r['backend']}|{r['check']}"), "case_id 'int8' is not a case id", 1),
}


@pytest.fixture(scope="module")
def full_report(full) -> dict:
    return load(full)


@pytest.mark.parametrize("what", sorted(INCONSISTENT))
def test_a_record_that_contradicts_itself_is_refused(full_report, what):
    """Each doctoring of the first passing forward record (``int8`` stacked ``N4/8x40``) is refused
    by the consistency check of ``reports.schema.load``, naming the record and each contradiction."""
    mutate, message, count = INCONSISTENT[what]
    report = copy.deepcopy(full_report)
    r = _first_pass(report)
    assert r["case_id"] == ONE
    mutate(r)
    with pytest.raises(ValueError) as exc:
        check_consistency(report)
    assert str(exc.value).startswith(f"{count} inconsistencies: records[") and message in str(exc.value), exc.value


def test_compare_refuses_a_doctored_report_naming_each_record(tmp_path, full, full_report, capsys):
    """``compare`` exits 2 with one line on a report whose records were edited (a pass made a crash and
    a timeout, per-expert counts that miss ``numel``, ``numel`` 0, a format the case id denies),
    whether it is the new report or the baseline."""
    report = copy.deepcopy(full_report)
    passes = [r for r in report["records"] if r["verdict"] == "pass" and r["per_expert"]][:5]
    passes[0]["outcome"] = "crash"
    passes[1]["outcome"] = "timeout"
    passes[2]["per_expert"][0]["counts"]["exact"] -= 1
    passes[3]["numel"] = 0
    passes[4]["fmt"] = "mxfp8"
    bad = _write(tmp_path / "bad.json", report)
    for args in ([str(full), str(bad)], [str(bad), str(full)]):
        assert main(["compare", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "refused: 7 inconsistencies" in err, err
        for k, what in [(0, "outcome crash"), (1, "outcome timeout"), (2, "per_expert expert 0 counts"), (3, "numel 0 contradicts"),
                        (4, "fmt 'mxfp8' contradicts")][:4]:  # the message names the first MAX_PROBLEMS (5)
            assert f"records[{report['records'].index(passes[k])}] ({passes[k]['key']}): {what}" in err, (what, err)


def test_case_id_facts_follow_the_case_grammar():
    """The report's reading of a case id (``CASE_ID``) gives every ci case's format and N, and its
    element count within the bounds the consistency check applies."""
    from moe_fq_parity.reports.schema import CASE_ID

    for c in suite("ci"):
        m = CASE_ID.match(c.id)
        assert m and m["fmt"] == c.fmt and int(m["n"]) == c.n, c.id
        assert 1 <= c.numel <= int(m["n"]) * int(m["out"]) * int(m["inn"]), c.id


def test_a_one_ulp_pass_with_one_ulp_elements_is_consistent(tmp_path, full):
    """No false refusal: under 1-ulp a pass may count ulp1 elements and list them as offenders."""
    report = load(full)
    r = _first_pass(report)
    r.update(mode="1-ulp", max_ulp=1, histogram=[r["counts"]["exact"] - 1, 1] + [0] * 7)
    _move(r, "ulp1")
    r["offenders"].append(_offender("ulp1"))
    assert load(_write(tmp_path / "ok.json", report))["records"]


def test_duplicate_record_keys_are_refused(tmp_path, full, capsys):
    report = load(full)
    changed = copy.deepcopy(report["records"][0])
    changed.update(verdict="fail", message="a second record of the same check")
    report["records"].append(changed)
    bad = _write(tmp_path / "dup.json", report)
    assert main(["compare", str(full), str(bad)]) == 2
    assert f"records[0] and records[{len(report['records']) - 1}] have one key {report['records'][0]['key']!r}" in capsys.readouterr().err


def test_duplicate_section_rows_are_refused(tmp_path, full):
    report = load(full)
    row = {"id": "a/b", "verdict": "pass"}
    report["sections"] = [{"name": "s", "title": "S", "columns": [], "rows": [row, dict(row, verdict="fail")], "verdict": "fail"}]
    with pytest.raises(ValueError, match="section 's' has two rows 'a/b'"):
        load(_write(tmp_path / "dup.json", report))


@pytest.mark.parametrize("version, message", [("1.99", "newer than this reader's"), ("2.0", "not a report schema version"),
                                              ("x", "not a report schema version")])
def test_unknown_schema_versions_are_refused(tmp_path, full, capsys, version, message):
    report = load(full)
    report["schema_version"] = version
    bad = _write(tmp_path / "v.json", report)
    assert main(["compare", str(full), str(bad)]) == 2
    err = capsys.readouterr().err
    assert message in err and f"schema_version {version!r}" in err


def test_the_limits_a_pass_is_checked_against_are_the_harness_tolerances():
    from moe_fq_parity.harness.core.tolerances import MAX_ULP
    from moe_fq_parity.harness.core.ulp import CLASSES
    from moe_fq_parity.reports.schema import FAILING_CLASSES, PASS_MAX_ULP

    from moe_fq_parity.harness.core.records import OUTCOMES
    from moe_fq_parity.reports.schema import NO_VERDICT

    assert PASS_MAX_ULP == MAX_ULP and set(FAILING_CLASSES) == set(CLASSES) - {"exact", "ulp1"}
    assert set(NO_VERDICT) == set(OUTCOMES) - {"checked"}


# --- compare: arguments, counts, cuts and warnings --------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-0.1", "abc"])
def test_threshold_must_be_a_finite_fraction(full, capsys, value):
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--threshold", value, str(full), str(full)])
    assert exc.value.code == 2 and "--threshold" in capsys.readouterr().err


def _rows(n: int, verdict: str, prefix: str) -> list[dict]:
    return [{"id": f"{prefix}{k:03d}", "verdict": verdict} for k in range(n)]


def _section(rows: list[dict]) -> dict:
    return {"name": "sec", "title": "Sec", "columns": [], "rows": rows, "verdict": "pass"}


def test_missing_section_rows_are_not_hidden_behind_skips():
    old = {"records": [], "sections": [_section(_rows(MAX_LISTED, "skip", "a") + _rows(3, "pass", "b"))]}
    new = {"records": [], "sections": []}
    d = diff_reports(old, new)
    assert d.regressions == [f"section row missing in new report (coverage lost): sec:b{k:03d}" for k in range(3)]


def test_headline_counts_records_and_rows_and_every_cut_list_says_how_many_more():
    n_rec, n_rows = MAX_LISTED + 10, MAX_LISTED + 25
    recs = [{"key": f"c{k:03d}|b|forward", "case_id": f"c{k:03d}", "backend": "b", "verdict": "pass", "counts": {"exact": 1}}
            for k in range(n_rec)]
    fails = [dict(r, verdict="fail", message="m") for r in recs[:3]]
    old = {"records": recs, "sections": [_section(_rows(n_rows, "pass", "r"))]}
    new = {"records": fails, "sections": []}
    d = diff_reports(old, new)
    assert d.totals["regressions"] == {"pass -> fail": 3, "missing record": n_rec - 3, "missing section row": n_rows}
    text = format_diff(d)
    assert text.splitlines()[0] == (f"{3 + n_rec - 3 + n_rows} regressions (3 pass -> fail, {n_rec - 3} missing record, "
                                    f"{n_rows} missing section row), 0 improvements, 0 other changes")
    assert f"  ... and {n_rec - 3 - MAX_LISTED} more missing record" in text and f"  ... and {n_rows - MAX_LISTED} more missing section row" in text
    assert len(d.regressions) == 3 + MAX_LISTED + 1 + MAX_LISTED + 1


def test_reports_of_other_backends_or_suites_are_named_first(full, tmp_path, capsys):
    report = load(full)
    report["meta"]["suite"] = "ci"
    for r in report["records"]:
        r["backend"] = "eager-loop"
        r["key"] = f"{r['case_id']}|eager-loop|{r['check']}"
    other = _write(tmp_path / "other.json", report)
    assert main(["compare", str(full), str(other)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "WARNING: the reports ran different suite: baseline 'smoke', new 'ci'"
    assert lines[1] == "WARNING: the reports ran different backends: only in the baseline ['reference'], only in the new report ['eager-loop']"


# --- merge ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> list[tuple[str, dict]]:
    base = tmp_path_factory.mktemp("shards")
    for i in (1, 2):
        assert _run(base / f"s{i}", "--shard", f"{i}/2", "--cases", "int*") == 0
    return [(str(base / f"s{i}" / "report.json"), load(base / f"s{i}" / "report.json")) for i in (1, 2)]


def _emptied(r: dict) -> None:
    r["records"] = []


def _cut(r: dict) -> None:
    del r["records"][-1]


def _other_nan_bits(r: dict) -> None:
    r["meta"]["nan_bits"] = "strict"


@pytest.mark.parametrize("mutate, message", [(_emptied, "lacks every record of case"), (_cut, "lacks the records of checks"),
                                             (_other_nan_bits, "nan_bits 'strict' differs")])
def test_merge_refuses_a_complete_shard_with_records_lost_or_another_nan_policy(shards, mutate, message):
    assert len(merge_reports(shards)["records"]) == sum(len(r["records"]) for _, r in shards)
    bad = copy.deepcopy(shards)
    mutate(bad[1][1])
    with pytest.raises(MergeError, match=message):
        merge_reports(bad)
    bad[1][1].update(complete=False, error="interrupted")
    if mutate is not _other_nan_bits:  # an incomplete shard merges into an incomplete report
        assert not merge_reports(bad)["complete"]


def test_merge_refuses_shards_whose_shares_overlap(shards):
    bad = copy.deepcopy(shards)
    bad[1][1]["meta"]["cases"][0] = bad[0][1]["meta"]["cases"][0]
    with pytest.raises(MergeError, match="is in the share of"):
        merge_reports(bad)


# --- one-line usage errors --------------------------------------------------------------------------

@pytest.mark.parametrize("where", ["file", "proc"])
def test_merge_out_that_cannot_be_written_is_a_usage_error(shards, tmp_path, capsys, where):
    out = tmp_path / "a_file" if where == "file" else Path("/proc/nope")
    if where == "file":
        out.write_text("keep")
    assert main(["merge", shards[0][0], shards[1][0], "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: cannot write the merged report to {out}")
    assert where != "file" or out.read_text() == "keep"


def test_absurd_shard_count_is_a_usage_error(tmp_path, capsys):
    start = time.perf_counter()
    assert _run(tmp_path / "x", "--shard", "1/99999999999") == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and re.search(r"(\d+) cases are selected, so at most \1 shards", err), err
    assert time.perf_counter() - start < 5 and not (tmp_path / "x" / "report.json").exists()


def test_partition_cost_does_not_grow_with_the_part_count():
    from moe_fq_parity.harness.core.partition import balance

    weights = [5.0, 0.0, 3.0, 3.0, 1.0]
    assert balance(weights, 10**11) == balance(weights, len(weights)) == [1, 5, 2, 3, 4]
    with pytest.raises(ValueError, match=">= 0"):
        balance([1.0, -1.0], 2)


def test_selftest_unknown_control_backend_is_a_usage_error_before_any_mutant_runs(capsys):
    assert main(["selftest", "--backend", "nope", "--mutant", "scale-reciprocal", "--case", ONE]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "unknown backend 'nope'" in err and "scale-reciprocal" not in out


def test_selftest_json_under_a_file_is_a_usage_error_before_the_run(tmp_path, capsys):
    (tmp_path / "f").write_text("")
    assert main(["selftest", "--no-controls", "--mutant", "scale-reciprocal", "--case", ONE, "--json", str(tmp_path / "f" / "x.json")]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "--json" in err and "scale-reciprocal" not in out


# --- a failing run says what failed -----------------------------------------------------------------

def test_a_failing_run_prints_the_first_failures_with_offenders_and_repro(tmp_path, capsys):
    from moe_fq_parity.harness.core.failure_text import FAILURES_SHOWN

    rc = _run(tmp_path / "f", "--backend", f"{BROKEN}:OneUlpHigh", "--formats", "int8")
    report = load(tmp_path / "f" / "report.json")
    failing = [r for r in report["records"] if r["verdict"] == "fail"]
    out = capsys.readouterr().out
    assert rc == 1 and len(failing) > FAILURES_SHOWN
    assert out.count("first 10 offenders:") == FAILURES_SHOWN and f"FAIL 1/{len(failing)}: {failing[0]['check']} failed for" in out
    assert f"  repro: {failing[0]['repro']}" in out and "expert  row  col" in out
    assert f"... and {len(failing) - FAILURES_SHOWN} more failing records" in out
