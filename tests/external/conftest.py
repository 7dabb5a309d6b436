"""Fixtures of the external-backend tests: Model-Optimizer imported once per session, small cases.

Model-Optimizer is an optional dependency (``pip install nvidia-modelopt==0.47.0 requests
huggingface_hub``); without it the tests that need it skip with that reason.  Its import takes
10-20 s, so it happens once, here.
"""

from __future__ import annotations

import pytest

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.external.match_cases import build_cases

TEST_SIZES = {"n_ties": 40, "n_split": 1}
"""Small near-tie and splitting sets: enough to separate every variant, fast on two cores."""


@pytest.fixture(scope="session")
def modelopt_eager():
    """The ``modelopt-eager`` backend, or a skip naming why it cannot run."""
    from moe_fq_parity.harness.backends.modelopt_backend import modelopt_eager

    ok, why = modelopt_eager.available()
    if not ok:
        pytest.skip(why)
    return modelopt_eager


@pytest.fixture(scope="session")
def small_cases():
    """``build_cases`` per format at ``TEST_SIZES`` (built once, shared by every test)."""
    memo: dict[str, list] = {}

    def get(fmt: str):
        if fmt not in memo:
            memo[fmt] = build_cases(fmt, seed=0, **TEST_SIZES)
        return memo[fmt]

    return get


class ReferenceVariant:
    """The reference's variant ``variant`` as a backend: a known answer for the matcher."""

    def __init__(self, variant: str, formats=None):
        self.variant = variant
        self.name = f"reference-{variant}"
        self.formats = set(formats or reference.FORMATS)
        self.device = "cpu"

    def fake_quant(self, weights, amax, fmt, **options):
        options.pop("variant", None)
        return reference.fake_quant_experts(weights, amax, fmt, self.variant, **options)
