"""The ``Case`` is a plain record, its rules live in ``cases.rules``, the package has no import cycle,
and the catalogue fails loudly on a case it did not mean to build."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from moe_fq_parity.reference import FORMATS

from moe_fq_parity.cases import Case, CatalogueError, make_inputs, parse_case, suite, validate
from moe_fq_parity.cases import catalogue
from moe_fq_parity.cases.rules import problems

CASES_DIR = Path(__file__).resolve().parents[2] / "cases"
BASE = dict(fmt="int8", variant="cuda", granularity="per_expert", layout="stacked", n=4, shape=(8, 40), dist="normal")


def test_case_is_a_plain_record_and_every_entry_point_validates():
    bad = Case(**(BASE | dict(fmt="int9", layout="stackd")))  # constructing checks nothing
    assert problems(bad) == [f"fmt='int9' not in {FORMATS}", "layout='stackd' not in ('list', 'stacked', 'ragged')"]
    with pytest.raises(ValueError, match="invalid Case: fmt='int9'.*layout='stackd'"):
        validate(bad)
    with pytest.raises(ValueError, match="invalid Case: fmt='int9'"):
        make_inputs(bad)
    parsed = Case.from_id(bad.id)  # the grammar parses; the rules reject
    assert parsed == bad
    with pytest.raises(ValueError, match="fmt='int9'"):
        parse_case(bad.id)
    good = Case(**BASE)
    assert validate(good) is good and parse_case(good.id) == good and problems(good) == []


@pytest.mark.parametrize("kw, needle", [
    (dict(options=(("narrow_range", False),)), "written only when True"),
    (dict(fmt="nvfp4", variant="te", options=(("block_size", 0),)), "block_size must be an int >= 1"),
    (dict(fmt="nvfp4", variant="te", options=(("block_size", True),)), "block_size must be an int"),
    (dict(fmt="nvfp4", variant="modelopt_static", options=(("block_amax", 1.0),)), "'block_amax' is not a case option"),
    (dict(options=(("fancy", True),)), "unknown option 'fancy'"),
    (dict(fmt="fp8_e4m3", options=(("unsigned", True),)), "fp8_e4m3.cuda does not take option 'unsigned'"),
    (dict(options=(("unsigned", True), ("narrow_range", True))), "sorted"),
    (dict(dist="outties"), "built for its designed amax"),
    (dict(fmt="nvfp4", variant="te", dist="neartie", amax="design"), "applies to \\['fp8_e4m3', 'int4', 'int8'\\] only"),
])
def test_rules_name_the_problem(kw, needle):
    with pytest.raises(ValueError, match=needle):
        validate(Case(**(BASE | kw)))


def test_option_codes_come_from_the_registry():
    c = validate(Case(**(BASE | dict(fmt="nvfp4", variant="te", options=(("block_size", 32),)))))
    assert c.id.startswith("nvfp4.te+bs32/") and parse_case(c.id) == c
    with pytest.raises(ValueError, match="unknown option code 'wide'"):
        Case.from_id("int8.cuda+wide/per_expert/stacked/N4/8x40/normal/s0")


# --- the catalogue fails loudly ---------------------------------------------------------------------


@pytest.mark.parametrize("entry, needle", [(("nromal", "max"), "dist='nromal'"), (("ties", "desing"), "amax='desing'"),
                                           (("normal", "design"), "needs a distribution that designs amax")])
def test_a_typo_in_a_suite_fails_loudly(monkeypatch, entry, needle):
    """Before, ``_valid`` swallowed every ``ValueError`` and the suite silently lost the entry."""
    monkeypatch.setattr(catalogue, "_CI_DISTS", catalogue._CI_DISTS + (entry,))
    with pytest.raises(CatalogueError, match=needle):
        suite("ci")


def test_the_suites_expect_only_distribution_rejections():
    """The one combination the suites skip is a distribution a format does not take; nothing else."""
    skipped = [(d, f) for f in ("int8", "fp8_e4m3", "nvfp4") for d, _ in catalogue._CI_DISTS if not catalogue._applies(d, f)]
    assert sorted(set(skipped)) == [("nan", "fp8_e4m3"), ("nan", "int8"), ("neartie", "nvfp4"), ("outties", "nvfp4")]
    assert {c.dist for c in suite("ci") if c.fmt == "nvfp4"} >= {"nan", "ties", "special"}


# --- no import cycle, no function-local imports ----------------------------------------------------


def _imports(tree: ast.Module, package: str) -> tuple[set[str], list[str]]:
    """Sibling modules a module imports at top level, and the imports it hides (in a function,
    a class or an ``if``: e.g. ``TYPE_CHECKING``)."""
    top, hidden = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level == 1 or (node.module or "").startswith(package + ".")):
            name = (node.module or "").removeprefix(package + ".").split(".")[0]
            names = [name] if name else [a.name for a in node.names]
            if node in tree.body:
                top.update(names)
            else:
                hidden.append(f"line {node.lineno}: {ast.unparse(node)}")
    return top, hidden


def _layering_problems(sources: dict[str, str], package: str) -> list[str]:
    graph, out = {}, []
    for mod, src in sources.items():
        top, hidden = _imports(ast.parse(src), package)
        graph[mod] = top & set(sources)
        out += [f"{mod}: hidden import {h}" for h in hidden]

    def visit(mod: str, path: tuple[str, ...]) -> None:
        for dep in sorted(graph[mod]):
            if dep in path:
                out.append("import cycle " + " -> ".join(path[path.index(dep):] + (dep,)))
            else:
                visit(dep, path + (dep,))

    for mod in sorted(graph):
        visit(mod, (mod,))
    return sorted(set(out))


def test_cases_modules_import_one_way():
    sources = {p.stem: p.read_text() for p in CASES_DIR.glob("*.py") if p.stem != "__init__"}
    assert _layering_problems(sources, "moe_fq_parity.cases") == []


def test_layering_check_finds_cycles_and_hidden_imports():
    broken = {
        "case": "from .shapes import expert_shapes\n\ndef f():\n    from .distributions import DISTRIBUTIONS\n",
        "shapes": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .case import Case\n",
        "distributions": "from .case import Case\nfrom moe_fq_parity.cases.rules import validate\n",
        "rules": "from .distributions import DISTRIBUTIONS\nfrom . import case\n",
    }
    found = _layering_problems(broken, "moe_fq_parity.cases")
    assert any("hidden import line 4: from .distributions import DISTRIBUTIONS" in p for p in found)
    assert any("shapes: hidden import" in p for p in found)
    assert any(p.startswith("import cycle distributions -> rules -> distributions") for p in found)
