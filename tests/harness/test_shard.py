"""Sharded runs: ``run --shard i/n`` partitions the cases by bytes; ``merge`` rebuilds the unsharded report."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from moe_fq_parity.cases import Case, select, suite
from moe_fq_parity.harness.core.memory import case_bytes
from moe_fq_parity.harness.run import runner
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.run.diff import diff_reports
from moe_fq_parity.harness.run.shard import Shard, assign, parse_shard, select_shard
from moe_fq_parity.reports.merge import MergeError, merge_reports
from moe_fq_parity.reports.schema import load, validate

TIMINGS = ("duration_s", "perf", "peak_bytes")
"""Record fields that legitimately differ between two runs of the same cases."""


def test_shard_spec_is_validated_with_the_expected_form():
    assert parse_shard("2/3") == Shard(2, 3) and str(parse_shard(" 1 / 1 ")) == "1/1"
    for bad in ("0/2", "3/2", "1", "a/b", "1/0", "-1/2", ""):
        with pytest.raises(ValueError, match="expected i/n"):
            parse_shard(bad)


@pytest.mark.parametrize("name", ["ci", "nightly"])
def test_shards_partition_the_cases_and_balance_bytes_not_count(name):
    cases = suite(name)
    for n in (2, 3, 5):
        parts = [select_shard(cases, Shard(i, n)) for i in range(1, n + 1)]
        ids = [c.id for p in parts for c in p]
        assert sorted(ids) == sorted(c.id for c in cases) and len(set(ids)) == len(ids)
        for p in parts:  # each shard keeps the suite's order
            pos = [cases.index(c) for c in p]
            assert pos == sorted(pos)
        loads = [sum(case_bytes(c) for c in p) for p in parts]
        assert max(loads) - min(loads) <= max(case_bytes(c) for c in cases)  # greedy largest-first bound
        assert assign(cases, n) == assign(tuple(cases), n)  # deterministic
    if name == "nightly":
        loads = [sum(case_bytes(c) for c in select_shard(cases, Shard(i, 2))) for i in (1, 2)]
        assert max(loads) / sum(loads) < 0.55


def test_one_large_case_gets_a_shard_of_its_own():
    big = Case.from_id("fp8_e4m3.cuda/per_expert/stacked/N32/5120x8192/outliers/s0")
    small = [Case.from_id(f"int8.cuda/per_expert/stacked/N{n}/8x40/outliers/s0") for n in (1, 2, 4)]
    cases = (small[0], big, *small[1:])
    assert assign(cases, 2) == [2, 1, 2, 2]  # by bytes: the Ultra case alone, the three small ones together


def _run(out: Path, *args: str) -> int:
    """``run --suite ci`` on the reference, in this process: what these tests prove is how cases are
    split and merged, which the isolation worker (``test_backend_isolation``) takes no part in."""
    return main(["run", "--suite", "ci", "--backend", "reference", "--no-progress", "--in-process", "--out", str(out), *args])


def _strip(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in TIMINGS}


@pytest.fixture
def fake_sections(monkeypatch):
    from moe_fq_parity.harness import sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"ok": "tests.harness.fake_sections:passing", "bad": "tests.harness.fake_sections:failing",
                                                      "gone": "tests.harness.nonexistent_module:run"})


SHARDED = ("--formats", "int8,mxfp4")
"""Two of the ci suite's formats (one with an amax, one with scales from the data): the round-robin
split does not depend on the format, and four runs of the whole suite were a minute of CPU."""


def test_three_shards_merge_into_the_unsharded_report_record_for_record(tmp_path, fake_sections, capsys):
    assert _run(tmp_path / "full", *SHARDED) == 1  # the fake "bad" section fails the run
    # plain JSON reads: schema validation (jsonschema, a third of this test's time) of these reports is
    # the merge and compare commands' own, whose exit codes are asserted below
    full = json.loads((tmp_path / "full" / "report.json").read_text())
    rcs = [_run(tmp_path / f"s{i}", "--shard", f"{i}/3", *SHARDED) for i in (1, 2, 3)]
    shards = [json.loads((tmp_path / f"s{i}" / "report.json").read_text()) for i in (1, 2, 3)]
    assert [s["meta"]["shard"]["index"] for s in shards] == [1, 2, 3]
    assert [[sec["name"] for sec in s["sections"]] for s in shards] == [["ok"], ["bad"], ["gone"]]  # round-robin
    assert rcs == [0, 1, 0] and sum(len(s["records"]) for s in shards) == len(full["records"])
    assert 0 < min(len(s["records"]) for s in shards)
    capsys.readouterr()
    rc = main(["merge", *(str(tmp_path / f"s{i}" / "report.json") for i in (3, 1, 2)), "--out", str(tmp_path / "merged")])
    assert rc == 1 and "merged 3 shards" in capsys.readouterr().out  # the merged report fails like the unsharded run
    merged = json.loads((tmp_path / "merged" / "report.json").read_text())
    validate(merged)
    assert (tmp_path / "merged" / "report.html").stat().st_size > 10_000
    assert [_strip(r) for r in merged["records"]] == [_strip(r) for r in full["records"]]
    untimed = lambda sections: [{k: v for k, v in sec.items() if k != "seconds"} for sec in sections]  # noqa: E731
    assert untimed(merged["sections"]) == untimed(full["sections"]) and merged["complete"]
    assert merged["meta"]["cases_planned"] == full["meta"]["cases_planned"] == len(select(suite("ci"), formats=("int8", "mxfp4")))
    assert merged["meta"]["formats"] == full["meta"]["formats"] and len(merged["meta"]["merged"]["shards"]) == 3
    diff = diff_reports(full, merged)
    assert (diff.regressions, diff.improvements, diff.changes) == ([], [], [])
    assert main(["compare", str(tmp_path / "full" / "report.json"), str(tmp_path / "merged" / "report.json")]) == 0
    assert main(["compare", str(tmp_path / "merged" / "report.json"), str(tmp_path / "full" / "report.json")]) == 0


def test_a_shard_compares_against_the_full_baseline_on_its_own_cases(tmp_path):
    cases = ["--cases", "int8.*/per_expert/stacked/*"]
    assert _run(tmp_path / "full", "--no-sections", *cases) == 0
    assert _run(tmp_path / "s2", "--no-sections", "--shard", "2/2", "--baseline", str(tmp_path / "full" / "report.json"), *cases) == 0
    report = load(tmp_path / "s2" / "report.json")
    assert report["baseline"]["regressions"] == [] and not any("missing" in c for c in report["baseline"]["changes"])


@pytest.fixture(scope="module")
def two_shards(tmp_path_factory) -> Path:
    """The two shard reports of one run of the fp8 per-expert stacked cases, made once for the tests
    below (each reads them, or works on its own copy)."""
    root = tmp_path_factory.mktemp("two_shards")
    cases = ["--no-sections", "--cases", "fp8_e4m3.*/per_expert/stacked/*"]
    for i in (1, 2):
        assert _run(root / f"s{i}", "--shard", f"{i}/2", *cases) == 0
    return root


def _shard_reports(two_shards: Path, tmp_path: Path) -> list[tuple[str, dict]]:
    """The shard reports copied under ``tmp_path`` (a test may rewrite them), as (path, report)."""
    items = []
    for i in (1, 2):
        (tmp_path / f"s{i}").mkdir()
        path = tmp_path / f"s{i}" / "report.json"
        path.write_bytes((two_shards / f"s{i}" / "report.json").read_bytes())
        items.append((str(path), load(path)))
    return items


def test_merge_refuses_what_is_not_one_sharded_run(two_shards, tmp_path):
    items = _shard_reports(two_shards, tmp_path)
    assert len(merge_reports(items)["records"]) == sum(len(r["records"]) for _, r in items)

    def refused(mutate, match: str, which: int = 1) -> None:
        bad = copy.deepcopy(items)
        mutate(bad[which][1])
        with pytest.raises(MergeError, match=match):
            merge_reports(bad)

    refused(lambda r: r["meta"].update(seed=99), r"seed 99 differs from .*s1/report.json's 1234")
    refused(lambda r: r["meta"].update(suite="nightly"), "suite 'nightly' differs")
    refused(lambda r: r["meta"]["shard"].update(index=1), r"shard 1/2 given twice")
    refused(lambda r: r["meta"]["shard"].update(count=3), r"is not one of 2 shards")
    refused(lambda r: r["meta"]["backends"].append({"spec": "triton"}), "backends")

    def other_commit_other_cases(r):
        r["meta"]["git_commit"] = "0" * 40
        r["meta"]["shard"]["selection"] = r["meta"]["shard"]["selection"][:-1]
        r["meta"]["shard"]["selection_digest"] = "different"

    refused(other_commit_other_cases, r"commit 0000000000000000000000000000000000000000\) and .* were run on different case sets")
    refused(lambda r: r["meta"]["shard"].update(selection_digest="x"), "selected different cases")
    refused(lambda r: r["meta"].pop("shard"), r"not a shard report \(no meta.shard\)")
    with pytest.raises(MergeError, match=r"shard\(s\) 2/2 missing"):
        merge_reports(items[:1])
    dup = copy.deepcopy(items)
    dup[1][1]["records"].append(dup[0][1]["records"][0])
    with pytest.raises(MergeError, match="is of a case outside this shard's share"):
        merge_reports(dup)
    same_cases_other_commit = copy.deepcopy(items)
    same_cases_other_commit[1][1]["meta"]["git_commit"] = "f" * 40
    merged = merge_reports(same_cases_other_commit)
    assert merged["meta"]["git_commit"].endswith("," + "f" * 40)


def test_merge_cli_errors_are_usage_errors_and_incomplete_shards_stay_incomplete(two_shards, tmp_path, capsys):
    items = _shard_reports(two_shards, tmp_path)
    assert main(["merge", items[0][0], "--out", str(tmp_path / "m")]) == 2
    assert "2/2 missing" in capsys.readouterr().err
    second = json.loads(Path(items[1][0]).read_text())
    second.update(complete=False, error="interrupted (KeyboardInterrupt)")
    Path(items[1][0]).write_text(json.dumps(second))
    assert main(["merge", items[0][0], items[1][0], "--out", str(tmp_path / "m")]) == 1
    merged = load(tmp_path / "m" / "report.json")
    assert not merged["complete"] and "shard 2/2" in merged["error"] and "interrupted" in merged["error"]


def test_shard_usage_errors(tmp_path, capsys):
    assert _run(tmp_path / "x", "--shard", "3/2") == 2
    assert "expected i/n with 1 <= i <= n" in capsys.readouterr().err
    assert main(["run", "--case", "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0", "--backend", "reference", "--shard", "2/2",
                 "--out", str(tmp_path / "y")]) == 2
    assert "1 cases are selected, so at most 1 shards" in capsys.readouterr().err


def test_shard_meta_names_the_selection(tmp_path):
    assert _run(tmp_path / "s", "--no-sections", "--shard", "1/4", "--cases", "int4.*") == 0
    meta = load(tmp_path / "s" / "report.json")["meta"]["shard"]
    selected = [c.id for c in suite("ci") if c.id.startswith("int4.")]
    assert meta["selection"] == selected and meta["cases"] == len(select_shard([Case.from_id(i) for i in selected], Shard(1, 4)))
    assert runner.RunConfig.__dataclass_fields__["shard"].default is None
