"""The repository passes ``ruff check`` under the configuration in pyproject.toml (``[tool.ruff]``),
so the README's test command enforces the lint that ``.ci/run`` runs."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(importlib.util.find_spec("ruff") is None,
                                reason="needs ruff: pip install 'moe-fq-parity[test]' (or -e '.[test]' in a checkout)")


def _ruff(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", *args], cwd=REPO, input=stdin,
                          capture_output=True, text=True, timeout=120)


def test_the_repository_is_lint_clean() -> None:
    proc = _ruff(".")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_the_configuration_flags_what_it_selects() -> None:
    """The project's configuration is the one applied: under a repository path, an unused import,
    an ambiguous name and a line over 160 characters are reported; a 150-character line is not."""
    planted = "import os\n\nl = 1\nx = '" + "a" * 143 + "'\ny = '" + "b" * 170 + "'\n"
    proc = _ruff("--output-format", "concise", "--stdin-filename", "harness/planted.py", "-", stdin=planted)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    for code in ("F401", "E741"):
        assert code in proc.stdout, proc.stdout
    assert [ln.split(":")[1] for ln in proc.stdout.splitlines() if "E501" in ln] == ["5"], proc.stdout


def test_importing_a_conftest_by_name_is_reported() -> None:
    """``from conftest import ...`` in a test module picks whichever ``conftest.py`` pytest imported
    last (an ImportError that depends on the xdist distribution), so the lint bans it."""
    proc = _ruff("--output-format", "concise", "--stdin-filename", "tests/planted.py", "-",
                 stdin="from conftest import interpreted_cases\n\nprint(interpreted_cases)\n")
    assert proc.returncode == 1 and "TID251" in proc.stdout, proc.stdout + proc.stderr
