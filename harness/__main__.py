"""``python -m moe_fq_parity.harness``: see ``harness.run.cli``."""

import sys

from moe_fq_parity.harness.run.cli import main

sys.exit(main())
