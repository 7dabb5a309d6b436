"""The run's copy curve: device copies timed like the perf samples, the yardstick of ``% of a
same-size copy`` (``harness.core.timing``)."""

from __future__ import annotations

import base64

import pytest
import torch

from moe_fq_parity.harness.core.timing import COPY_CURVE_MIN_BYTES, copy_curve, copy_us_at, curve_gbps

CURVE = ((4096, 5.0), (16384, 6.0), (65536, 10.0), (262144, 40.0))


def test_copy_time_is_interpolated_in_bytes_between_points() -> None:
    assert copy_us_at(CURVE, 4096) == 5.0
    assert copy_us_at(CURVE, 10240) == pytest.approx(5.5)  # half-way from 4 KiB to 16 KiB
    assert copy_us_at(CURVE, 65536) == 10.0
    assert copy_us_at(CURVE, 163840) == pytest.approx(25.0)
    assert copy_us_at(CURVE, 100) == 5.0  # below the first copy: its time (a launch's floor)
    assert copy_us_at(CURVE, 524288) == pytest.approx(80.0)  # above the last: its bandwidth
    assert curve_gbps(CURVE) == pytest.approx(262144 / 40e-6 / 1e9)


def test_curve_on_cpu_covers_4kib_to_its_largest_copy() -> None:
    curve = copy_curve(torch.device("cpu"), max_bytes=1 << 20)
    assert [b for b, _ in curve] == [COPY_CURVE_MIN_BYTES, 16 << 10, 64 << 10, 256 << 10, 1 << 20]
    assert all(us > 0 for _, us in curve)


def test_bandwidth_picture_draws_the_copy_curve() -> None:
    from moe_fq_parity.reports.plots import bandwidth_vs_bytes_png

    pts = [("triton", "1856x2688", 160_000_000, 84.0), ("triton", "5120x8192", 5_000_000_000, 95.0)]
    curve = [[b, b / 3000e3 * (1.1 if b < 1e9 else 1.0)] for b in (4 << 20, 16 << 20, 64 << 20, 256 << 20, 1 << 30, 1 << 31)]
    with_curve = bandwidth_vs_bytes_png(pts, 3000.0, curve)
    without = bandwidth_vs_bytes_png(pts, 3000.0)
    assert base64.b64decode(with_curve)[:8] == b"\x89PNG\r\n\x1a\n" and with_curve != without
