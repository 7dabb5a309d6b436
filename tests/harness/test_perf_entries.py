"""The perf check's timed quantities for the Triton backend (the ones ``benchmarks.bench`` reports) and
the report's bandwidth picture (% of copy vs bytes moved, one line per expert shape)."""

from __future__ import annotations

import base64

import pytest
import torch

from moe_fq_parity import reference

pytest.importorskip("triton", reason="pip install -e '.[triton]'")


def test_triton_backend_timed_entries_compute_the_reference_bits() -> None:
    from moe_fq_parity.harness.backends.triton_backend import TritonBackend

    be = TritonBackend()
    ok, why = be.available()
    if not ok:
        pytest.skip(why)
    device = be.device
    g = torch.Generator().manual_seed(5)
    ws = [torch.randn(8, 48, generator=g).to(torch.bfloat16).to(device) for _ in range(3)]
    amax = torch.tensor([0.5, 1.0, 2.0], device=device)
    want = reference.fake_quant_experts(ws, amax, "int8")
    entries = be.timed_entries(ws, amax, "int8")
    assert set(entries) == {"default", "unchecked", "kernel"}
    for name in ("default", "unchecked"):
        got = entries[name]()
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16)) for a, b in zip(got, want)), name
    stacked = torch.stack(ws)
    entries = be.timed_entries(ws, amax, "int8", stacked=stacked)
    got = entries["default"]()
    assert torch.equal(got.view(torch.int16), torch.stack(want).view(torch.int16))
    entries["kernel"]()  # the prepared launch runs (its output buffer is internal)


def test_bandwidth_picture_is_per_expert_shape() -> None:
    from moe_fq_parity.reports.html import _expert_shape
    from moe_fq_parity.reports.plots import bandwidth_vs_bytes_png

    assert _expert_shape("int8/per_expert/stacked/N32/5120x8192/outliers/s0") == "5120x8192"
    assert _expert_shape("no-shape-here") == "?"
    pts = [("triton", "5120x8192", 5_000_000_000, 95.0), ("triton", "1024x2048", 1_000_000_000, 90.0)]
    assert bandwidth_vs_bytes_png(pts, None) is None  # no copy bandwidth: no percentages to plot
    assert bandwidth_vs_bytes_png([], 3000.0) is None
    png = base64.b64decode(bandwidth_vs_bytes_png(pts, 3000.0))
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_perf_record_takes_the_reference_loop_time_of_the_expected_outputs() -> None:
    """``loop_us`` is the time of the reference loop that built the expected outputs (no extra call)."""
    from moe_fq_parity.cases import make_inputs, parse_case
    from moe_fq_parity.harness.backends import load
    from moe_fq_parity.harness.checks import CheckContext, expected_forward, run_case_checks

    lb = load("triton")
    if not lb.available:
        pytest.skip(lb.why_not)
    inputs = make_inputs(parse_case("int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"), 1234, lb.device or "cpu")
    expected = expected_forward(inputs)
    assert expected.loop_us is not None and expected.loop_us > 0
    perf = [r for r in run_case_checks(CheckContext(lb, inputs, 1234, copy_gbps=100.0), ["forward", "perf"], expected) if r.check == "perf"][0]
    assert perf.verdict == "pass", perf.message
    assert perf.perf.loop_us == expected.loop_us
    assert perf.perf.speedup_vs_loop == pytest.approx(expected.loop_us / perf.perf.time_us)
    assert "x the per-expert eager loop" in perf.message


def test_small_cases_time_only_the_public_call(monkeypatch) -> None:
    """Below ``DETAIL_BYTES`` the kernel alone and the unchecked call are not timed (no compiled
    variant is added for them); at or above it they are."""
    from moe_fq_parity.cases import make_inputs, parse_case
    from moe_fq_parity.harness.backends import load
    from moe_fq_parity.harness.checks import CheckContext, perf, run_case_checks

    lb = load("triton")
    if not lb.available:
        pytest.skip(lb.why_not)
    inputs = make_inputs(parse_case("int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"), 1234, lb.device or "cpu")
    rec = [r for r in run_case_checks(CheckContext(lb, inputs, 1234, copy_gbps=100.0), ["forward", "perf"]) if r.check == "perf"][0]
    assert rec.verdict == "pass" and rec.perf.kernel_us is None and rec.perf.unchecked_us is None and rec.perf.host_us > 0
    assert "kernel" not in rec.message and "host" in rec.message
    monkeypatch.setattr(perf, "DETAIL_BYTES", inputs.nbytes)
    rec = [r for r in run_case_checks(CheckContext(lb, inputs, 1234, copy_gbps=100.0), ["forward", "perf"]) if r.check == "perf"][0]
    assert rec.perf.kernel_us > 0 and rec.perf.unchecked_us > 0 and "kernel" in rec.message
