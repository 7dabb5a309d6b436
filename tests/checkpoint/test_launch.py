"""The launcher: hung, crashing and collective-missing ranks end in errors within their deadlines;
results come back intact (probes run once per test run, in ``conftest.gloo_run``)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.sections.checkpoint.launch import RankFailure, pack, run_layouts, unpack
from moe_fq_parity.harness.sections.checkpoint.layout import Layout

from .probes import PROBES, raise_job, stamp_job

pytestmark = pytest.mark.dist


def test_hung_rank_is_killed_at_the_deadline(gloo_run):
    o = gloo_run.probes["hang"]
    assert o["error"] == "RankTimeout", o
    limit = PROBES["hang"][1]["timeout_s"]
    assert limit <= o["elapsed_s"] < limit + 20, o


def test_raising_rank_fails_the_run_with_its_traceback(gloo_run):
    o = gloo_run.probes["raise"]
    assert o["error"] == "RankFailure", o
    assert "probe: rank 1 fails on purpose" in o["message"], o
    assert "rank 1" in o["message"], o


def test_missed_collective_times_out_instead_of_hanging(gloo_run):
    o = gloo_run.probes["missed_collective"]
    assert o["error"] == "RankFailure", o
    assert "Timed out" in o["message"], o
    assert o["elapsed_s"] < PROBES["missed_collective"][1]["pg_timeout_s"] + 20, o


def test_results_come_back_per_rank(gloo_run):
    o = gloo_run.probes["echo"]
    assert o["error"] is None, o
    ranks = o["result"]
    assert [r["rank"] for r in ranks] == [0, 1]
    assert [r["coords"] for r in ranks] == [[0, 0], [1, 0]]
    assert ranks[1]["nested"]["bf16"] == {"dtype": "torch.bfloat16", "shape": [2, 3], "values": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]}
    assert ranks[1]["nested"]["scalar"]["shape"] == [] and ranks[1]["nested"]["scalar"]["values"] == [1.0]
    assert ranks[0]["list"][1:] == ["text", None, 1.5] and ranks[0]["list"][0]["shape"] == [0]


def test_pack_unpack_is_bit_exact():
    nan = torch.tensor([float("nan"), -0.0, 1.0], dtype=torch.float32)
    obj = {"a": [torch.arange(5, dtype=torch.bfloat16), nan], "b": {"c": torch.tensor(3.0), "d": "x"}, "e": torch.zeros(2, 0)}
    back = unpack(pack(obj))
    assert torch.equal(back["a"][0].view(torch.int16), obj["a"][0].view(torch.int16))
    assert torch.equal(back["a"][1].view(torch.int32), nan.view(torch.int32))
    assert back["b"]["c"].shape == () and float(back["b"]["c"]) == 3.0 and back["b"]["d"] == "x"
    assert back["e"].shape == (2, 0)
    packed = pack(obj)
    assert sum(isinstance(v, torch.Tensor) for v in packed["buffers"].values()) == 2


def _spans(runs: list) -> list[tuple[float, float]]:
    return [(min(r["start"] for r in ranks), max(r["end"] for r in ranks)) for ranks in runs]


def test_layouts_overlap_when_their_ranks_fit_and_queue_when_they_do_not():
    """``run_layouts``: two 2-rank layouts with 4 slots run at once; with 2 slots one after the
    other; results in call order, each with all its ranks."""
    calls = [(stamp_job, 1.0, Layout(1, 2)), (stamp_job, 1.0, Layout(2, 1))]
    together = run_layouts(calls, slots=4)
    assert [[r["rank"] for r in ranks] for ranks in together] == [[0, 1], [0, 1]]
    (a0, a1), (b0, b1) = _spans(together)
    assert max(a0, b0) < min(a1, b1), f"4 slots: the layouts ran one after the other: {_spans(together)}"
    (a0, a1), (b0, b1) = _spans(run_layouts(calls, slots=2))
    assert a1 <= b0 or b1 <= a0, f"2 slots: the layouts overlapped: {[(a0, a1), (b0, b1)]}"


def test_a_failing_layout_gives_its_error_in_place_and_the_others_run():
    runs = run_layouts([(stamp_job, 0.0, Layout(1, 2)), (raise_job, None, Layout(1, 2)), (stamp_job, 0.0, Layout(1, 1))], slots=8)
    assert isinstance(runs[1], RankFailure) and "rank 1 fails on purpose" in str(runs[1]), runs[1]
    assert [len(runs[0]), len(runs[2])] == [2, 1]


_FROM_STDIN = """
import multiprocessing.forkserver as fs
import sys
sys.path.insert(0, {repo!r})
from moe_fq_parity.harness import sections
from moe_fq_parity.harness.sections.checkpoint.launch import run_ranks
from moe_fq_parity.harness.sections.checkpoint.layout import Layout
from moe_fq_parity.harness.sections.checkpoint.section import prepare
from moe_fq_parity.harness.sections.processes import run_sections
from tests.checkpoint.probes import stamp_job
prepare()
print("server", fs._forkserver._forkserver_pid)
ranks = run_ranks(stamp_job, 0.0, Layout(1, 2))
print("ranks", [r["rank"] for r in ranks])
print("parents", sorted({{r["ppid"] for r in ranks}}))
sections.SECTION_RUNNERS.update({{"a": "tests.harness.fake_sections:passing", "b": "tests.harness.fake_sections:passing"}})
print("sections", [s["verdict"] for s in run_sections("smoke", 1, "cpu", ["a", "b"], parallel=True)])
import __main__
print("main", __main__.__file__)
"""


@pytest.fixture(scope="module")
def from_stdin() -> subprocess.CompletedProcess:
    """``_FROM_STDIN`` run as ``python -`` once for the two tests below: one interpreter, torch import
    and fork server instead of two (~2 s of CPU).  The dist section's ``prepare()`` starts the fork
    server with ``<stdin>`` as the main file, the ranks start from that server (each rank's start
    carries the main file too) and the section processes after them."""
    repo = str(Path(__file__).resolve().parents[2])
    return subprocess.run([sys.executable, "-"], input=_FROM_STDIN.format(repo=repo), capture_output=True, text=True, timeout=300, cwd=repo)


def test_ranks_and_section_processes_start_from_a_script_read_from_stdin(from_stdin: subprocess.CompletedProcess) -> None:
    """``python - <<EOF`` names ``<stdin>`` as its main file; the rank and section processes used to
    die re-running it (``FileNotFoundError``), failing every dist row and every section."""
    proc = from_stdin
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "ranks [0, 1]" in proc.stdout and "sections ['pass', 'pass']" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    assert "main <stdin>" in proc.stdout  # restored afterwards


def test_the_sections_prepare_starts_the_fork_server_the_ranks_then_fork_from(from_stdin: subprocess.CompletedProcess) -> None:
    """The dist section's ``prepare()`` (run while a run's cases still run) starts the fork server;
    the ranks of the section's first layout are forked from that server, not from a new one."""
    proc = from_stdin
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines())
    assert lines["server"] != "None" and lines["parents"] == f"[{lines['server']}]", proc.stdout
