"""One GPU test per GPU at a time under pytest-xdist (``harness.run.gpu_lease``), proven on CPU.

A throwaway project fakes two CUDA devices in its conftest (device count, UUIDs, ``set_device``) and
runs GPU tests (marked ``slow``) and plain tests with ``-n 2``: every GPU test runs on a leased
device and no two GPU tests overlap on one device.  The same project without the plugin does overlap
(the control that shows the assertion can fail).
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

import pytest

from moe_fq_parity.harness.run import gpu_lease

CONFTEST = """
import os
from types import SimpleNamespace

import torch

COUNT = int(os.environ["FAKE_GPUS"])
current = [0]
torch.cuda.is_available = lambda: True
torch.cuda.device_count = lambda: COUNT
torch.cuda.get_device_properties = lambda i: SimpleNamespace(uuid=f"fake-{i}")
torch.cuda.set_device = lambda i: current.__setitem__(0, i)
"""

TESTS = """
import json, os, time

import pytest

from conftest import current


def _log(kind, i):
    start = time.time()
    time.sleep(0.5)
    with open(os.environ["LEASE_LOG"], "a") as f:
        f.write(json.dumps({"kind": kind, "i": i, "device": current[0], "start": start, "end": time.time(),
                            "worker": os.environ.get("PYTEST_XDIST_WORKER")}) + "\\n")


@pytest.mark.slow
@pytest.mark.parametrize("i", range(6))
def test_gpu(i):
    _log("gpu", i)


@pytest.mark.parametrize("i", range(6))
def test_cpu(i):
    _log("cpu", i)
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


def _run_project(tmp_path: Path, *extra: str, tests: str = TESTS, gpus: int = 2, workers: int = 2) -> list[dict]:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_fake_gpu.py").write_text(tests)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    log = tmp_path / "lease.jsonl"
    env = dict(os.environ, FAKE_GPUS=str(gpus), LEASE_LOG=str(log), PARITY_GPU_LOCK_DIR=str(tmp_path / "locks"))
    # Hypothesis is not used by the fake project: its plugin (about 0.6 s a process here) is left out
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q", "-n", str(workers), *extra],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.parametrize("gpus", [1, 2])
def test_one_worker_per_gpu_and_a_case_stays_on_one_worker(tmp_path, gpus):
    """``-n 3`` on G fake GPUs, no case sharing a GPU: the GPU tests run on G workers (one group per
    GPU, on that GPU), all checks of one case on one worker and GPU, the groups balanced by the cases'
    bytes."""
    from moe_fq_parity.cases import parse_case
    from moe_fq_parity.harness.core.memory import case_bytes

    from moe_fq_parity.harness.run.plugin_collect import gpu_case_groups
    from moe_fq_parity.harness.run.plugin_options import ParitySettings

    rows = _run_project(tmp_path, "--parity-suite", "smoke", "--parity-gpu-share-mib", "0", tests=CASE_TESTS, gpus=gpus, workers=3)
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
    """``-n 4`` on one fake GPU, the nightly's Ultra cases and some small ones: the small cases
    (``--parity-gpu-share-mib``, default 64) spread over the workers and their tests overlap on the
    GPU; a large case's test overlaps no other test; every case stays on one worker."""
    from moe_fq_parity.cases import parse_case
    from moe_fq_parity.harness.run.plugin_collect import shares_gpu

    rows = _run_project(tmp_path, "--parity-suite", "nightly", "-k", "5120x8192 or (N8 and 65x129 and normal)", tests=CASE_TESTS, gpus=1, workers=4)
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
    still keep one GPU test per GPU."""
    rows = _run_project(tmp_path, "--parity-suite", "smoke", "--dist", "worksteal", "--parity-gpu-share-mib", "0", tests=CASE_TESTS, gpus=1,
                        workers=3)
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


def test_gpu_tests_never_share_a_gpu_across_xdist_workers(tmp_path):
    rows = _run_project(tmp_path)
    assert len(rows) == 12
    assert _same_device_overlaps(rows) == []
    assert {r["device"] for r in rows if r["kind"] == "gpu"} <= {0, 1}
    assert len({r["worker"] for r in rows}) > 1  # the run was parallel


HOST_TESTS = TESTS.replace("def test_cpu(i):", "@pytest.mark.gpu(lease=False)\ndef test_host(i):").replace('_log("cpu", i)', '_log("host", i)')


def test_a_gpu_test_that_uses_no_gpu_takes_no_lease(tmp_path):
    """``gpu(lease=False)`` (a GPU host, but neither memory nor kernels on the GPU: a compile, an NVML
    query) runs beside the leased GPU tests; a lease would make it overlap none of them."""
    rows = _run_project(tmp_path, tests=HOST_TESTS, gpus=1, workers=3)
    host = [r for r in rows if r["kind"] == "host"]
    assert len(host) == 6 and _same_device_overlaps(rows) == []
    assert any(a["start"] < b["end"] and b["start"] < a["end"] for a in host for b in rows if b["kind"] == "gpu")


def test_without_the_lease_gpu_tests_overlap_on_one_gpu(tmp_path):
    rows = _run_project(tmp_path, "-p", "no:moe_fq_parity")
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
