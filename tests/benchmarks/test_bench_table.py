"""The benchmark's case table prints, per case, the same-size copy next to the calls it times."""

from __future__ import annotations

from moe_fq_parity.benchmarks.measure import CaseResult
from moe_fq_parity.benchmarks.table import table_row


def test_row_shows_the_same_size_copy_after_the_formats() -> None:
    r = CaseResult("nano_fc1/N8", 8, (1856, 2688), 4 * 8 * 1856 * 2688, 6 * 8 * 1856 * 2688)
    r.pct_copy["int8"], r.pct_public["int8"], r.pct_unchecked["int8"] = 90.6, 84.4, 85.9
    r.pct_copy_same.update(fwd=91.0, bwd=93.4)
    row = table_row(r)
    assert "91/84/86" in row and row.index("91/84/86") < row.index(" 91/93 ")
    r.pct_copy_same.clear()
    assert " -/- " in table_row(r)
