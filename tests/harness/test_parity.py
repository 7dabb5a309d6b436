"""The parity checks as parametrized tests: case ids x backends x checks (the plugin's ready test).

``pytest tests/harness/test_parity.py`` runs the ``ci`` suite; ``-m slow`` the larger cases;
``--parity-report DIR`` writes the JSON/HTML report of every check.  The one line below is all
another project needs too (``examples/own_kernel``).
"""

from moe_fq_parity.harness.run.parity_test import test_parity  # noqa: F401
