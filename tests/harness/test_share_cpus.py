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


def test_a_shard_shares_the_cpus_with_its_siblings(tmp_path: Path) -> None:
    """``run --shard 1/2`` runs with its threads capped at half the CPUs, ``--share-cpus 1`` with all
    of them, ``--share-cpus 0`` is refused before anything runs (threads as the report records them)."""
    import json
    import os

    script = textwrap.dedent("""
        import sys, torch
        from moe_fq_parity.harness.run import cli
        torch.set_num_threads(64)
        sys.exit(cli.main(["run", "--suite", "smoke", "--backend", "reference", "--cases", "int8.*", "--checks", "forward",
                           "--no-sections", "--no-progress", "--out", sys.argv[1], *sys.argv[2:]]))
    """)
    env = {k: v for k, v in os.environ.items() if k != processes.SHARE_ENV}  # not this xdist worker's share

    def run(name: str, *extra: str) -> tuple[int, dict]:
        out = tmp_path / name
        res = subprocess.run([sys.executable, "-c", script, str(out), *extra], capture_output=True, text=True, timeout=300, env=env)
        meta = json.loads((out / "report.json").read_text())["meta"] if (out / "report.json").exists() else {}
        return res.returncode, meta.get("cpu", {})

    rc, cpu = run("half", "--shard", "1/2")
    assert rc == 0 and cpu["share"] == 2 and cpu["torch_threads"] == max(1, cpu["usable"] // 2), cpu
    rc, cpu = run("all", "--shard", "1/2", "--share-cpus", "1")
    assert rc == 0 and cpu["share"] == 1 and cpu["torch_threads"] == min(64, cpu["usable"]), cpu  # at most a thread per CPU
    rc, cpu = run("refused", "--share-cpus", "0")
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


def test_sections_run_one_after_the_other_when_the_share_is_small(monkeypatch) -> None:
    from moe_fq_parity.harness import sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {"a": "tests.harness.fake_sections:sleepy", "b": "tests.harness.fake_sections:sleepy"})
    monkeypatch.setattr(processes, "usable_cpus", lambda: 32)
    monkeypatch.setenv(processes.SHARE_ENV, "16")  # 2 CPUs of 32 for this process: below PARALLEL_MIN_CPUS
    out = run_sections("smoke", 1, "cpu", ["a", "b"])
    (a0, a1), (b0, b1) = ((s["rows"][0]["fields"]["start"], s["rows"][0]["fields"]["end"]) for s in out)
    assert a1 <= b0
    monkeypatch.setenv(processes.SHARE_ENV, "4")  # 8 CPUs: at once
    out = run_sections("smoke", 1, "cpu", ["a", "b"])
    (a0, a1), (b0, b1) = ((s["rows"][0]["fields"]["start"], s["rows"][0]["fields"]["end"]) for s in out)
    assert max(a0, b0) < min(a1, b1)


def test_report_meta_says_how_the_cpus_were_shared(tmp_path: Path) -> None:
    """``meta.cpu`` of a sharded run: the CPUs, the share count and the threads of the run."""
    import json

    env = {k: v for k, v in __import__("os").environ.items() if k != processes.SHARE_ENV}  # not this xdist worker's share
    res = subprocess.run([sys.executable, "-m", "moe_fq_parity.harness", "run", "--suite", "smoke", "--backend", "reference",
                          "--cases", "int8.*", "--checks", "forward", "--no-sections", "--no-progress", "--shard", "1/2",
                          "--out", str(tmp_path / "r")], capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-2000:]
    report = json.loads((tmp_path / "r" / "report.json").read_text())
    cpu = report["meta"]["cpu"]
    assert cpu["share"] == 2 and cpu["torch_threads"] == max(1, cpu["usable"] // 2), cpu
    assert "shared by 2 process(es)" in (tmp_path / "r" / "report.html").read_text()


def test_a_run_in_process_gives_the_threads_and_share_back(tmp_path: Path, monkeypatch, restore_threads) -> None:
    """``cli.main(["run", "--shard", ...])`` called in process (tests, notebooks) leaves this
    process's threads and share count as they were."""
    from moe_fq_parity.harness.run import cli

    monkeypatch.setenv(processes.SHARE_ENV, "1")
    torch.set_num_threads(max(2, processes.usable_cpus()))
    before = torch.get_num_threads()
    rc = cli.main(["run", "--suite", "smoke", "--backend", "reference", "--cases", "int8.*", "--checks", "forward", "--no-sections",
                   "--no-progress", "--shard", "1/2", "--share-cpus", "8", "--out", str(tmp_path / "r")])
    assert rc == 0
    assert torch.get_num_threads() == before and processes.share_count() == 1
