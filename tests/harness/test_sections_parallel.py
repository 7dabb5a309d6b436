"""Report sections at once, each in a process of its own (``run_sections(parallel=True)``)."""

from __future__ import annotations

from moe_fq_parity.harness.sections.processes import run_sections, start_sections


MEET = "tests.harness.fake_meeting_sections:meet"


def test_sections_run_at_once_in_their_own_processes_and_come_back_in_order(monkeypatch, tmp_path):
    """Four sections at once: verdicts in the order chosen, one progress call each, a crash is a fail
    row.  ``a`` and ``b`` wait for each other (``fake_meeting_sections.meet``): they overlap and end as
    soon as both started; run one after the other, the first would wait out its 60 s and end before
    the second started."""
    from moe_fq_parity.harness import sections

    from . import fake_meeting_sections as meeting

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {
        "a": MEET, "bad": "tests.harness.fake_sections:failing", "b": MEET, "crash": "tests.harness.fake_sections:dies",
    })
    monkeypatch.setenv(meeting.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(meeting.WAIT_ENV, "60")
    finished: list[str] = []
    out = run_sections("smoke", 1, "cpu", ["a", "bad", "b", "crash"], on_done=lambda done, last: finished.append(last["title"]), parallel=True)
    assert [s["verdict"] for s in out] == ["pass", "fail", "pass", "fail"]  # the order chosen, whatever finished first
    assert sorted(finished) == sorted(s["title"] for s in out)  # one progress call per section
    (a0, a1), (b0, b1) = ((s["rows"][0]["fields"]["start"], s["rows"][0]["fields"]["end"]) for s in (out[0], out[2]))
    assert max(a0, b0) < min(a1, b1), "the two meeting sections ran one after the other"
    assert "exited with 3 before reporting" in out[3]["rows"][0]["message"]
    assert all(s["seconds"] >= 0 for s in out)


def test_serial_sections_run_one_after_the_other(monkeypatch, tmp_path):
    """``a`` and ``b`` wait up to 2 s for each other (``fake_meeting_sections.meet``): run at once they
    would meet and overlap; one after the other, ``a`` waits out the 2 s and ends before ``b`` starts."""
    from moe_fq_parity.harness import sections

    from . import fake_meeting_sections as meeting

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"a": MEET, "b": MEET})
    monkeypatch.setenv(meeting.DIR_ENV, str(tmp_path))
    monkeypatch.setenv(meeting.WAIT_ENV, "2")
    out = run_sections("smoke", 1, "cpu", ["a", "b"], parallel=False)
    (a0, a1), (b0, b1) = ((s["rows"][0]["fields"]["start"], s["rows"][0]["fields"]["end"]) for s in out)
    assert a1 <= b0


def test_section_processes_share_the_parents_threads(monkeypatch):
    """Four sections at once each get a quarter of this process's PyTorch threads (at least one)."""
    import torch

    from moe_fq_parity.harness import sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_sections:threads" for k in "abcd"})
    before = torch.get_num_threads()
    torch.set_num_threads(4)  # a share of 1: a child on its own would start a thread per CPU
    try:
        out = run_sections("smoke", 1, "cpu", list("abcd"), parallel=True)
    finally:
        torch.set_num_threads(before)
    assert [s["rows"][0]["fields"]["threads"] for s in out] == [1, 1, 1, 1]


def test_a_shard_gives_its_part_to_split_sections_in_their_processes_and_not_to_the_others(monkeypatch):
    from moe_fq_parity.harness import sections
    from moe_fq_parity.harness.sections import Part

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"split": "tests.harness.fake_sections:split", "ok": "tests.harness.fake_sections:passing",
                                                      "crash": "tests.harness.fake_sections:dies"})
    monkeypatch.setattr(sections, "SPLIT_SECTIONS", frozenset({"split", "crash"}))
    for parallel in (True, False):
        names = ["split", "ok", "crash"] if parallel else ["split", "ok"]
        out = run_sections("smoke", 1, "cpu", names, parallel=parallel, part=Part(2, 3))
        assert out[0]["part"] == {"index": 2, "count": 3, "blocks": [[[0], 1], [[1, 1], 2]]} and "part" not in out[1]
        if parallel:  # a part whose process died is one fail row of that part, mergeable with the others
            assert out[2]["part"]["index"] == 2 and out[2]["rows"][0]["id"] == "crash/part2of3" and out[2]["verdict"] == "fail"


def test_sections_started_ahead_prepare_while_the_caller_goes_on(monkeypatch, tmp_path):
    """``start_sections`` starts each section's process at once: it runs the runner module's
    ``prepare()`` while the caller (a run's cases) goes on; ``run()`` then only runs the sections,
    and their ``seconds`` leave the preparation out.  No section process outlives the ``with``."""
    import glob
    import time

    from moe_fq_parity.harness import sections

    from . import fake_prepared_section as fake

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_prepared_section:run" for k in "ab"})
    monkeypatch.setenv(fake.MARKER_ENV, str(tmp_path / "prepared"))
    with start_sections("smoke", 1, "cpu", ["a", "b"], parallel=True) as started:
        procs = [p for _, p, _ in started._procs.values()]
        deadline = time.time() + 60
        while len(glob.glob(str(tmp_path / "prepared.*"))) < 2:  # the caller's own work; run() not called yet
            assert time.time() < deadline, "the sections did not prepare before run()"
            time.sleep(0.1)
        go = time.time()
        out = started.run()
    assert not any(p.is_alive() for p in procs)
    for s in out:
        row = s["rows"][0]["fields"]
        assert row["prepared_here"] and row["prepared_end"] < go <= row["started"], row
        assert s["seconds"] < fake.PREPARE_S, s["seconds"]


def test_sections_closed_before_their_turn_end_without_running(monkeypatch, tmp_path):
    """A run cut off during its cases closes its started sections: their processes end and no
    section runs."""
    from moe_fq_parity.harness import sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_sections:sleepy" for k in "ab"})
    started = start_sections("smoke", 1, "cpu", ["a", "b"], parallel=True)
    procs = [p for _, p, _ in started._procs.values()]
    assert len(procs) == 2 and all(p.is_alive() for p in procs)
    started.close()
    assert not any(p.is_alive() for p in procs)


def test_the_caller_leaves_a_thread_per_preparing_section_and_gets_them_back(monkeypatch):
    """While started sections prepare, the caller (a run's cases) runs with one PyTorch thread fewer
    per section; ``run()`` and ``close()`` give them back.  Each section still gets its share of the
    caller's threads as they were."""
    import torch

    from moe_fq_parity.harness import sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_sections:threads" for k in "ab"})
    before = torch.get_num_threads()
    torch.set_num_threads(8)
    try:
        with start_sections("smoke", 1, "cpu", ["a", "b"], parallel=True) as started:
            assert torch.get_num_threads() == 6
            out = started.run()
            assert torch.get_num_threads() == 8
        assert [s["rows"][0]["fields"]["threads"] for s in out] == [4, 4]
        with start_sections("smoke", 1, "cpu", ["a", "b"], parallel=True):
            assert torch.get_num_threads() == 6
        assert torch.get_num_threads() == 8
    finally:
        torch.set_num_threads(before)


def test_an_unsharded_run_splits_a_section_over_processes_and_joins_its_parts(monkeypatch):
    """``SECTION_PROCESSES``: a split section runs as parts in processes of their own (one per 4 CPUs)
    and comes back as the unsplit section; a part whose process dies gives its failing row."""
    from moe_fq_parity.harness import sections
    from moe_fq_parity.harness.sections import processes

    from .fake_sections import split

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"split": "tests.harness.fake_sections:split", "ok": "tests.harness.fake_sections:passing",
                                                      "crash": "tests.harness.fake_sections:dies"})
    monkeypatch.setattr(sections, "SPLIT_SECTIONS", frozenset({"split", "crash"}))
    monkeypatch.setattr(sections, "SECTION_PROCESSES", {"split": 2, "crash": 2})
    monkeypatch.setattr(processes, "cpu_share", lambda: 4)
    assert processes.section_processes("split", None) == 1  # 4 CPUs: one process per section
    monkeypatch.setattr(processes, "cpu_share", lambda: 8)
    assert processes.section_processes("ok", None) == 1 and processes.section_processes("split", sections.Part(1, 2)) == 1
    with start_sections("smoke", 1, "cpu", ["split", "ok", "crash"], parallel=True) as started:
        assert started.splits == {"split": 2, "crash": 2}
        out = started.run()
    assert [s["name"] for s in out] == ["split", "ok", "crash"]
    assert {k: v for k, v in out[0].items() if k != "seconds"} == split("smoke", 1, "cpu").to_json()
    assert out[2]["verdict"] == "fail" and [r["id"] for r in out[2]["rows"]] == ["crash/part1of2", "crash/part2of2"]
