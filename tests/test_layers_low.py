"""The lower floors import nothing from above: ``reference`` only itself, ``kernels`` only itself
and ``reference`` (the checker: ``tests/layers.py``, read from source, nothing imported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.layers import outside, package_imports

REPO = Path(__file__).resolve().parents[1]
FLOORS = {
    "reference": ("moe_fq_parity.reference",),
    "kernels": ("moe_fq_parity.kernels", "moe_fq_parity.reference"),
}
"""Folder -> the packages its modules may import."""


@pytest.mark.parametrize("folder", sorted(FLOORS))
def test_floor_imports_only_itself_and_below(folder: str) -> None:
    imports = package_imports(REPO / folder, f"moe_fq_parity.{folder}")
    assert imports, f"the reader found no package import under {folder}/ at all"
    offenders = outside(imports, FLOORS[folder])
    assert not offenders, "upward imports:\n" + "\n".join(offenders)


PLANTED = {
    "absolute": "from moe_fq_parity.reports.schema import dumps\n",
    "plain": "import moe_fq_parity.harness.core.timing\n",
    "relative": "from ..reports import schema\n",
    "relative_module": "from .. import harness\n",
    "namespace_name": "from moe_fq_parity import cases\n",
    "bare_top": "import harness.core.timing\n",
    "function_local": "def f():\n    from moe_fq_parity.benchmarks import bench\n    return bench\n",
    "import_module": "import importlib\n\nM = importlib.import_module('moe_fq_parity.reports.schema')\n",
    "import_module_relative": "from importlib import import_module\n\ndef f():\n    return import_module('..harness', __package__)\n",
    "dunder_import": "M = __import__('moe_fq_parity.kernels.api')\n",
}


def _plant(tmp_path: Path, source: str) -> Path:
    pkg = tmp_path / "reference"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from .api import fake_quant\nfrom moe_fq_parity.reference import formats\n")
    (pkg / "api.py").write_text("import importlib\n\nfrom . import formats\nF = importlib.import_module('.formats', 'moe_fq_parity.reference')\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "deep.py").write_text("from ... import reference\nfrom ..api import fake_quant\n")
    (pkg / "planted.py").write_text(source)
    return pkg


@pytest.mark.parametrize("kind", sorted(PLANTED))
def test_checker_reports_a_planted_upward_import(tmp_path: Path, kind: str) -> None:
    """One planted module in a copy of ``reference/`` is reported, with its file and line; the
    allowed imports next to it are not."""
    pkg = _plant(tmp_path, PLANTED[kind])
    offenders = outside(package_imports(pkg, "moe_fq_parity.reference"), FLOORS["reference"])
    assert offenders and all(o.startswith(str(pkg / "planted.py") + ":") for o in offenders), offenders


def test_checker_resolves_relative_imports_to_the_files_package(tmp_path: Path) -> None:
    pkg = _plant(tmp_path, "")
    got = {(i.path.name, i.module) for i in package_imports(pkg, "moe_fq_parity.reference")}
    assert {("api.py", "moe_fq_parity.reference.formats"), ("__init__.py", "moe_fq_parity.reference.api"),
            ("deep.py", "moe_fq_parity.reference"), ("deep.py", "moe_fq_parity.reference.api")} <= got, got  # fmt: skip
    assert not outside(package_imports(pkg, "moe_fq_parity.reference"), FLOORS["reference"])


def test_the_documented_plant_fails_the_floor_check(tmp_path: Path) -> None:
    """The plain case: ``from moe_fq_parity.reports.schema import dumps`` in a reference module."""
    pkg = tmp_path / "reference"
    pkg.mkdir()
    (pkg / "planted.py").write_text("from moe_fq_parity.reports.schema import dumps\n")
    assert outside(package_imports(pkg, "moe_fq_parity.reference"), FLOORS["reference"]) == [
        f"{pkg / 'planted.py'}:1: moe_fq_parity.reports.schema",
        f"{pkg / 'planted.py'}:1: moe_fq_parity.reports.schema.dumps",
    ]
