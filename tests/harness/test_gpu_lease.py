"""One GPU test per GPU at a time under pytest-xdist (``harness.run.gpu_lease``), proven on CPU.

A throwaway project fakes CUDA devices in its conftest (device count, UUIDs, ``set_device``) and runs
GPU tests (marked ``slow``), GPU-host tests that take no lease and plain tests under xdist: every GPU
test runs on a leased device and no two GPU tests overlap on one device.  The same project without
the plugin does overlap (the control that shows the assertion can fail).

Each fake session costs a process per xdist worker plus the controller, each importing torch: the
tests that assert on the same project and options share one session (module-scoped fixtures), and
each session has the fewest workers its assertions need.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest

from moe_fq_parity.harness.run import gpu_lease

# Without FAKE_GPUS (the control, run without the plugin) nothing reads torch.cuda: torch is not imported there.
CONFTEST = """
import os
from types import SimpleNamespace

current = [0]
if "FAKE_GPUS" in os.environ:
    import torch

    COUNT = int(os.environ["FAKE_GPUS"])
    torch.cuda.is_available = lambda: True
    torch.cuda.device_count = lambda: COUNT
    torch.cuda.get_device_properties = lambda i: SimpleNamespace(uuid=f"fake-{i}")
    torch.cuda.set_device = lambda i: current.__setitem__(0, i)
"""

PLAIN_SLEEP_S = 0.5
"""How long a test of ``PLAIN_TESTS`` runs.  Overlaps are read off the logged intervals: the first tests
of the workers start together (xdist hands them out at once, after every worker has collected), so two
of them overlap whenever their start skew (process wake-ups, the first test's deferred plugin imports,
a few to some hundred ms on a loaded machine) is below this."""

PLAIN_ORDER = ["gpu", "gpu", "host", "gpu", "gpu", "gpu", "cpu", "gpu", "host", "cpu"]
"""``PLAIN_TESTS`` in collection order: 6 GPU tests (``slow``), 2 ``gpu(lease=False)`` tests, 2 plain
ones.  xdist's first hand-out with 3 workers (the plugin's scheduler, one test a scope: tests 0, 1, 2
to gw0, gw1, gw2; plain ``load``: chunks of 2, tests 0, 2, 4 first) starts two GPU tests and a host
test together."""

PLAIN_TESTS = f"""
import json, os, time

import pytest

from conftest import current

MARKS = {{"gpu": pytest.mark.slow, "host": pytest.mark.gpu(lease=False), "cpu": ()}}


@pytest.mark.parametrize("kind, i", [pytest.param(k, i, marks=MARKS[k]) for i, k in enumerate({PLAIN_ORDER!r})])
def test_fake(kind, i):
    start = time.time()
    time.sleep({PLAIN_SLEEP_S})
    with open(os.environ["LEASE_LOG"], "a") as f:
        f.write(json.dumps({{"kind": kind, "i": i, "device": current[0], "start": start, "end": time.time(),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER")}}) + "\\n")
"""


CASE_TESTS = """
import json, os, time

import pytest

from conftest import current


@pytest.mark.slow
@pytest.mark.parametrize("check", ["a", "b", "c"])
def test_case(parity_case, check, request):
    start = time.time()
    time.sleep(0.01)
    with open(os.environ["LEASE_LOG"], "a") as f:
        f.write(json.dumps({"kind": "case", "case": parity_case.id, "check": check, "nodeid": request.node.nodeid, "device": current[0],
                            "start": start, "end": time.time(), "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")


@pytest.mark.parametrize("i", range(8))
def test_cpu(i):
    time.sleep(0.05)
"""


def _run_project(tmp_path: Path, *extra: str, tests: str = PLAIN_TESTS, gpus: Optional[int] = 2, workers: int = 3) -> list[dict]:
    """Run ``tests`` in a fresh project under ``tmp_path`` with ``-n workers`` on ``gpus`` fake GPUs
    (``None``: torch left alone) and return the rows its tests logged."""
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_fake_gpu.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "lease.jsonl"
    env = dict(os.environ, LEASE_LOG=str(log), PARITY_GPU_LOCK_DIR=str(tmp_path / "locks"))
    env.pop("FAKE_GPUS", None)
    if gpus is not None:
        env["FAKE_GPUS"] = str(gpus)
    # Hypothesis is not used by the fake project: its plugin (about 0.6 s a process here) is left out
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q", "-n", str(workers), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("gpus", [1, 2])
def test_one_worker_per_gpu_and_a_case_stays_on_one_worker(tmp_path, gpus):
    """``-n G+1`` on G fake GPUs, no case sharing a GPU: the GPU tests run on G workers (one group per
    GPU, on that GPU; the one extra worker, which runs the plain tests, gets none), all checks of one
    case on one worker and GPU, the groups balanced by the cases' bytes."""
    from moe_fq_parity.cases import parse_case
    from moe_fq_parity.harness.core.memory import case_bytes

    from moe_fq_parity.harness.run.plugin_collect import gpu_case_groups
    from moe_fq_parity.harness.run.plugin_options import ParitySettings

    rows = _run_project(tmp_path, "--parity-suite", "smoke", "--parity-gpu-share-mib", "0", tests=CASE_TESTS, gpus=gpus, workers=gpus + 1)
    assert rows and all(r["kind"] == "case" for r in rows)
    settings = ParitySettings(report_dir=None, seed=0, suite="smoke", backends=(), mode="strict", timeout_s=None, hypothesis_profile="ci")
    groups = gpu_case_groups(settings, gpus)
    assert all(r["device"] == groups[r["case"]] for r in rows)  # each group on its own GPU
    by_case: dict[str, set] = {}
    for r in rows:
        by_case.setdefault(r["case"], set()).add((r["worker"], r["device"]))
    assert all(len(v) == 1 for v in by_case.values()), {k: v for k, v in by_case.items() if len(v) > 1}
    assert len({r["worker"] for r in rows}) == gpus
    assert _same_device_overlaps([dict(r, kind="gpu", i=k) for k, r in enumerate(rows)]) == []
    weight = {d: sum(case_bytes(parse_case(c)) for c, v in by_case.items() if next(iter(v))[1] == d) for d in range(gpus)}
    largest = max(case_bytes(parse_case(c)) for c in by_case)
    assert max(weight.values()) - min(weight.values()) <= largest, weight


def _overlaps(a: dict, b: dict) -> bool:
    return a["device"] == b["device"] and a["start"] < b["end"] and b["start"] < a["end"]


def test_small_cases_share_a_gpu_and_large_ones_hold_it_alone(tmp_path):
    """``-n 3`` on one fake GPU, the nightly's Ultra cases and some small ones: the small cases
    (``--parity-gpu-share-mib``, default 64) spread over the workers and their tests overlap on the
    GPU; a large case's test overlaps no other test; every case stays on one worker.  Three workers:
    one takes the large cases' GPU group, which leaves two for the small ones to overlap on."""
    from moe_fq_parity.cases import parse_case
    from moe_fq_parity.harness.run.plugin_collect import shares_gpu

    rows = _run_project(tmp_path, "--parity-suite", "nightly", "-k", "5120x8192 or (N8 and 65x129 and normal)", tests=CASE_TESTS, gpus=1, workers=3)
    small = [r for r in rows if shares_gpu(parse_case(r["case"]), 64)]
    large = [r for r in rows if not shares_gpu(parse_case(r["case"]), 64)]
    assert small and large
    by_case: dict[str, set] = {}
    for r in rows:
        by_case.setdefault(r["case"], set()).add(r["worker"])
    assert all(len(v) == 1 for v in by_case.values())
    assert len({r["worker"] for r in small}) > 1
    assert any(_overlaps(a, b) for a in small for b in small if a["worker"] != b["worker"])  # the sharing happened
    assert [(a["nodeid"], b["nodeid"]) for a in large for b in rows if a is not b and _overlaps(a, b)] == []


def test_an_explicit_other_dist_mode_is_kept(tmp_path):
    """``--dist worksteal`` is kept (no groups: cases spread over the workers); the leases alone
    still keep one GPU test per GPU.  Two workers on one fake GPU: both run case tests, so they
    contend for it."""
    rows = _run_project(tmp_path, "--parity-suite", "smoke", "--dist", "worksteal", "--parity-gpu-share-mib", "0", tests=CASE_TESTS, gpus=1,
                        workers=2)
    assert len({r["worker"] for r in rows}) > 1
    assert _same_device_overlaps([dict(r, kind="gpu", i=k) for k, r in enumerate(rows)]) == []


def test_case_id_of_nodeid():
    from moe_fq_parity.harness.run.plugin_collect import case_id_of_nodeid

    ids = {"int8.cuda/a-b/x/s0", "nvfp4.te/y/s1"}
    assert case_id_of_nodeid("t.py::test[int8.cuda/a-b/x/s0-forward]", ids) == "int8.cuda/a-b/x/s0"
    assert case_id_of_nodeid("t.py::test[triton-nvfp4.te/y/s1]", ids) == "nvfp4.te/y/s1"
    assert case_id_of_nodeid("t.py::test[triton-other]", ids) is None
    assert case_id_of_nodeid("t.py::test_plain", ids) is None


def _same_device_overlaps(rows: list[dict]) -> list[tuple[int, int]]:
    gpu = [r for r in rows if r["kind"] == "gpu"]
    return [(a["i"], b["i"]) for a in gpu for b in gpu
            if a["i"] < b["i"] and a["device"] == b["device"] and a["start"] < b["end"] and b["start"] < a["end"]]


@pytest.fixture(scope="module")
def plain_rows(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    """The rows of one run of ``PLAIN_TESTS`` with the plugin, ``-n 3`` on 2 fake GPUs: more workers
    than GPUs, so GPU tests wait for leases, and a third worker for a host test to run beside the two
    GPUs' tests."""
    return _run_project(tmp_path_factory.mktemp("plain"))


def test_gpu_tests_never_share_a_gpu_across_xdist_workers(plain_rows):
    """Every test ran, no two GPU tests overlapped on one of the 2 fake GPUs, each ran on a leased
    device (``set_device``), and the run was parallel."""
    rows = plain_rows
    assert len(rows) == len(PLAIN_ORDER)
    assert _same_device_overlaps(rows) == []
    assert {r["device"] for r in rows if r["kind"] == "gpu"} <= {0, 1}
    assert len({r["worker"] for r in rows}) > 1  # the run was parallel


def test_a_gpu_test_that_uses_no_gpu_takes_no_lease(plain_rows):
    """``gpu(lease=False)`` (a GPU host, but neither memory nor kernels on the GPU: a compile, an NVML
    query) runs beside the leased GPU tests: a host test runs at an instant when both fake GPUs run a
    GPU test, which a lease (exclusive or shared, on either GPU) would rule out."""
    rows = plain_rows
    host = [r for r in rows if r["kind"] == "host"]
    assert len(host) == PLAIN_ORDER.count("host") and _same_device_overlaps(rows) == []
    gpu = [r for r in rows if r["kind"] == "gpu"]
    assert any(max(h["start"], a["start"], b["start"]) < min(h["end"], a["end"], b["end"])
               for h in host for a in gpu for b in gpu if (a["device"], b["device"]) == (0, 1))


def test_without_the_lease_gpu_tests_overlap_on_one_gpu(tmp_path):
    """Control: the same project and ``-n 3`` without the plugin (no leases, no ``set_device``: every
    test logs device 0, and torch is not patched) has GPU tests that overlap."""
    rows = _run_project(tmp_path, "-p", "no:moe_fq_parity", gpus=None)
    assert _same_device_overlaps(rows), "control: without leases the fake GPU tests should overlap"


@pytest.fixture
def two_fake_gpus(monkeypatch, tmp_path):
    chosen = []
    monkeypatch.setattr(gpu_lease.torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(gpu_lease.torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"fake-{i}"))
    monkeypatch.setattr(gpu_lease.torch.cuda, "set_device", chosen.append)
    monkeypatch.setenv(gpu_lease.LOCK_DIR_ENV, str(tmp_path / "locks"))
    return chosen


def test_a_lease_takes_a_free_gpu_and_waits_when_none_is(two_fake_gpus):
    first = gpu_lease.acquire(prefer=0)
    second = gpu_lease.acquire(prefer=0)
    assert (first.devices, second.devices) == ((0,), (1,)) and two_fake_gpus == [0, 1]
    got = []
    waiter = threading.Thread(target=lambda: got.append(gpu_lease.acquire(prefer=1)))
    waiter.start()
    time.sleep(0.3)
    assert not got  # both GPUs are leased: the third waits
    first.release()
    waiter.join(timeout=10)
    assert got and got[0].devices == (0,) and got[0].waited_s >= 0.25
    second.release()
    got[0].release()
    everything = gpu_lease.acquire(all_devices=True)
    assert everything.devices == (0, 1)
    everything.release()
    everything.release()  # idempotent


def test_gpu_groups_balance_the_case_count_too():
    """The groups are the sharded run's partition (largest case first): bytes and case counts
    balanced on the nightly catalogue.  Cases taken in catalogue order put 10,260 of the 14,454
    slow parity tests in one of two groups."""
    from collections import Counter

    from moe_fq_parity.cases import parse_case
    from moe_fq_parity.harness.core.memory import case_bytes
    from moe_fq_parity.harness.run.plugin_collect import gpu_case_groups
    from moe_fq_parity.harness.run.plugin_options import ParitySettings

    settings = ParitySettings(report_dir=None, seed=0, suite=None, backends=(), mode="strict", timeout_s=None, hypothesis_profile="ci")
    for gpus in (2, 3, 4):
        groups = gpu_case_groups(settings, gpus)
        counts = Counter(groups.values())
        assert sorted(counts) == list(range(gpus)) and max(counts.values()) <= 1.1 * min(counts.values()), counts
        weight = Counter()
        for cid, g in groups.items():
            weight[g] += case_bytes(parse_case(cid))
        assert max(weight.values()) - min(weight.values()) <= max(case_bytes(parse_case(c)) for c in groups), weight


@pytest.mark.parametrize("all_devices", [False, True])
def test_shared_leases_run_together_and_an_exclusive_one_is_not_starved(monkeypatch, tmp_path, all_devices):
    """One fake GPU: two shared leases hold it at once; an exclusive lease (one GPU, or all of them)
    waits for both, and a shared lease asked for while it waits comes after it, not before."""
    monkeypatch.setattr(gpu_lease.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gpu_lease.torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"fake-{i}"))
    monkeypatch.setattr(gpu_lease.torch.cuda, "set_device", lambda i: None)
    monkeypatch.setenv(gpu_lease.LOCK_DIR_ENV, str(tmp_path / "locks"))
    first, second = gpu_lease.acquire(shared=True), gpu_lease.acquire(shared=True)
    order: list[str] = []
    got: dict[str, gpu_lease.Lease] = {}

    def take(name: str, **kw) -> None:
        got[name] = gpu_lease.acquire(**kw)
        order.append(name)

    exclusive = threading.Thread(target=take, args=("exclusive",), kwargs={"all_devices": all_devices})
    exclusive.start()
    time.sleep(0.3)
    late = threading.Thread(target=take, args=("late shared",), kwargs={"shared": True})
    late.start()
    time.sleep(0.3)
    assert order == []  # the exclusive lease waits for the two shared ones, the late one waits behind it
    first.release()
    second.release()
    exclusive.join(timeout=10)
    time.sleep(0.2)
    assert order == ["exclusive"]
    got["exclusive"].release()
    late.join(timeout=10)
    assert order == ["exclusive", "late shared"]
    got["late shared"].release()
