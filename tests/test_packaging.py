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
TOPS = ("reference", "kernels", "cases", "reports", "harness", "benchmarks")


@pytest.mark.skipif(tomllib is None, reason="tomllib needs Python >= 3.11")
def test_every_package_folder_is_listed_under_the_namespace():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {
        "moe_fq_parity." + ".".join(p.parent.relative_to(REPO).parts)
        for top in TOPS for p in (REPO / top).rglob("__init__.py") if "__pycache__" not in p.parts
    }
    assert set(cfg["packages"]) == on_disk
    assert cfg["package-dir"] == {f"moe_fq_parity.{t}": t for t in TOPS}


def _extras(text: str, pattern: str) -> set[str]:
    import re

    m = re.search(pattern, text)
    assert m, f"no install line matching {pattern!r}"
    return set(m.group(1).split(","))


def test_readme_install_line_installs_the_extras_ci_installs_first():
    """The README's install line and the first install of .ci/run name the same extras."""
    readme = _extras((REPO / "README.md").read_text(), r"pip install -e '\.\[([a-z,]+)\]'")
    ci = _extras((REPO / ".ci" / "run").read_text(), r"pip install -q -e '\.\[([a-z,]+)\]'")
    assert readme == ci


def test_golden_vectors_are_package_data():
    cfg = tomllib.loads((REPO / "pyproject.toml").read_text()) if tomllib else None
    if cfg is None:
        pytest.skip("tomllib needs Python >= 3.11")
    data = cfg["tool"]["setuptools"]["package-data"]["moe_fq_parity.reference"]
    assert "data/*.npz" in data and (REPO / "reference" / "data" / "modelopt_cuda_vectors.npz").exists()


def test_own_kernel_section_installs_the_cpu_torch_before_the_package():
    """A kernel author on a CPU machine follows the README's "Check your own kernel" section: its
    install lines pin the torch that ``.ci/run`` installs (the CPU build; a bare ``torch``
    requirement pulls the CUDA build, about 5.6 GB) before they install the package."""
    import re

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Check your own kernel"):]
    section = section[:section.index("\n## ", 1)]
    lines = [ln.split("#")[0].split() for ln in section.splitlines() if ln.startswith("pip install ")]
    ci_pin = re.search(r"pip install -q (torch==[\d.]+)\n", (REPO / ".ci" / "run").read_text()).group(1)
    first_torch = next((k for k, ln in enumerate(lines) if any(a.startswith("torch") for a in ln)), None)
    ours = next((k for k, ln in enumerate(lines) if any(a.startswith("wheels/moe_fq_parity-") for a in ln)), None)  # the built wheel
    assert ours is not None and first_torch is not None and first_torch < ours, lines
    assert ci_pin in lines[first_torch] and "CPU" in section.split("pip install wheels/moe_fq_parity-")[0], lines
