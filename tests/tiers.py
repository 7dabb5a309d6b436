"""Tier rules of this repository's own test suite that need a home importable by package path
(``tests.tiers``): a test module cannot import them from the root ``conftest.py`` by the name
``conftest``, which is whichever of the suite's ``conftest.py`` files pytest imported last."""

from __future__ import annotations

import pytest
import torch

INTERPRETED_SUITE = "smoke"
INTERPRETED_BACKEND = "triton"
PARITY_TEST = "tests/harness/test_parity.py"


def interpreted_cases() -> set[str]:
    """Case ids whose interpreted Triton parity tests stay in the default tier: the smoke cases, then
    in ``ci`` order the first case of each ``(format.variant+options, granularity, layout)`` that none
    of those has (89 + 59 = 148 cases)."""
    from moe_fq_parity.cases import suite

    def key(case) -> tuple:
        return case.fmt, case.variant, case.options, case.granularity, case.layout

    kept = {c.id for c in suite(INTERPRETED_SUITE)}
    seen = {key(c) for c in suite(INTERPRETED_SUITE)}
    for c in suite("ci"):
        if key(c) not in seen:
            seen.add(key(c))
            kept.add(c.id)
    return kept


def interpreted_parity_outside_kept_is_slow(items: list[pytest.Item]) -> None:
    """``slow`` on the interpreted Triton parity tests of ``PARITY_TEST`` whose case is not one of
    ``interpreted_cases`` (no CUDA device); runs before ``-m`` selects (``tryfirst``)."""
    if torch.cuda.is_available():
        return
    kept: set[str] | None = None
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        case = params.get("parity_case")
        if case is None or params.get("parity_backend") != INTERPRETED_BACKEND or not item.nodeid.startswith(PARITY_TEST):
            continue
        if kept is None:
            kept = interpreted_cases()
        if case.id not in kept:
            item.add_marker(pytest.mark.slow)
