"""A section that declares it uses no GPU (``host_only``) starts beside a GPU run's cases, not after them."""

from __future__ import annotations

import time

import pytest


@pytest.mark.parametrize("device, declared, early", [("cuda", "1", True), ("cuda", "0", False), ("cpu", "1", False)])
def test_a_host_only_section_starts_before_its_turn_only_on_a_gpu_run(monkeypatch, tmp_path, device, declared, early):
    """The run's cases last until both section processes are prepared, and then as long as an early
    section needs to run (or 1 s more, where none may start early)."""
    from moe_fq_parity.harness import sections
    from moe_fq_parity.harness.sections.processes import start_sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_host_section:run" for k in "ab"})
    monkeypatch.setenv("FAKE_HOST_ONLY", declared)
    monkeypatch.setenv("FAKE_HOST_DIR", str(tmp_path))

    def wait_for(what: str, timeout_s: float = 120.0) -> None:
        end = time.time() + timeout_s
        while len(list(tmp_path.glob(f"{what}-*"))) < 2:
            assert time.time() < end, f"the section processes were not {what} within {timeout_s} s"
            time.sleep(0.05)

    with start_sections("smoke", 1, device, ["a", "b"], parallel=True) as started:
        wait_for("prepared")
        if early:
            wait_for("started", 30.0)
        else:
            time.sleep(1.0)  # a section that starts when prepared would have by now
        go = time.time()
        out = started.run()
    starts = [s["rows"][0]["fields"]["started"] for s in out]
    assert [s["verdict"] for s in out] == ["pass", "pass"]
    assert all((t < go) == early for t in starts), (starts, go)


def test_the_dist_section_is_host_only_on_cpu_and_with_fewer_than_two_gpus():
    import torch

    from moe_fq_parity.harness.sections.checkpoint.section import host_only

    assert host_only("cpu")
    assert host_only("cuda") == (torch.cuda.device_count() < 2)


@pytest.mark.parametrize("device, declared", [("cuda", "1"), ("cuda", "0")])
def test_a_section_beside_the_cases_leaves_them_half_of_the_cpus(monkeypatch, device, declared):
    from moe_fq_parity.harness import sections
    from moe_fq_parity.harness.core.processes import usable_cpus
    from moe_fq_parity.harness.sections.processes import run_sections

    monkeypatch.setattr(sections, "SECTION_RUNNERS", {k: "tests.harness.fake_host_section:siblings" for k in "ab"})
    monkeypatch.setenv("FAKE_HOST_ONLY", declared)
    out = run_sections("smoke", 1, device, ["a", "b"], parallel=True)
    reserved = max(1, usable_cpus() // 2) if declared == "1" else 0
    assert [s["rows"][0]["fields"]["siblings"] for s in out] == [1 + reserved] * 2
