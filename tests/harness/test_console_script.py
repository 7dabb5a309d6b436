"""The ``moe-fq-parity`` command and ``python -m moe_fq_parity.harness`` are the same program."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SUBCOMMANDS = {"run", "compare", "list", "selftest", "merge"}


def _subcommands(argv: list[str]) -> set[str]:
    proc = subprocess.run([*argv, "--help"], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return set(re.search(r"\{([a-z,]+)\}", proc.stdout).group(1).split(","))


def test_console_script_and_module_offer_the_same_subcommands():
    script = Path(sys.executable).with_name("moe-fq-parity")
    assert script.exists(), f"console script not installed next to {sys.executable}"
    assert _subcommands([str(script)]) == _subcommands([sys.executable, "-m", "moe_fq_parity.harness"]) == SUBCOMMANDS
