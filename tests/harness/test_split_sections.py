"""Report sections split across the shards of a run: the partition, the parts' blocks, and ``merge``
rebuilding the unsplit section row for row (fake sections, and the real ``moe`` and ``dist`` ones)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from moe_fq_parity.harness import sections
from moe_fq_parity.harness.core.partition import balance
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.run.diff import diff_reports
from moe_fq_parity.harness.run.shard import Shard, sections_of_shard
from moe_fq_parity.harness.sections import Part, SectionRow, section_from_blocks
from moe_fq_parity.reports.merge import MergeError, merge_sections
from moe_fq_parity.reports.schema import load, validate


def test_balance_is_largest_first_onto_the_lightest_part_and_deterministic():
    assert balance([1, 5, 2, 2], 2) == [2, 1, 2, 2]  # 5 alone; 2 + 2 + 1 beside it
    assert balance([1, 1, 1, 1, 1], 2) == [1, 2, 1, 2, 1]  # equal weights: round-robin in item order
    assert balance([2, 2], 2, order=["b", "a"]) == [2, 1]  # ties by the order keys
    for n in (1, 2, 3, 7):
        w = [float((k * 37) % 11 + 1) for k in range(40)]
        parts = balance(w, n)
        loads = [sum(x for x, p in zip(w, parts) if p == i) for i in range(1, n + 1)]
        assert set(parts) <= set(range(1, n + 1)) and max(loads) - min(loads) <= max(w)
    with pytest.raises(ValueError, match="count must be >= 1"):
        balance([1.0], 0)


def test_the_parts_of_a_split_partition_its_items():
    w = [3.0, 1.0, 2.0, 2.0, 1.0, 4.0]
    for n in (1, 2, 3, 6, 8):
        masks = [Part(i, n).owned(w) for i in range(1, n + 1)]
        assert [sum(m[k] for m in masks) for k in range(len(w))] == [1] * len(w)
    for bad in ((0, 2), (3, 2)):
        with pytest.raises(ValueError, match="expected 1 <= index <= count"):
            Part(*bad)


def test_a_section_is_its_blocks_in_key_order_with_unique_keys():
    row = lambda i: SectionRow(f"r{i}", "pass")  # noqa: E731
    sec = section_from_blocks("s", "t", [], [((1, 0), [row(2)]), ((0,), [row(0), row(1)])])
    assert [r.id for r in sec.rows] == ["r0", "r1", "r2"] and sec.part is None and "part" not in sec.to_json()
    part = section_from_blocks("s", "t", [], [((1, 0), [row(2)])], part=Part(2, 2))
    assert part.to_json()["part"] == {"index": 2, "count": 2, "blocks": [[[1, 0], 1]]}
    with pytest.raises(ValueError, match="block keys repeat"):
        section_from_blocks("s", "t", [], [((0,), [row(0)]), ((0,), [row(1)])])


def test_split_sections_run_in_every_shard_and_the_others_round_robin():
    names = ["moe", "dist", "selftest", "external"]
    assert sections_of_shard(names, Shard(1, 2)) == ("moe", "dist", "selftest")
    assert sections_of_shard(names, Shard(2, 2)) == ("moe", "dist", "external")
    assert sections_of_shard(names, Shard(3, 3)) == ("moe", "dist")
    assert sections_of_shard(names, None) == tuple(names)


def test_every_split_runner_takes_a_part_and_no_other_does():
    import importlib
    import inspect

    for name, target in sections.SECTION_RUNNERS.items():
        module, _, fn = target.partition(":")
        params = inspect.signature(getattr(importlib.import_module(module), fn)).parameters
        assert ("part" in params) == (name in sections.SPLIT_SECTIONS), name


def _run(out: Path, *args: str) -> int:
    """A run of 30 ci cases with the fake sections: its forward checks only, in this process (the tests
    are about the sections and the shards' parts of them; a case worker process and the other checks
    would only add a PyTorch import and the checks' time)."""
    return main(["run", "--suite", "ci", "--backend", "reference", "--no-progress", "--out", str(out), "--cases", "int8.*/per_expert/stacked/*",
                 "--checks", "forward", "--in-process", *args])


@pytest.fixture
def split_sections(monkeypatch):
    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"ok": "tests.harness.fake_sections:passing", "split": "tests.harness.fake_sections:split"})
    monkeypatch.setattr(sections, "SPLIT_SECTIONS", frozenset({"split"}))


def _untimed(secs: list[dict]) -> list[dict]:
    return [{k: v for k, v in s.items() if k != "seconds"} for s in secs]


def test_three_shards_each_run_a_part_and_merge_rebuilds_the_unsplit_section(tmp_path, split_sections, capsys):
    assert _run(tmp_path / "full") == 1  # the fake split section has one failing row
    full = load(tmp_path / "full" / "report.json")
    assert [r["id"] for r in full["sections"][1]["rows"]] == ["split/0/0", "split/1-0/0", "split/1-0/1", "split/1-1/0", "split/1-1/1",
                                                              "split/1-2/0", "split/1-2/1", "split/2/0"]
    rcs = [_run(tmp_path / f"s{i}", "--shard", f"{i}/3") for i in (1, 2, 3)]
    shards = [load(tmp_path / f"s{i}" / "report.json") for i in (1, 2, 3)]
    parts = [next(s for s in rep["sections"] if s["name"] == "split") for rep in shards]
    assert [p["part"]["index"] for p in parts] == [1, 2, 3] and all(p["part"]["count"] == 3 for p in parts)
    assert [[b[0] for b in p["part"]["blocks"]] for p in parts] == [[[2]], [[0], [1, 1]], [[1, 0], [1, 2]]]  # weights 3,1,1,1,1
    assert sum(len(p["rows"]) for p in parts) == len(full["sections"][1]["rows"]) and rcs == [0, 1, 0]
    assert "(part 2 of 3)" in (tmp_path / "s2" / "report.html").read_text()
    capsys.readouterr()
    assert main(["merge", *(str(tmp_path / f"s{i}" / "report.json") for i in (2, 3, 1)), "--out", str(tmp_path / "merged")]) == 1
    merged = load(tmp_path / "merged" / "report.json")
    validate(merged)
    assert _untimed(merged["sections"]) == _untimed(full["sections"])
    assert merged["sections"][1]["seconds"] == max(p["seconds"] for p in parts)
    assert diff_reports(full, merged).regressions == []
    # one shard against the full baseline: its part is compared on its own rows
    d = diff_reports(full, shards[0])
    assert not [x for x in d.regressions if "section" in x], d.regressions


def _shard_item(index: int, count: int, secs: list[dict], complete: bool = True) -> tuple[str, dict]:
    return (f"s{index}/report.json", {"meta": {"shard": {"index": index, "count": count}}, "complete": complete, "sections": secs})


def _parts(count: int) -> list[dict]:
    from tests.harness.fake_sections import split

    return [split("ci", 1, "cpu", part=Part(i, count)).to_json() for i in range(1, count + 1)]


def test_merge_refuses_parts_that_are_not_one_split_and_names_a_part_lost_with_its_shard():
    from tests.harness.fake_sections import split

    full = split("ci", 1, "cpu").to_json()
    parts = _parts(2)
    assert merge_sections([_shard_item(2, 2, [parts[1]]), _shard_item(1, 2, [parts[0]])]) == [full]
    # part 1 broke (one row titled by the section's name): title and columns come from the part that ran
    broke = sections._single("split", "fail", "raised RuntimeError", Part(1, 2)).to_json()
    merged = merge_sections([_shard_item(1, 2, [broke]), _shard_item(2, 2, [parts[1]])])[0]
    assert (merged["title"], merged["columns"]) == (full["title"], full["columns"]) and merged["rows"][0]["id"] == "split/part1of2"
    assert merged["verdict"] == "fail"
    with pytest.raises(MergeError, match="complete but has no part of section split"):
        merge_sections([_shard_item(1, 2, [parts[0]]), _shard_item(2, 2, [])])
    lost = merge_sections([_shard_item(1, 2, [parts[0]]), _shard_item(2, 2, [], complete=False)])[0]
    assert lost["verdict"] == "fail" and lost["rows"][-1]["id"] == "split/part2of2" and "did not finish" in lost["rows"][-1]["message"]
    twice = copy.deepcopy(parts[1])
    twice["part"]["blocks"][0][0] = parts[0]["part"]["blocks"][0][0]
    with pytest.raises(MergeError, match="is in parts 1/2 and 2/2"):
        merge_sections([_shard_item(1, 2, [parts[0]]), _shard_item(2, 2, [twice])])
    with pytest.raises(MergeError, match="holds part 1/2"):
        merge_sections([_shard_item(2, 2, [parts[0]])])
    short = copy.deepcopy(parts[0])
    short["rows"] = short["rows"][:-1]
    with pytest.raises(MergeError, match="its blocks hold"):
        merge_sections([_shard_item(1, 2, [short]), _shard_item(2, 2, [parts[1]])])
    with pytest.raises(MergeError, match="whole in"):
        merge_sections([_shard_item(1, 2, [dict(full)]), _shard_item(2, 2, [parts[1]])])


def _merged_parts(run, count: int) -> list[dict]:
    items = [_shard_item(i, count, [run(Part(i, count)).to_json()]) for i in range(1, count + 1)]
    return merge_sections(items)[0]


def test_the_moe_section_split_in_three_merges_into_the_unsplit_one():
    from moe_fq_parity.harness.sections.moe import section as moe

    full = moe.run("smoke", 11, "cpu").to_json()
    merged = _merged_parts(lambda part: moe.run("smoke", 11, "cpu", part=part), 3)
    assert len(full["rows"]) > 100 and merged == full


@pytest.mark.dist
def test_the_dist_matrix_split_in_two_merges_into_the_unsplit_one(tmp_path, monkeypatch):
    """One format, the smoke layouts: the save layouts are cut by world size (part 1 saves tp1ep1
    and tp1ep2, part 2 tp2ep1), each part loads its own checkpoints under every load layout, and
    part 1 (which saves the first layout) alone runs the controls on that layout's checkpoints."""
    from dataclasses import replace

    from moe_fq_parity.harness.sections.checkpoint import section as dist

    small = dist.plan_for("smoke", 11, "cpu")
    monkeypatch.setattr(dist, "plan_for", lambda suite, seed, device: replace(small, qf_ids=("nvfp4/static",)))
    monkeypatch.setattr(dist, "ENGINES", {"dcp": dist.ENGINES["dcp"]})  # the engines' blocks are keyed alike: one is enough here
    full = dist.run("smoke", 11, "cpu").to_json()
    parts = [dist.run("smoke", 11, "cpu", part=Part(i, 2)) for i in (1, 2)]
    assert [k for k, _ in parts[1].blocks] == [(0, 0, 0, 2), (0, 0, 1, 2), (0, 1, 0, 0, 2), (0, 1, 1, 0, 2), (0, 1, 2, 0, 2)]
    assert [k for k, _ in parts[0].blocks][:5] == [(0, 0, 0, 0), (0, 0, 0, 1), (0, 0, 1, 0), (0, 0, 1, 1), (0, 0, 2)]
    assert not {r.fields.get("save") for r in parts[1].rows} - {"tp2ep1"}  # part 2 saved and loaded only its layout's checkpoints
    merged = merge_sections([_shard_item(i, 2, [p.to_json()]) for i, p in zip((1, 2), parts)])[0]
    assert len(full["rows"]) > 20 and full["verdict"] == "pass" and merged == full
    assert "<workdir>" in " ".join(r["message"] for r in full["rows"])  # no temporary path: two runs give the same rows


def test_a_dist_load_layout_that_failed_is_reported_by_every_part(tmp_path, monkeypatch):
    """A load layout whose ranks fail gives a ``fail`` row in each part that loaded under it (ids
    prefixed with the part), keyed with that part's first save layout: merged, none is lost."""
    from dataclasses import replace

    from moe_fq_parity.harness.sections.checkpoint import matrix, section as dist
    from moe_fq_parity.harness.sections.checkpoint.launch import RankFailure

    real = matrix.run_layouts

    def failing_loads(calls, **kw):
        runs = real(calls, **kw)
        return [RankFailure("rank 1 exited with code 1") if c[0] is matrix.load_job and c[2].id == "tp2ep1" else r for c, r in zip(calls, runs)]

    monkeypatch.setattr(matrix, "run_layouts", failing_loads)
    plan = replace(dist.plan_for("smoke", 3, "cpu"), qf_ids=("nvfp4/static",), bad_inputs=False, negative_controls=False)
    parts = [dict(matrix.run_plan_blocks(plan, str(tmp_path / f"p{i}"), Part(i, 2))) for i in (1, 2)]
    assert [r.id for r in parts[0][(1, 2, 0, 0)]] == ["part1of2/load/tp2ep1"] and (1, 2, 0, 1) not in parts[0]
    assert [r.id for r in parts[1][(1, 2, 0, 2)]] == ["part2of2/load/tp2ep1"]
    assert all(r.verdict == "fail" and "rank 1 exited" in r.message for p in parts for r in p[next(k for k in p if k[:2] == (1, 2))])
    assert all(r.verdict == "pass" for p in parts for k, rows in p.items() if k[:2] != (1, 2) for r in rows)


def test_a_part_that_saved_nothing_keys_its_failed_loads_apart_from_the_others(tmp_path, monkeypatch):
    """Part 2 saves only tp2ep1; when that save fails too, its failed load row still carries its own
    save layout's key, so merging the parts finds no overlap."""
    from dataclasses import replace

    from moe_fq_parity.harness.sections.checkpoint import matrix, section as dist
    from moe_fq_parity.harness.sections.checkpoint.launch import RankFailure

    real = matrix.run_layouts

    def failing(calls, **kw):
        runs = real(calls, **kw)
        return [RankFailure("rank 0 exited with code 1") if c[2].id == "tp2ep1" else r for c, r in zip(calls, runs)]

    monkeypatch.setattr(matrix, "run_layouts", failing)
    plan = replace(dist.plan_for("smoke", 3, "cpu"), qf_ids=("nvfp4/static",), bad_inputs=False, negative_controls=False)
    parts = [dict(matrix.run_plan_blocks(plan, str(tmp_path / f"p{i}"), Part(i, 2))) for i in (1, 2)]
    assert [r.id for r in parts[1][(0, 0, 2)]] == ["save/tp2ep1"] and [r.id for r in parts[1][(1, 2, 0, 2)]] == ["part2of2/load/tp2ep1"]
    assert not set(parts[0]) & set(parts[1])
