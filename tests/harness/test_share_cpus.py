"""Harness processes that run beside each other split the host's CPUs for PyTorch's threads
(``harness.core.processes.share_cpus``): xdist workers, shards, section processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.core import processes
from moe_fq_parity.harness.sections.processes import run_sections

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def restore_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_share_caps_threads_at_the_share_and_never_raises_them(monkeypatch, restore_threads) -> None:
    monkeypatch.setattr(processes, "usable_cpus", lambda: 32)
    monkeypatch.delenv(processes.SHARE_ENV, raising=False)
    assert processes.cpu_share() == 32
    torch.set_num_threads(32)
    assert processes.share_cpus(2) == 16 == torch.get_num_threads()
    assert processes.cpu_share() == 16  # what the processes this one starts may keep busy
    assert processes.share_cpus(1) == 16  # a lower setting (the user's, or an earlier share) stays
    assert processes.share_cpus(64) == 1
    torch.set_num_threads(3)
    assert processes.share_cpus(4) == 3


def test_xdist_workers_each_take_their_share(tmp_path: Path) -> None:
    pytest.importorskip("xdist")
    (tmp_path / "test_threads.py").write_text(textwrap.dedent("""
        import torch
        from moe_fq_parity.harness.core.processes import usable_cpus

        def test_threads():
            assert torch.get_num_threads() == max(1, usable_cpus() // 2), (torch.get_num_threads(), usable_cpus())
    """))
    env_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", str(tmp_path / "test_threads.py")]
    res = subprocess.run(env_cmd, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "64"})
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]


RUN = ["run", "--suite", "smoke", "--backend", "reference", "--cases", "int8.*", "--checks", "forward", "--no-sections", "--no-progress",
       "--in-process"]
"""The smallest run that records ``meta.cpu``; its cases run in this process (``--in-process``): what is checked is the
threads of the process that writes the report, and a case worker process would only add a PyTorch import."""


def _run_with_64_threads(out: Path, *extra: str) -> tuple[int, dict]:
    """``cli.main(RUN + extra)`` called as a fresh ``python -c`` process would: 64 PyTorch threads (more than
    any share of this host's CPUs), no share count inherited (not this xdist worker's); this process's
    threads and environment come back afterwards.  Returns the exit status and the report's ``meta.cpu``."""
    import json

    from moe_fq_parity.harness.run import cli

    before = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(processes.SHARE_ENV, raising=False)
        torch.set_num_threads(64)
        try:
            rc = cli.main([*RUN, "--out", str(out), *extra])
        finally:
            torch.set_num_threads(before)
    meta = json.loads((out / "report.json").read_text())["meta"] if (out / "report.json").exists() else {}
    return rc, meta.get("cpu", {})


@pytest.fixture(scope="module")
def half_shard(tmp_path_factory: pytest.TempPathFactory) -> tuple[int, dict, Path]:
    """``run --shard 1/2`` once for the two tests that read it: exit status, ``meta.cpu`` and the output folder."""
    out = tmp_path_factory.mktemp("share") / "half"
    return (*_run_with_64_threads(out, "--shard", "1/2"), out)


def test_a_shard_shares_the_cpus_with_its_siblings(tmp_path: Path, half_shard: tuple[int, dict, Path]) -> None:
    """``run --shard 1/2`` runs with its threads capped at half the CPUs, ``--share-cpus 1`` with all
    of them, ``--share-cpus 0`` is refused before anything runs (threads as the report records them)."""
    rc, cpu, _ = half_shard
    assert rc == 0 and cpu["share"] == 2 and cpu["torch_threads"] == max(1, cpu["usable"] // 2), cpu
    rc, cpu = _run_with_64_threads(tmp_path / "all", "--shard", "1/2", "--share-cpus", "1")
    assert rc == 0 and cpu["share"] == 1 and cpu["torch_threads"] == min(64, cpu["usable"]), cpu  # at most a thread per CPU
    rc, cpu = _run_with_64_threads(tmp_path / "refused", "--share-cpus", "0")
    assert rc == 2 and cpu == {}


def test_started_processes_inherit_the_share(monkeypatch) -> None:
    """A section process or a dist rank started by a shard sees the shard's share of the CPUs."""
    monkeypatch.setenv(processes.SHARE_ENV, "2")
    out = subprocess.run([sys.executable, "-c", "from moe_fq_parity.harness.core.processes import cpu_share, usable_cpus; "
                          "print(cpu_share(), usable_cpus())"], capture_output=True, text=True, timeout=120)
    share, cpus = map(int, out.stdout.split())
    assert share == max(1, cpus // 2)


def test_a_process_leaves_a_cpu_to_each_sibling_of_the_run(monkeypatch) -> None:
    monkeypatch.setattr(processes, "usable_cpus", lambda: 32)
    monkeypatch.setenv(processes.SHARE_ENV, "2")
    monkeypatch.setenv(processes.SIBLINGS_ENV, "3")
    assert processes.cpu_share() == 13
    monkeypatch.setenv(processes.SIBLINGS_ENV, "40")
    assert processes.cpu_share() == 1


def test_section_processes_running_at_once_leave_each_other_a_cpu(monkeypatch) -> None:
    """Each of three sections at once sees this process's share less two CPUs (one per other
    section): the dist section schedules its ranks within that."""
    from moe_fq_parity.harness import sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_sections:cpus" for k in "abc"})
    monkeypatch.delenv(processes.SIBLINGS_ENV, raising=False)
    out = run_sections("smoke", 1, "cpu", list("abc"), parallel=True)
    assert [s["rows"][0]["fields"]["cpu_share"] for s in out] == [max(1, processes.cpu_share() - 2)] * 3


def test_sections_run_one_after_the_other_when_the_share_is_small(monkeypatch, tmp_path: Path) -> None:
    """With 2 CPUs for this process the sections run one after the other, with 8 at once.  The fake
    sections wait for each other (``fake_meeting_sections.meet``): one after the other, the first
    waits out its 2 s (the window in which a second section started at once would have met it) and
    ends before the second starts; at once, they overlap and end when both started (a 60 s wait is
    only spent where they do not run at once)."""
    from moe_fq_parity.harness import sections

    from . import fake_meeting_sections as meeting

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"a": "tests.harness.fake_meeting_sections:meet", "b": "tests.harness.fake_meeting_sections:meet"})
    monkeypatch.setattr(processes, "usable_cpus", lambda: 32)
    monkeypatch.setenv(processes.SHARE_ENV, "16")  # 2 CPUs of 32 for this process: below PARALLEL_MIN_CPUS
    (tmp_path / "serial").mkdir()
    monkeypatch.setenv(meeting.DIR_ENV, str(tmp_path / "serial"))
    monkeypatch.setenv(meeting.WAIT_ENV, "2")
    out = run_sections("smoke", 1, "cpu", ["a", "b"])
    (a0, a1), (b0, b1) = ((s["rows"][0]["fields"]["start"], s["rows"][0]["fields"]["end"]) for s in out)
    assert a1 <= b0
    monkeypatch.setenv(processes.SHARE_ENV, "4")  # 8 CPUs: at once
    (tmp_path / "parallel").mkdir()
    monkeypatch.setenv(meeting.DIR_ENV, str(tmp_path / "parallel"))
    monkeypatch.setenv(meeting.WAIT_ENV, "60")
    out = run_sections("smoke", 1, "cpu", ["a", "b"])
    (a0, a1), (b0, b1) = ((s["rows"][0]["fields"]["start"], s["rows"][0]["fields"]["end"]) for s in out)
    assert max(a0, b0) < min(a1, b1)


def test_report_meta_says_how_the_cpus_were_shared(half_shard: tuple[int, dict, Path]) -> None:
    """``meta.cpu`` of a sharded run: the CPUs, the share count and the threads of the run, also in the HTML report."""
    rc, cpu, out = half_shard
    assert rc == 0
    assert cpu["share"] == 2 and cpu["torch_threads"] == max(1, cpu["usable"] // 2), cpu
    assert "shared by 2 process(es)" in (out / "report.html").read_text()


def test_a_run_in_process_gives_the_threads_and_share_back(tmp_path: Path, monkeypatch, restore_threads) -> None:
    """``cli.main(["run", "--shard", ...])`` called in process (tests, notebooks) leaves this
    process's threads and share count as they were."""
    from moe_fq_parity.harness.run import cli

    monkeypatch.setenv(processes.SHARE_ENV, "1")
    torch.set_num_threads(max(2, processes.usable_cpus()))
    before = torch.get_num_threads()
    rc = cli.main([*RUN, "--shard", "1/2", "--share-cpus", "8", "--out", str(tmp_path / "r")])
    assert rc == 0
    assert torch.get_num_threads() == before and processes.share_count() == 1
