"""The benchmark's cases: shapes from ``cases/shapes.py``, the production and acceptance cases first."""

from __future__ import annotations

from moe_fq_parity.benchmarks.cases import case_list
from moe_fq_parity.cases.shapes import N_VALUES, NEMOTRON, ULTRA_PRODUCTION, WIDE_ACCEPTANCE

FIRST_NAMES = ["ultra_prod/N32", "wide_1024x2048/N128", "super_fc1/N64", "nano_fc1/N8"]


def test_full_run_times_every_model_shape_at_every_count_acceptance_cases_first() -> None:
    cases = case_list(quick=False)
    assert [name for name, _, _ in cases[:4]] == FIRST_NAMES
    assert len(cases) == len(set(cases)) == 3 * len(N_VALUES) + 2
    by_name = {name: (n, shape) for name, n, shape in cases}
    assert by_name["ultra_prod/N32"] == ULTRA_PRODUCTION and by_name["wide_1024x2048/N128"] == WIDE_ACCEPTANCE
    for model in ("nano", "super", "ultra"):
        assert all(by_name[f"{model}_fc1/N{n}"] == (n, NEMOTRON[model]["fc1"]) for n in N_VALUES)


def test_quick_run_is_ultra_fc1_at_three_counts_after_the_production_and_wide_cases() -> None:
    names = [name for name, _, _ in case_list(quick=True)]
    assert names == ["ultra_prod/N32", "wide_1024x2048/N128", "ultra_fc1/N4", "ultra_fc1/N32", "ultra_fc1/N128"]

