"""Several case workers in one run (``run --workers``, ``harness.run.runner``), and their GPU leases
(``harness.run.gpu_lease.CaseTurns``), proven on CPU.

The records of a run with several workers are those of a run with one, in case order; a worker that
crashes fails its own case only (SIGTERM with hanging workers: ``test_backend_isolation``); on a GPU
small cases share it, and a large case or a timing holds it alone (fake GPUs, as in
``test_gpu_lease``).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from moe_fq_parity.cases import parse_case
from moe_fq_parity.harness.run import gpu_lease
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.run.runner import RunConfig, _workers, auto_workers, run_share_mib

HOSTILE = "tests.harness.hostile_backends"
INT4 = "int4.cuda/per_expert/stacked/N4/16x48/special@design/s0"
"""The hostile backends misbehave on INT4 calls only."""
INT8 = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"
BIG = "fp8_e4m3.cuda/per_expert/list/N8/256x512/normal/s0"
"""Slower than the cases after it: with several workers they finish before it does."""
SMALL = ("nvfp4.te/per_expert/stacked/N4/16x64/normal/s0", "int8.cuda/per_channel/list/N4/8x40/zeros/s0", INT8)


def _run(out: Path, *args: str) -> tuple[int, dict]:
    rc = main(["run", "--no-progress", "--no-sections", "--no-perf", "--out", str(out), *args])
    return rc, json.loads((out / "report.json").read_text())


def _strip(r: dict) -> dict:
    return {k: v for k, v in r.items() if k not in ("duration_s", "peak_bytes")}


def test_several_workers_give_the_records_of_one_in_case_order(tmp_path):
    cases = [a for c in (BIG, *SMALL) for a in ("--case", c)]
    _, one = _run(tmp_path / "one", *cases, "--backend", "reference", "--backend", "eager-loop", "--workers", "1")
    _, three = _run(tmp_path / "three", *cases, "--backend", "reference", "--backend", "eager-loop", "--workers", "3")
    assert (one["meta"]["workers"], three["meta"]["workers"]) == (1, 3)
    assert [r["case_id"] for r in three["records"]][::12] == [BIG, *SMALL]
    assert [_strip(r) for r in three["records"]] == [_strip(r) for r in one["records"]]
    assert len(three["records"]) == 48 and three["complete"]


def test_a_crash_in_one_worker_fails_its_case_only(tmp_path):
    rc, report = _run(tmp_path / "crash", "--case", INT4, "--case", INT8, "--case", SMALL[0], "--backend", f"{HOSTILE}:Segfaults",
                      "--backend", "reference", "--checks", "forward", "--workers", "2")
    assert rc == 1 and report["complete"] and report["meta"]["workers"] == 2
    by = {(r["case_id"], r["backend"].split(":")[-1]): r for r in report["records"]}
    assert by[(INT4, "Segfaults")]["outcome"] == "crash" and "SIGSEGV" in by[(INT4, "Segfaults")]["message"]
    assert sorted(k for k, r in by.items() if r["verdict"] != "pass") == [(INT4, "Segfaults")]
    assert len(by) == 6 and report["meta"]["workers_started"] == 3  # two workers, one restarted after the crash


def test_worker_counts(capsys, monkeypatch):
    cfg = RunConfig(suite="smoke", cases=(), backends=(), checks=("forward",), out_dir=Path("x"), seed=0, workers=None)
    assert auto_workers(torch.device("cuda"), False) == 1 and auto_workers(torch.device("cpu"), False) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    assert auto_workers(torch.device("cuda"), True) == 4 and _workers(cfg, torch.device("cuda")) == 4
    assert auto_workers(torch.device("cpu"), True) == 4 and auto_workers(torch.device("cpu"), True, perf=True) == 1
    monkeypatch.setattr(torch, "get_num_threads", lambda: 6)
    assert auto_workers(torch.device("cuda"), True) == 1 and auto_workers(torch.device("cpu"), True) == 4
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    assert auto_workers(torch.device("cpu"), True) == 2
    monkeypatch.setenv(gpu_lease.HELD_ENV, "1")  # a run inside a GPU test: its lease is held by the parent
    assert _workers(RunConfig(**{**cfg.__dict__, "workers": 3}), torch.device("cuda")) == 1
    assert "holds a lease on the GPU already" in capsys.readouterr().err
    assert _workers(RunConfig(**{**cfg.__dict__, "workers": 3}), torch.device("cpu")) == 3
    assert _workers(RunConfig(**{**cfg.__dict__, "workers": 3, "isolate": False}), torch.device("cpu")) == 1
    assert "--in-process runs the cases in this process" in capsys.readouterr().err
    with pytest.raises(ValueError, match="--workers"):
        RunConfig(**{**cfg.__dict__, "workers": 0})


def test_the_cases_workers_share_a_gpu_are_bounded_by_its_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=80 << 30))
    assert run_share_mib(torch.device("cuda"), 4) == 1024  # 80 GiB: the cap
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(total_memory=24 << 30))
    assert run_share_mib(torch.device("cuda"), 4) == 384 and run_share_mib(torch.device("cuda"), 2) == 768


@pytest.mark.parametrize("bad", ["0", "-1", "two"])
def test_a_bad_worker_count_is_a_usage_error(tmp_path, capsys, bad):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--workers", bad, "--out", str(tmp_path / "bad")])
    assert exc.value.code == 2 and "--workers" in capsys.readouterr().err and not (tmp_path / "bad").exists()


# --- the leases of case workers on one (fake) GPU ---------------------------------------------------

@pytest.fixture
def one_fake_gpu(monkeypatch, tmp_path):
    monkeypatch.setattr(gpu_lease.torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(gpu_lease.torch.cuda, "get_device_properties", lambda i: SimpleNamespace(uuid=f"fake-{i}"))
    monkeypatch.setattr(gpu_lease.torch.cuda, "set_device", lambda i: None)
    monkeypatch.setenv(gpu_lease.LOCK_DIR_ENV, str(tmp_path / "locks"))


def _later(fn) -> tuple[threading.Thread, list]:
    done: list = []
    t = threading.Thread(target=lambda: (fn(), done.append(time.monotonic())))
    t.start()
    return t, done


@pytest.mark.parametrize("index", [0, None], ids=["gpu", "host"])
def test_small_cases_share_the_gpu_and_a_large_case_or_a_timing_holds_it_alone(one_fake_gpu, index):
    """On a (fake) GPU, and with ``index`` None on the host's memory (case workers on a CPU device)."""
    small, large = parse_case(SMALL[0]), parse_case("int8.cuda/per_expert/stacked/N32/5120x8192/normal/s0")
    assert gpu_lease.shares_gpu(small) and not gpu_lease.shares_gpu(large)
    a, b, c = (gpu_lease.CaseTurns(index, 64) for _ in range(3))
    a.start(small)
    b.start(small)  # held at once: this returns
    t, large_done = _later(lambda: c.start(large))
    time.sleep(0.3)
    assert not large_done  # waits for both small cases
    a.end()
    time.sleep(0.3)
    assert not large_done
    b.end()
    t.join(10)
    assert large_done
    t, small_done = _later(lambda: a.start(small))
    time.sleep(0.3)
    assert not small_done  # the large case holds the GPU alone
    c.end()
    t.join(10)
    assert small_done
    a.chunk()
    b.start(small)
    b.chunk()
    a.chunk()  # chunks of small cases share the GPU
    timer = a.alone()
    t, timing = _later(timer.__enter__)
    time.sleep(0.3)
    assert not timing  # a timing waits for the other small case's chunk
    t2, other = _later(b.chunk)  # b's next chunk: its lease given back, a new one waits behind the timing
    t.join(10)
    assert timing
    time.sleep(0.3)
    assert not other  # nothing shares the GPU while a times
    timer.__exit__(None, None, None)  # a shares it again
    t2.join(10)
    assert other
    a.end()
    b.end()
    c.start(large)
    t, small_case = _later(lambda: a.start(small))
    with c.alone():  # a large case holds the GPU alone already: its timing changes nothing
        time.sleep(0.2)
    assert not small_case
    c.end()
    t.join(10)
    assert small_case
    a.end()
    assert not gpu_lease.held_here()


def test_the_perf_check_times_inside_alone_and_checks_outside_it():
    """``CheckContext.alone`` holds the GPU alone around the timed calls only: the forward check's
    call of the same chunk shares it."""
    from contextlib import contextmanager

    from moe_fq_parity.cases import make_inputs
    from moe_fq_parity.harness.backends import load
    from moe_fq_parity.harness.checks import CheckContext, run_case_checks

    backend = load("reference")
    inside, calls = [False], []
    real = {name: getattr(backend.obj, name) for name in ("fake_quant", "fake_quant_stacked") if hasattr(backend.obj, name)}

    def logs(name):
        def logged(*args, **kwargs):
            calls.append(inside[0])
            return real[name](*args, **kwargs)
        return logged

    @contextmanager
    def alone():
        inside[0] = True
        yield
        inside[0] = False

    for name in real:
        setattr(backend.obj, name, logs(name))
    try:
        ctx = CheckContext(backend, make_inputs(parse_case(INT8), 0), 0, alone=alone)
        forward, perf = run_case_checks(ctx, ("forward", "perf"))
    finally:
        for name, fn in real.items():
            setattr(backend.obj, name, fn)
    assert (forward.verdict, perf.verdict) == ("pass", "pass"), (forward.message, perf.message)
    assert calls[0] is False and len(calls) > 5 and all(calls[1:]), calls
