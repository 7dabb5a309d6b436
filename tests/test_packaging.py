"""The distribution installs every package folder of the repository under ``moe_fq_parity``."""

from __future__ import annotations

import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    tomllib = None

import pytest

REPO = Path(__file__).resolve().parents[1]
TOPS = ("reference", "kernels", "cases", "reports", "harness")


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python >= 3.11")
def test_every_package_folder_is_listed_under_the_namespace():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        "moe_fq_parity." + ".".join(p.parent.relative_to(REPO).parts)
        for top in TOPS for p in (REPO / top).rglob("__init__.py") if "__pycache__" not in p.parts
    }
    assert set(cfg["packages"]) == on_disk
    assert cfg["package-dir"] == {f"moe_fq_parity.{t}": t for t in TOPS}
