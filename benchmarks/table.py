"""The printed case table: one row per case, per format kernel / public default / public unchecked
as % of copy bandwidth (``!`` before a cell whose output was not bit-exact with the reference), the
same-size copy, host us and the speedup over the eager loop; with ``--profile`` a last row of L2-resident
ceilings, the arithmetic bound of each column."""

from __future__ import annotations

from .cases import FORMATS
from .measure import CaseResult


KEYS = (*(b.key for b in FORMATS), "bwd_clipped")
TABLE_HEAD = (f"{'case':20s} {'MB':>6s} " + " ".join(f"{k[:15]:>15s}" for k in KEYS) + f" {'same-size copy':>14s}"
              + f"  {'host us (' + '/'.join(KEYS) + ')'}  {'x loop (fp8/bwd)':>16s}")  # fmt: skip
TABLE_NOTE = ("per format: kernel / public default / public unchecked, % of copy bandwidth ('!': output not bit-exact with the "
              "reference); same-size copy: a copy of the forward / backward bytes timed as the public call, % of copy")  # fmt: skip


def table_row(r: CaseResult) -> str:
    def cell(k: str) -> str:
        vals = (r.pct_copy.get(k), r.pct_public.get(k), r.pct_unchecked.get(k))
        return ("!" if r.correct.get(k) is False else "") + "/".join("-" if v is None else f"{v:.0f}" for v in vals)

    host = "/".join(f"{r.host_us[k]:.0f}" if k in r.host_us else "-" for k in KEYS)
    sp = "/".join(f"{r.speedup_vs_loop[k]:.0f}" if k in r.speedup_vs_loop else "-" for k in ("fp8_e4m3", "bwd_clipped"))
    same = "/".join(f"{r.pct_copy_same[k]:.0f}" if k in r.pct_copy_same else "-" for k in ("fwd", "bwd"))
    return f"{r.case:20s} {r.bytes_fwd / 1e6:6.0f} " + " ".join(f"{cell(k):>15s}" for k in KEYS) + f" {same:>14s}  {host}  {sp:>16s}"


def ceiling_row(profile: dict) -> str:
    """The ``--profile`` ceilings as a table row: each column's L2-resident throughput, % of copy
    (``-`` where the profile has none: the backward; ``err`` where it failed)."""

    def cell(k: str) -> str:
        v = profile.get(k)
        if not isinstance(v, dict):
            return "-"
        return "err" if "error" in v else f"{v['ceiling_pct_of_hbm_copy']:.0f}"

    return f"{'L2 ceiling (profile)':20s} {'':6s} " + " ".join(f"{cell(k):>15s}" for k in KEYS)


def print_table(results: list[CaseResult], copy_gbps: float, profile: dict | None = None) -> None:
    print(f"\ncopy bandwidth {copy_gbps:.0f} GB/s (read + write); {TABLE_NOTE}; host us of one default call; "
          "speedup of the default call vs the per-expert eager loop")  # fmt: skip
    print(TABLE_HEAD)
    for r in results:
        print(table_row(r))
    if profile and "error" not in profile:
        print(ceiling_row(profile))
