"""The sections' ``python -m`` entry points on bad arguments or a missing device: one-line usage
errors (exit 2) before any work starts, never a traceback.  And how the section and backend modules
behind them import each other: no import loop (a function-local import counts), backends below
sections."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from moe_fq_parity.harness.sections import cli_args
from moe_fq_parity.harness.sections.checkpoint import __main__ as dist_main
from moe_fq_parity.harness.sections.external import variant_match
from moe_fq_parity.harness.sections.moe import __main__ as moe_main
from moe_fq_parity.harness.sections.selftest import seeds


def _usage(capsys, main, argv, match):
    """``main(argv)`` exits 2 with one ``error:`` line naming ``match`` and no traceback."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    last = err.strip().splitlines()[-1]
    assert "error:" in last and match in last, err
    assert "Traceback" not in err


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(cli_args, "gpu_count", lambda: 0)


@pytest.mark.parametrize("main,argv,match", [
    (moe_main.main, ["--device", "cuda"], "no CUDA device here"),
    (moe_main.main, ["--device", "cuda:3"], "no CUDA device here"),
    (moe_main.main, ["--device", "nope"], "unknown device 'nope'"),
    (moe_main.main, ["--device", "mps"], "not supported"),
    (variant_match.main, ["--backend", "nope"], "--backend: unknown backend 'nope'"),
    (variant_match.main, ["--backend", "reference", "--format", "int9"], "--format: invalid choice"),
    (variant_match.main, ["--backend", "reference", "--n-ties", "0"], "--n-ties: expected an integer >= 1, got 0"),
    (variant_match.main, ["--backend", "reference", "--show", "-1"], "--show"),
    (variant_match.main, ["--backend", "reference", "--json", "/nonexistent/x.json"], "does not exist"),
    (seeds.main, ["--suite", "weekly"], "unknown suite 'weekly'"),
    (seeds.main, ["--backend", "nope"], "--backend: unknown backend 'nope'"),
    (seeds.main, ["--backend", ","], "--backend: no backend"),
    (seeds.main, ["--seeds", "0"], "--seeds: expected an integer >= 1"),
    (seeds.main, ["--json", "/nonexistent/x.json"], "does not exist"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments_are_usage_errors(capsys, no_gpu, main, argv, match):
    _usage(capsys, main, argv, match)


def test_cuda_index_past_the_devices(capsys, monkeypatch):
    monkeypatch.setattr(cli_args, "gpu_count", lambda: 2)
    _usage(capsys, moe_main.main, ["--device", "cuda:2"], "only 2 CUDA device(s) here")


def test_a_backend_without_the_format_is_a_usage_error(capsys):
    _usage(capsys, variant_match.main, ["--backend", "tests.harness.test_section_entry_points:INT8_ONLY", "--format", "nvfp4"],
           "does not run ['nvfp4']")


def test_unavailable_backends_exit_2_with_the_reason(capsys):
    """A backend asked for by name that cannot run here: exit 2, the reason on stderr."""
    assert seeds.main(["--backend", "reference,tests.harness.test_section_entry_points:NEVER", "--seeds", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unavailable backends:") and "not today" in err


class _Never:
    name = "never"
    formats = {"int8"}

    def available(self):
        return False, "not today"

    def fake_quant(self, weights, amax, fmt, **options):
        raise AssertionError("never called")


NEVER = _Never()


class _Int8Only(_Never):
    def available(self):
        return True, ""


INT8_ONLY = _Int8Only()


@pytest.mark.parametrize("gpus,argv,match", [
    (0, ["--device", "cuda", "--save", "tp1ep2", "--load", "tp1ep2"], "layout tp1ep2 needs 2 GPUs"),
    (0, ["--device", "cuda"], "needs 8 GPUs"),
    (2, ["--device", "cuda", "--save", "tp1ep2", "--load", "tp2ep2"], "layout tp2ep2 needs 4 GPUs"),
])
def test_dist_cuda_without_enough_gpus(capsys, monkeypatch, gpus, argv, match):
    monkeypatch.setattr(dist_main, "gpu_count", lambda: gpus)
    _usage(capsys, dist_main.main, argv, match)


def test_dist_cuda_on_a_host_without_gpus_end_to_end(tmp_path):
    """The command as a user types it, no GPU visible: one line on stderr, exit 2, nothing run."""
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    proc = subprocess.run([sys.executable, "-m", "moe_fq_parity.harness.sections.checkpoint", "--device", "cuda"],
                          capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    assert proc.stderr.strip().splitlines()[-1].startswith("python -m moe_fq_parity.harness.sections.checkpoint: error: --device cuda: layout")


# --- how the modules import each other ----------------------------------------------------------

HARNESS = Path(__file__).resolve().parents[2] / "harness"


def _module_imports(root: Path) -> dict[str, set[str]]:
    """``moe_fq_parity.harness.*`` module -> the harness modules it imports anywhere in its body
    (top level or inside a function), relative imports resolved; ``from pkg import mod`` names the
    submodule when there is one."""
    files = {"moe_fq_parity." + ".".join(p.relative_to(root.parent).with_suffix("").parts).removesuffix(".__init__"): p
             for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for mod, path in files.items():
        package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                target = ".".join(x for x in (base, node.module or "") if x)
                subs = {f"{target}.{a.name}" for a in node.names} & files.keys()
                deps |= subs or ({target} & files.keys())
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names} & files.keys()
        graph[mod] = deps - {mod}
    return graph


def _cycles(graph: dict[str, set[str]], within: str) -> list[str]:
    """Every import cycle among the modules under ``within`` (one line per cycle found by a depth-first walk)."""
    nodes = {m for m in graph if m == within or m.startswith(within + ".")}
    found: set[str] = set()

    def visit(mod: str, path: tuple[str, ...]) -> None:
        for dep in sorted(graph[mod] & nodes):
            if dep in path:
                found.add(" -> ".join(path[path.index(dep):] + (dep,)))
            elif len(path) < len(nodes):
                visit(dep, path + (dep,))

    for mod in sorted(nodes):
        visit(mod, (mod,))
    return sorted(found)


def test_section_modules_import_in_no_loop():
    assert _cycles(_module_imports(HARNESS), "moe_fq_parity.harness.sections") == []


def test_backends_do_not_import_the_sections():
    graph = _module_imports(HARNESS)
    up = {m: sorted(d for d in deps if d.startswith("moe_fq_parity.harness.sections")) for m, deps in graph.items()
          if m.startswith("moe_fq_parity.harness.backends")}
    assert {m: d for m, d in up.items() if d} == {}


def test_the_import_check_sees_a_loop_through_a_function_local_import(tmp_path):
    pkg = tmp_path / "harness" / "sections"
    pkg.mkdir(parents=True)
    (tmp_path / "harness" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import f\n")
    (pkg / "b.py").write_text("def f():\n    from moe_fq_parity.harness.sections import a\n")
    graph = _module_imports(tmp_path / "harness")
    assert _cycles(graph, "moe_fq_parity.harness.sections") == ["moe_fq_parity.harness.sections.a -> moe_fq_parity.harness.sections.b -> "
                                                                 "moe_fq_parity.harness.sections.a",
                                                                 "moe_fq_parity.harness.sections.b -> moe_fq_parity.harness.sections.a -> "
                                                                 "moe_fq_parity.harness.sections.b"]
