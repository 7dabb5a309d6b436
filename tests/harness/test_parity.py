"""The parity checks as parametrized tests: case ids x backends (``harness.run.pytest_plugin``).

``pytest tests/harness/test_parity.py`` runs the ``ci`` suite; ``-m slow`` the larger cases;
``--parity-report DIR`` writes the JSON/HTML report of every check.
"""

import pytest

from moe_fq_parity.harness.run.pytest_plugin import assert_record


@pytest.mark.parametrize("check", ["forward", "backward.pass_through", "backward.clipped", "invariant.layout", "invariant.grouped"])
def test_parity(parity_check, check):
    assert_record(parity_check(check))
