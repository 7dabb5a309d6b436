"""The perf check's timed quantities for the Triton backend (the ones ``kernels.bench`` reports) and
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
