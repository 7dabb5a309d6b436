"""Pictures for the HTML report: matplotlib (Agg) figures embedded as base64 PNG."""

from __future__ import annotations

import base64
import io
from typing import Iterable, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .schema import hist_labels  # noqa: E402


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def ulp_histogram_png(hist: Sequence[int], title: str, *, small: bool = True) -> str:
    """Bar chart of element counts per ULP bucket (log scale), base64 PNG."""
    fig, ax = plt.subplots(figsize=(3.6, 2.2) if small else (6.4, 3.0))
    labels = hist_labels()
    colors = ["#2e7d32"] + ["#f9a825"] + ["#c62828"] * (len(labels) - 2)
    ax.bar(range(len(hist)), [max(h, 0) for h in hist], color=colors[: len(hist)])
    ax.set_yscale("symlog", linthresh=1)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=45, fontsize=7)
    ax.set_xlabel("ULP distance", fontsize=8)
    ax.set_ylabel("elements", fontsize=8)
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    return _png(fig)


def bandwidth_vs_n_png(points: Iterable[tuple[str, str, int, float]], copy_gbps: Optional[float]) -> Optional[str]:
    """GB/s against N, one line per (backend, format); the copy bandwidth as a dashed line.

    ``points``: ``(backend, fmt, n, gbps)``.  ``None`` when there is nothing to plot.
    """
    series: dict[tuple[str, str], dict[int, float]] = {}
    for backend, fmt, n, gbps in points:
        best = series.setdefault((backend, fmt), {})
        best[n] = max(best.get(n, 0.0), gbps)
    if not series:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for (backend, fmt), pts in sorted(series.items()):
        ns = sorted(pts)
        ax.plot(ns, [pts[n] for n in ns], marker="o", label=f"{backend} {fmt}")
    if copy_gbps:
        ax.axhline(copy_gbps, linestyle="--", color="grey", label=f"copy {copy_gbps:.0f} GB/s")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("N (experts)")
    ax.set_ylabel("GB/s (read + write)")
    ax.set_title("Bandwidth vs N (best per N)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return _png(fig)
