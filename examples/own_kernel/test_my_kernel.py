from moe_fq_parity.harness.run.parity_test import test_parity  # noqa: F401
