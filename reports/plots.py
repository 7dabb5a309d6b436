"""Pictures for the HTML report: matplotlib (Agg) figures embedded as base64 PNG."""

from __future__ import annotations

import base64
import io
import math
from typing import Iterable, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from .schema import hist_labels  # noqa: E402

_SUPERSCRIPT = str.maketrans("0123456789-", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079\u207b")


def _power_of_ten_label(y: float, _pos: object = None) -> str:
    """``0``, ``10\u00b3``: a log axis's major tick as plain text with Unicode superscripts.  Matplotlib's
    default draws ``$10^{3}$`` through its TeX parser, a third of a histogram's rendering time."""
    if y == 0:
        return "0"
    e = round(math.log10(abs(y)))
    if not math.isclose(abs(y), 10.0 ** e, rel_tol=1e-9):
        return ""
    return ("-" if y < 0 else "") + "10" + str(e).translate(_SUPERSCRIPT)


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
    ax.yaxis.set_major_formatter(FuncFormatter(_power_of_ten_label))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=45, fontsize=7)
    ax.set_xlabel("ULP distance", fontsize=8)
    ax.set_ylabel("elements", fontsize=8)
    ax.set_title(title, fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    return _png(fig)


def bandwidth_vs_bytes_png(points: Iterable[tuple[str, str, int, float]], copy_gbps: Optional[float],
                          copy_curve: Optional[Sequence[Sequence[float]]] = None) -> Optional[str]:
    """% of copy bandwidth against bytes moved (log scale), one line per (backend, expert shape);
    each point is the median over the formats timed at that size (the public default call).
    ``copy_curve`` (``meta.copy_curve``: ``[bytes, us]`` pairs) adds the device copy itself timed
    the same way: the most a call of that size can show under this timer.

    ``points``: ``(backend, expert_shape, bytes_moved, pct_of_copy)``.  ``None`` when there is
    nothing to plot (no perf record, or no copy bandwidth to compare with).
    """
    series: dict[tuple[str, str], dict[int, list[float]]] = {}
    for backend, shape, nbytes, pct in points:
        if pct is not None:
            series.setdefault((backend, shape), {}).setdefault(int(nbytes), []).append(float(pct))
    if not series or not copy_gbps:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 3.4))
    for (backend, shape), pts in sorted(series.items()):
        xs = sorted(pts)
        ys = [sorted(pts[x])[len(pts[x]) // 2] for x in xs]
        ax.plot(xs, ys, marker="o", label=f"{backend} {shape}")
    ax.axhline(100.0, linestyle="--", color="grey", label=f"copy {copy_gbps:.0f} GB/s")
    if copy_curve:
        lo, hi = min(min(p) for p in series.values()), max(max(p) for p in series.values())
        pts = [(b, 100.0 * b / (us * 1e-6) / 1e9 / copy_gbps) for b, us in copy_curve if lo / 4 <= b <= hi * 4 and us > 0]
        if pts:
            ax.plot([b for b, _ in pts], [p for _, p in pts], linestyle=":", color="black", label="device copy, same timer")
    ax.set_xscale("log")
    ax.set_ylim(0, 110)
    ax.set_xlabel("bytes moved (read + write)")
    ax.set_ylabel("% of copy bandwidth")
    ax.set_title("Bandwidth vs bytes moved, per expert shape (median over formats)")
    ax.legend(fontsize=7, loc="best")
    ax.grid(alpha=0.3)
    return _png(fig)
