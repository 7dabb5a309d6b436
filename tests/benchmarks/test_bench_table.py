"""The benchmark's case table prints, per case, the same-size copy next to the calls it times."""

from __future__ import annotations

from moe_fq_parity.benchmarks.measure import CaseResult
from moe_fq_parity.benchmarks.table import KEYS, ceiling_row, table_row


def test_row_shows_the_same_size_copy_after_the_formats() -> None:
    r = CaseResult("nano_fc1/N8", 8, (1856, 2688), 4 * 8 * 1856 * 2688, 6 * 8 * 1856 * 2688)
    r.pct_copy["int8"], r.pct_public["int8"], r.pct_unchecked["int8"] = 90.6, 84.4, 85.9
    r.pct_copy_same.update(fwd=91.0, bwd=93.4)
    row = table_row(r)
    assert "91/84/86" in row and row.index("91/84/86") < row.index(" 91/93 ")
    r.pct_copy_same.clear()
    assert " -/- " in table_row(r)


def test_row_marks_a_case_that_was_not_bit_exact() -> None:
    r = CaseResult("ultra_prod/N32", 32, (5120, 8192), 4 * 32 * 5120 * 8192, 6 * 32 * 5120 * 8192)
    for k, ok in (("int8", True), ("nvfp4", False)):
        r.pct_copy[k], r.pct_public[k], r.pct_unchecked[k] = 99.2, 98.9, 98.7
        r.correct[k] = ok
    row = table_row(r)
    assert " 99/99/99 " in row and "!99/99/99" in row and row.count("!") == 1


def test_ceiling_row_lists_every_profiled_column_in_table_order() -> None:
    profile = {"int8": {"ceiling_pct_of_hbm_copy": 228.4}, "nvfp4": {"ceiling_pct_of_hbm_copy": 179.9}, "triton_copy": {"ceiling_pct_of_hbm_copy": 232.8}}
    row = ceiling_row(profile)
    assert row.startswith("L2 ceiling (profile)")
    cells = row[len("L2 ceiling (profile)"):].split()
    assert len(cells) == len(KEYS) and cells[KEYS.index("int8")] == "228" and cells[KEYS.index("nvfp4")] == "180"
    assert cells[KEYS.index("bwd_clipped")] == "-" and cells[KEYS.index("fp8_e4m3")] == "-"
    assert ceiling_row({"int8": {"error": "RuntimeError: x"}}).split()[3 + KEYS.index("int8")] == "err"
