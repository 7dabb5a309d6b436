"""Which of the package's modules a source folder imports, read with ``ast`` (nothing is imported).

The layer tests (``tests/reports/test_layers.py``, ``tests/test_layers_low.py``) share this one
reader.  It sees module-level and function-local ``import`` / ``from ... import`` statements,
relative imports (resolved against the file's own package), and ``importlib.import_module`` /
``__import__`` calls whose module name is a string literal.  The repository's top-level folders
imported by their bare name (``import harness``) count as the package's own modules.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

NAMESPACE = "moe_fq_parity"
TOPS = ("reference", "kernels", "cases", "reports", "harness", "benchmarks")
"""The repository's top-level package folders (``moe_fq_parity.<top>``)."""


@dataclass(frozen=True)
class Imported:
    """One import of a package module: where (file, line) and the absolute module name."""

    path: Path
    line: int
    module: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.module}"


def _absolute(name: str) -> str:
    """``name`` with a bare top-level folder (``harness.x``) put under the namespace."""
    return f"{NAMESPACE}.{name}" if name.split(".")[0] in TOPS else name


def _resolve(name: str, level: int, package: str) -> str:
    """The absolute name of a relative import of ``name`` at ``level`` dots from ``package``."""
    if level == 0:
        return _absolute(name)
    parts = package.split(".")
    base = parts[: len(parts) - (level - 1)] if level - 1 < len(parts) else []
    return ".".join(base + ([name] if name else []))


def _literal_import(node: ast.Call, package: str) -> str | None:
    """The module an ``importlib.import_module("...")`` / ``__import__("...")`` call names, if a literal."""
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in ("import_module", "__import__") or not node.args:
        return None
    arg = node.args[0]
    if not (isinstance(arg, ast.Constant) and isinstance(arg.value, str)):
        return None
    target = arg.value
    if name == "import_module" and target.startswith("."):
        level = len(target) - len(target.lstrip("."))
        anchor = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"), None)
        base = anchor.value if isinstance(anchor, ast.Constant) and isinstance(anchor.value, str) else package
        return _resolve(target[level:], level, base)
    return _absolute(target)


def imports_in(path: Path, module: str, is_package: bool = False) -> list[Imported]:
    """Every package-module import in the source of ``path``, the module named ``module``."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[Imported] = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [_absolute(a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve(node.module or "", node.level, package)
            # a name imported from a package may be a submodule: count it as one
            names = [base] + [f"{base}.{a.name}" for a in node.names if a.name != "*"]
        elif isinstance(node, ast.Call):
            literal = _literal_import(node, package)
            names = [literal] if literal else []
        found += [Imported(path, node.lineno, n) for n in names if n.startswith(NAMESPACE + ".")]
    return found


def package_imports(folder: Path, package: str) -> list[Imported]:
    """Every package-module import in the ``.py`` files under ``folder``, the package ``package``."""
    found: list[Imported] = []
    for path in sorted(folder.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        parts = path.relative_to(folder).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        names = parts[:-1] if is_package else parts
        found += imports_in(path, ".".join((package, *names)), is_package)
    return found


def within(module: str, packages: tuple[str, ...]) -> bool:
    """Is ``module`` one of ``packages`` or inside one of them?"""
    return any(module == p or module.startswith(p + ".") for p in packages)


def outside(imports: list[Imported], allowed: tuple[str, ...]) -> list[str]:
    """The imports of modules outside the ``allowed`` packages, as ``path:line: module``."""
    return [str(i) for i in imports if not within(i.module, allowed)]
