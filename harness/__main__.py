"""``python -m moe_fq_parity.harness``: see ``harness.run.cli``."""

import sys

from moe_fq_parity.harness.run.cli import main

if __name__ == "__main__":  # not when a spawned process (a report section's) imports the main module
    sys.exit(main())
