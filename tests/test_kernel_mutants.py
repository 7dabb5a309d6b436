"""``scripts/kernel_mutants.py``: every planted bug still applies to the kernels' source (its fragment
occurs exactly once), so the mutant run cannot silently test nothing; the classification of a
pytest session's outcome."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _module():
    spec = importlib.util.spec_from_file_location("kernel_mutants", ROOT / "scripts" / "kernel_mutants.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


KM = _module()


@pytest.mark.parametrize("m", KM.MUTANTS, ids=lambda m: m.name)
def test_each_fragment_occurs_once_and_changes_the_source(m):
    text = (ROOT / m.path).read_text()
    assert text.count(m.old) == 1, f"{m.name}: {m.path} holds its fragment {text.count(m.old)} times"
    assert m.new != m.old and m.path.startswith("kernels/")


def test_names_are_unique():
    names = [m.name for m in KM.MUTANTS]
    assert len(names) == len(set(names))


def test_a_mutant_whose_fragment_is_gone_is_refused(tmp_path, monkeypatch):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("x = 1\n")
    monkeypatch.setattr(KM, "ROOT", tmp_path)
    with pytest.raises(SystemExit, match="occurs 0 times"):
        KM.run_mutant(KM.KernelMutant("gone", "kernels/k.py", "y = 2", "y = 3", "a fragment no longer in the file"), ("--version",), 60)
    assert (tmp_path / "kernels" / "k.py").read_text() == "x = 1\n"


@pytest.mark.parametrize("body, outcome", [("def test_ok():\n    assert True\n", "survived"),
                                           ("def test_bad():\n    assert False\n", "killed"),
                                           ("import no_such_module_here\n", "broke")])
def test_outcome_of_a_session_and_the_file_restored(tmp_path, monkeypatch, body, outcome):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "k.py").write_text("VALUE = 1\n")
    (tmp_path / "test_k.py").write_text(body)
    monkeypatch.setattr(KM, "ROOT", tmp_path)
    args = ("-q", "-p", "no:cacheprovider", "-p", "no:moe_fq_parity", "-p", "no:hypothesispytest", "test_k.py")
    r = KM.run_mutant(KM.KernelMutant("m", "kernels/k.py", "VALUE = 1", "VALUE = 2", "w"), args, 120)
    assert r["outcome"] == outcome, r
    assert (r["by"] == "test_k.py::test_bad") == (outcome == "killed")
    assert (tmp_path / "kernels" / "k.py").read_text() == "VALUE = 1\n"
