"""The ready parity test: every check of every selected case on every ``--parity-backend``.

Run it against your own kernel from any project where ``moe-fq-parity`` is installed:

* with no code: ``python -m pytest --pyargs moe_fq_parity.harness.run.parity_test --parity-backend pkg.mod:obj``
* with one line in one of your test files (then plain ``python -m pytest --parity-backend pkg.mod:obj``)::

      from moe_fq_parity.harness.run.parity_test import test_parity  # noqa: F401

Test ids are ``test_parity[<case id>-<backend>-<check>]``; a failure shows the offender table and
the ``moe-fq-parity run ...`` command that reruns exactly that case and check.
"""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.checks import DEFAULT_CHECKS

from .plugin_records import assert_record

PARITY_CHECKS = DEFAULT_CHECKS
"""The checks of the ready test: exactly those of ``moe-fq-parity run`` (``perf`` is timing, not parity)."""


@pytest.mark.parametrize("check", PARITY_CHECKS)
def test_parity(parity_check, check: str) -> None:
    """One check of one case on one backend: passes, skips with the reason, or fails with offenders and repro."""
    assert_record(parity_check(check))
