"""``docs/ARCHITECTURE.md`` is true: its floors are the import-graph test's, every module, folder and
name its concept table points at exists, and each concept's defining name is defined in its home
and nowhere else in the package."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path

import pytest

from .layers import TOPS
from .test_import_graph import FLOORS

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "ARCHITECTURE.md"


def _table(heading: str) -> list[list[str]]:
    """The rows (cells) of the first table after ``heading``."""
    text = DOC.read_text()
    body = text[text.index(heading):]
    rows = []
    for line in body.splitlines()[1:]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if not set(cells[0]) <= set("-"):
                rows.append(cells)
        elif rows:
            break
    return rows[1:]  # the header row


@lru_cache(maxsize=None)
def defined(path: Path) -> frozenset[str]:
    """Top-level names a module defines (def, class, assignment, annotated assignment)."""
    names = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def _module_file(dotted: str) -> Path | None:
    """The file of a module named with dots from a top-level folder (``harness.core.ulp``)."""
    base = ROOT.joinpath(*dotted.split("."))
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def resolves(ref: str) -> bool:
    """A backticked reference of the concept table: ``folder/``, ``folder/file.py``, ``file.py:NAME``,
    ``a.b.module`` or ``a.b.module.NAME`` (from a top-level folder), or a brace list ``x/{a,b}``."""
    if "{" in ref:
        head, _, rest = ref.partition("{")
        return all(resolves(head + part) for part in rest.rstrip("}").split(","))
    path, _, name = ref.partition(":")
    if "/" in path:
        target = ROOT / path
        if path.endswith("/"):
            return target.is_dir()
        if not target.exists():
            return False
        return not name or name in defined(target)
    parts = path.split(".")
    for k in range(len(parts), 0, -1):
        f = _module_file(".".join(parts[:k]))
        if f is not None:
            rest = parts[k:]
            return not rest or (len(rest) == 1 and rest[0] in defined(f))
    return False


def _refs(cell: str) -> list[str]:
    """Backticked tokens that name code: paths, or dotted names starting at a top-level folder."""
    out = []
    for tok in re.findall(r"`([^`]+)`", cell):
        tok = tok.split("(")[0].strip()
        if "/" in tok and not tok.startswith(("$", "-", "python")) and " " not in tok:
            out.append(tok)
        elif re.fullmatch(r"[a-z_]+(\.[A-Za-z_]+)+", tok) and tok.split(".")[0] in TOPS:
            out.append(tok)
    return out


def test_the_floors_table_is_the_import_graph_tests():
    doc = {}
    for floor, groups, _ in _table("| floor | groups |"):
        for g in re.findall(r"`([^`]+)`", groups):
            doc[g] = int(floor)
    assert doc == FLOORS


def test_every_concept_row_points_at_code_that_exists():
    rows = _table("| concept | home |")
    assert len(rows) >= 30
    missing = [(concept[:40], ref) for concept, home in rows for ref in _refs(home) if not resolves(ref)]
    assert missing == []
    assert all(_refs(home) for _, home in rows), [c for c, h in rows if not _refs(h)]


HOMES: dict[str, str] = {
    "bits_equal": "harness/core/bits.py",
    "ulp_distance": "harness/core/ulp.py",
    "MAX_OFFENDERS": "harness/core/equality.py",
    "offenders_at": "harness/core/equality.py",
    "CheckRecord": "harness/core/records.py",
    "Offender": "harness/core/records.py",
    "SectionRow": "harness/sections/__init__.py",
    "SECTION_RUNNERS": "harness/sections/__init__.py",
    "start_sections": "harness/sections/processes.py",
    "Part": "harness/core/partition.py",
    "balance": "harness/core/partition.py",
    "repro_command": "harness/core/repro.py",
    "time_call": "harness/core/timing.py",
    "copy_curve": "harness/core/timing.py",
    "seed_for_id": "cases/inputs.py",
    "NEMOTRON": "cases/shapes.py",
    "ULTRA_PRODUCTION": "cases/shapes.py",
    "FormatSpec": "reference/formats.py",
    "register_format": "reference/formats.py",
    "format_spec": "reference/formats.py",
    "EXTERNAL_BACKENDS": "harness/backends/registry.py",
    "BUILTINS": "harness/backends/__init__.py",
    "Supervisor": "harness/run/isolation.py",
    "case_chunks": "harness/run/chunks.py",
    "ProcessState": "harness/core/guard.py",
    "load": "reports/schema.py",
    "interpret_mode": "kernels/env.py",
}
"""A concept's defining name -> its one home (the concept table's rows)."""


def _package_files() -> list[Path]:
    return [p for top in TOPS for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]


@pytest.mark.parametrize("name", sorted(HOMES))
def test_a_concept_is_defined_in_its_home_and_nowhere_else(name):
    where = sorted(str(p.relative_to(ROOT)) for p in _package_files() if name in defined(p))
    if name == "load":  # a common verb: only the report loader is meant, checked by its home alone
        assert HOMES[name] in where
        return
    assert where == [HOMES[name]]
    assert f"`{HOMES[name]}" in DOC.read_text() or HOMES[name].rsplit("/", 1)[0] in DOC.read_text()


def test_the_checks_see_a_wrong_row(tmp_path, monkeypatch):
    """A row naming a module or a name that does not exist is found."""
    assert not resolves("harness/core/nope.py")
    assert not resolves("harness/core/ulp.py:no_such_name")
    assert not resolves("harness.core.ulp.no_such_name")
    assert not resolves("harness/sections/{moe,nope}")
    assert resolves("harness/core/ulp.py:ulp_distance") and resolves("harness.core.ulp.ulp_distance")
