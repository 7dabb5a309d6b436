"""A section that declares it uses no GPU (``host_only``) starts beside a GPU run's cases, not after them."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

HostRun = tuple[list[dict[str, Any]], float]
"""The two sections' JSON, and when the run's cases ended (``run()`` was called)."""


@pytest.fixture(scope="module")
def host_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, str], HostRun]:
    """``host_run(device, declared)``: two ``fake_meeting_sections.host`` sections started beside a
    run's cases, run once per argument pair for both tests of this module that ask for it.  The run's
    cases last until both section processes are prepared, and then as long as an early section needs
    to run (or 1 s more, where none may start early)."""
    from moe_fq_parity.harness import sections
    from moe_fq_parity.harness.sections.processes import start_sections

    runs: dict[tuple[str, str], HostRun] = {}

    def run(device: str, declared: str) -> HostRun:
        if (device, declared) in runs:
            return runs[device, declared]
        folder: Path = tmp_path_factory.mktemp(f"host-{device}-{declared}")
        early = device == "cuda" and declared == "1"

        def wait_for(what: str, timeout_s: float = 120.0) -> None:
            end = time.time() + timeout_s
            while len(list(folder.glob(f"{what}-*"))) < 2:
                assert time.time() < end, f"the section processes were not {what} within {timeout_s} s"
                time.sleep(0.05)

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_meeting_sections:host" for k in "ab"})
            mp.setenv("FAKE_HOST_ONLY", declared)
            mp.setenv("FAKE_HOST_DIR", str(folder))
            with start_sections("smoke", 1, device, ["a", "b"], parallel=True) as started:
                wait_for("prepared")
                if early:
                    wait_for("started", 30.0)
                else:
                    time.sleep(1.0)  # a section that starts when prepared would have by now
                go = time.time()
                out = started.run()
        runs[device, declared] = out, go
        return out, go

    return run


@pytest.mark.parametrize("device, declared, early", [("cuda", "1", True), ("cuda", "0", False), ("cpu", "1", False)])
def test_a_host_only_section_starts_before_its_turn_only_on_a_gpu_run(host_run, device, declared, early):
    out, go = host_run(device, declared)
    starts = [s["rows"][0]["fields"]["started"] for s in out]
    assert [s["verdict"] for s in out] == ["pass", "pass"]
    assert all((t < go) == early for t in starts), (starts, go)


def test_the_dist_section_is_host_only_on_cpu_and_with_fewer_than_two_gpus():
    import torch

    from moe_fq_parity.harness.sections.checkpoint.section import host_only

    assert host_only("cpu")
    assert host_only("cuda") == (torch.cuda.device_count() < 2)


@pytest.mark.parametrize("device, declared", [("cuda", "1"), ("cuda", "0")])
def test_a_section_beside_the_cases_leaves_them_half_of_the_cpus(host_run, device, declared):
    """The sections of ``host_run`` (the same two processes as the test above, where it ran first):
    each counts its sibling section as taken, and a host-only one half of the host's CPUs too."""
    from moe_fq_parity.harness.core.processes import usable_cpus

    out, _ = host_run(device, declared)
    reserved = max(1, usable_cpus() // 2) if declared == "1" else 0
    assert [s["rows"][0]["fields"]["siblings"] for s in out] == [1 + reserved] * 2
