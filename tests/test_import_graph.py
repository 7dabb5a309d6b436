"""The package's import graph, read with ``ast`` (``tests/layers.py``): every arrow points down the
floors of the data path, and no module reaches itself through imports (function-local ones included).

Floors, lowest first (a module imports its own floor's group or lower floors, never a sibling group
on its floor nor a floor above):

0. ``reference`` -- the numeric spec;
1. ``kernels`` (the Triton kernel), ``cases`` (the generated cases), ``reports`` (schema, HTML, compare);
2. ``harness.core`` -- the comparison vocabulary (bits, ULP, equality, records, repro, timing);
3. ``harness.backends`` -- every backend and their registry;
4. ``harness.checks`` -- what is checked per case and backend;
5. ``harness.sections`` -- the report sections (MoE, checkpoints, self-test, external verdicts);
6. ``harness.run`` -- CLI, runner, pytest plugin;
7. the ``harness`` package's own modules (``python -m moe_fq_parity.harness``) and ``benchmarks``.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from .layers import NAMESPACE, TOPS, package_imports

ROOT = Path(__file__).resolve().parents[1]
FLOORS: dict[str, int] = {
    "reference": 0,
    "kernels": 1, "cases": 1, "reports": 1,
    "harness.core": 2,
    "harness.backends": 3,
    "harness.checks": 4,
    "harness.sections": 5,
    "harness.run": 6,
    "harness": 7, "benchmarks": 7,
}


def group(module: str) -> str:
    """The floor group of a package module (``moe_fq_parity.harness.core.ulp`` -> ``harness.core``)."""
    parts = module.split(".")[1:]
    sub = ".".join(parts[:2])
    return sub if sub in FLOORS else parts[0]


def modules(root: Path = ROOT, tops: tuple[str, ...] = TOPS) -> dict[str, Path]:
    """Every module of the package under ``root`` -> its file."""
    found = {}
    for top in tops:
        for path in (root / top).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join((NAMESPACE, *(parts[:-1] if parts[-1] == "__init__" else parts)))] = path
    return found


def graph(root: Path = ROOT, tops: tuple[str, ...] = TOPS) -> dict[str, dict[str, str]]:
    """``module -> {imported module: 'path:line'}`` (an imported name resolves to the module defining it;
    a module's own enclosing packages are not arrows: Python initialises them before the module)."""
    mods = modules(root, tops)

    def owner(name: str) -> str:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name

    edges: dict[str, dict[str, str]] = defaultdict(dict)
    for top in tops:
        for imp in package_imports(root / top, f"{NAMESPACE}.{top}"):
            parts = imp.path.relative_to(root).with_suffix("").parts
            src = ".".join((NAMESPACE, *(parts[:-1] if parts[-1] == "__init__" else parts)))
            dst = owner(imp.module)
            # a module's own packages are initialised before it runs: importing them is no arrow
            if dst and dst != src and not src.startswith(dst + "."):
                edges[src].setdefault(dst, f"{imp.path.relative_to(root)}:{imp.line}")
    return edges


def upward(edges: dict[str, dict[str, str]]) -> list[str]:
    """Arrows that do not point down a floor (or stay in their group), as text."""
    bad = []
    for src, dsts in edges.items():
        for dst, where in dsts.items():
            gs, gd = group(src), group(dst)
            if gs != gd and FLOORS[gd] >= FLOORS[gs]:
                bad.append(f"{where}: {gs} (floor {FLOORS[gs]}) imports {dst} ({gd}, floor {FLOORS[gd]})")
    return sorted(bad)


def loops(edges: dict[str, dict[str, str]]) -> list[list[str]]:
    """The import loops: strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(set(edges) | {w for d in edges.values() for w in d}):
        if v not in index:
            visit(v)
    return found


def test_every_module_has_a_floor():
    assert [m for m in modules() if group(m) not in FLOORS] == []


def test_no_arrow_points_up():
    assert upward(graph()) == []


def test_no_import_loop():
    assert loops(graph()) == []


@pytest.mark.parametrize("planted, finds", [
    ("from moe_fq_parity.harness.run.cli import main\n", "upward"),
    ("def f():\n    from ..sections import moe\n", "upward"),
    ("import importlib\nM = importlib.import_module('moe_fq_parity.harness.checks.forward')\n", "upward"),
    ("from moe_fq_parity.cases import shapes\n", "sibling"),
    ("def f():\n    from . import b\n", "loop"),
])
def test_the_checks_find_a_planted_arrow(tmp_path, planted, finds):
    """A miniature package: ``kernels/a.py`` (or ``harness/core/a.py`` for the loop) gets the planted
    line; the checks must report it."""
    for folder in ("reference", "kernels", "cases", "harness", "harness/core", "harness/sections", "harness/run", "harness/checks"):
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "__init__.py").write_text("")
    (tmp_path / "harness/run/cli.py").write_text("def main(): pass\n")
    (tmp_path / "harness/sections/moe.py").write_text("")
    (tmp_path / "harness/checks/forward.py").write_text("")
    (tmp_path / "cases/shapes.py").write_text("")
    (tmp_path / "harness/core/b.py").write_text("from . import a\n")
    target = tmp_path / ("harness/core/a.py" if finds == "loop" else "kernels/a.py")
    if finds == "upward" and "..sections" in planted:
        target = tmp_path / "harness/core/a.py"
    target.write_text(planted)
    edges = graph(tmp_path, ("reference", "kernels", "cases", "harness"))
    if finds == "loop":
        assert loops(edges) == [[f"{NAMESPACE}.harness.core.a", f"{NAMESPACE}.harness.core.b"]]
    else:
        assert upward(edges), edges
    (target).write_text("")
    assert upward(graph(tmp_path, ("reference", "kernels", "cases", "harness"))) == []
