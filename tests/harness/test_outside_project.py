"""The plugin from another project: a throwaway project outside this repository, the installed
package only, the example backend of ``examples/own_kernel`` (correct: passes; rounding half away
from zero: fails with the offender table and a repro command that reruns the failure), and a new
user's environment built from the wheel with no extras (``slow``: ``.ci/run`` job 4)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Optional

import pytest

from tests.samples import assert_quoted

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "own_kernel"
RIGHT = "torch.round(x.float() * s)"
WRONG = "torch.copysign(torch.floor((x.float() * s).abs() + 0.5), x.float() * s)"
"""Round half away from zero (C's ``round``): off by one on every tie whose floor is even."""
TIES = "int8.cuda/per_expert/list/N4/8x40/ties@design/s0"


def _project(tmp_path: Path, *, wrong: bool = False, with_test_file: bool = True) -> Path:
    proj = tmp_path / "someone_elses_kernel"
    proj.mkdir()
    for name in ("my_kernel.py", "pytest.ini") + (("test_my_kernel.py",) if with_test_file else ()):
        shutil.copy(EXAMPLE / name, proj / name)
    if wrong:
        src = (proj / "my_kernel.py").read_text()
        assert RIGHT in src
        (proj / "my_kernel.py").write_text(src.replace(RIGHT, WRONG))
    assert REPO not in proj.resolve().parents
    return proj


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",) and not k.startswith(("PARITY_", "PYTEST_"))}
    return env


def _pytest(proj: Path, *args: str) -> subprocess.CompletedProcess:
    """pytest in the project.  Hypothesis's plugin stays out (about 0.5 s a process): the ready parity test uses
    none, and the plugin runs it the same without it (the base install has none: the ``slow`` test)."""
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest", "-q", *args], cwd=proj,
                          env=_env(), capture_output=True, text=True, timeout=600)


def _summary(out: str) -> str:
    return out.strip().splitlines()[-1] if out.strip() else ""


def _counts(text: str) -> dict[str, int]:
    """``{"passed": 92, "skipped": 736, ...}`` from a pytest summary line (or a README comment quoting one)."""
    return {word: int(n) for n, word in re.findall(r"(\d+) (passed|failed|skipped|deselected|errors?)\b", text)}


def readme_counts(command: str) -> dict[str, int]:
    """The counts ``examples/own_kernel/README.md`` quotes after ``command`` (``# ...: 11 passed, 43 skipped``)."""
    lines = [ln for ln in (EXAMPLE / "README.md").read_text().splitlines() if ln.split("#")[0].strip() == command]
    assert len(lines) == 1, f"README.md quotes {command!r} {len(lines)} times"
    counts = _counts(lines[0].split("#", 1)[1])
    assert counts.get("passed"), lines[0]
    return counts


def test_correct_backend_passes_in_a_project_outside_the_repository(tmp_path):
    proj = _project(tmp_path)
    proc = _pytest(proj, "--parity-suite", "smoke", "-rs")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = _summary(proc.stdout)
    assert _counts(summary) == readme_counts("python -m pytest --parity-suite smoke"), summary  # the README quotes today's counts
    assert_quoted("own-kernel-smoke", proc.stdout)  # other formats and variants: one counted line; the skips a user can act on
    # The package came from the installation, not from a path next to the project.
    where = subprocess.run([sys.executable, "-c", "import moe_fq_parity.harness as h; print(h.__file__)"], cwd=proj, env=_env(),
                           capture_output=True, text=True, timeout=60)
    assert where.returncode == 0 and not Path(where.stdout.strip()).is_relative_to(proj)


def test_no_line_of_code_with_pyargs(tmp_path):
    proj = _project(tmp_path, with_test_file=False)
    proc = _pytest(proj, "--pyargs", "moe_fq_parity.harness.run.parity_test", "--parity-suite", "smoke")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "19 passed" in _summary(proc.stdout)


def test_backend_off_by_one_on_ties_fails_with_offender_table_and_repro(tmp_path):
    proj = _project(tmp_path, wrong=True)
    report = tmp_path / "report"
    proc = _pytest(proj, "--parity-suite", "smoke", "--parity-report", str(report))
    out = proc.stdout
    assert proc.returncode == 1, out[-4000:] + proc.stderr[-2000:]
    assert f"FAILED test_my_kernel.py::test_parity[{TIES}-my_kernel:MyInt8-forward]" in out
    block = out[out.index(f"forward failed for {TIES} on my_kernel:MyInt8"):]
    assert "elements differ" in block.splitlines()[0] and "are tie flips" in block.splitlines()[0]
    assert "first 10 offenders:" in block and "expert  row  col" in block and "pre_round" in block
    repro_line = next(ln for ln in block.splitlines() if ln.startswith("repro: "))
    assert_quoted("own-kernel-tie-failure", block[:block.index(repro_line) + len(repro_line)])  # what the example's README shows
    assert repro_line == (f"repro: moe-fq-parity run --case {TIES} --backend my_kernel:MyInt8 --checks forward --seed 1234 --no-sections --out parity-repro")
    recs = json.loads((report / "report.json").read_text())["records"]
    assert any(r["case_id"] == TIES and r["check"] == "forward" and r["verdict"] == "fail" for r in recs)

    # The repro command, as printed, reruns exactly that failure from the project directory.
    argv = shlex.split(repro_line[len("repro: "):])
    exe = Path(sys.executable).with_name(argv[0])
    if not exe.exists():
        pytest.fail(f"the console script {argv[0]} is not installed next to {sys.executable}")
    rerun = subprocess.run([str(exe), *argv[1:], "--no-progress"], cwd=proj, env=_env(), capture_output=True, text=True,
                           timeout=600)
    assert rerun.returncode == 1, rerun.stdout[-2000:] + rerun.stderr[-2000:]
    again = json.loads((proj / "parity-repro" / "report.json").read_text())["records"]
    assert [(r["case_id"], r["check"], r["verdict"]) for r in again] == [(TIES, "forward", "fail")]


def _readme_install_lines() -> list[str]:
    """The ``pip`` lines of the README's "Check your own kernel" section, as written (comments dropped)."""
    text = (REPO / "README.md").read_text()
    section = text[text.index("## Check your own kernel"):]
    section = section[:section.index("\n## ", 1)]
    lines = [ln.split("#")[0].strip() for ln in section.splitlines() if ln.startswith("pip ")]
    assert lines and any("moe_fq_parity" in ln for ln in lines), lines
    return lines


PUBLISHED = re.compile(r"pip install\s+(?:-\S+\s+)*['\"]?moe-fq-parity['\"]?(?:\s|$)")
"""``pip install moe-fq-parity``: the distribution by a name on an index, which it is not on (an extra,
``'moe-fq-parity[te]'``, is fine: with the package installed, pip adds the extra's requirements)."""


def test_no_install_line_names_a_published_package():
    """The install lines a reader copies work with only the package registries: none asks an index
    for ``moe-fq-parity`` itself."""
    from tests.samples import DOCUMENTS

    found = [f"{path.relative_to(REPO)}: {ln.strip()}" for pattern in DOCUMENTS for path in sorted(REPO.glob(pattern))
             for ln in path.read_text().splitlines() if PUBLISHED.search(ln)]
    assert not found, found
    assert PUBLISHED.search("pip install moe-fq-parity pytest") and not PUBLISHED.search("pip install 'moe-fq-parity[modelopt]'")


def _sh(argv: list[str], cwd: Path, env: dict[str, str], timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{shlex.join(argv)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def _uninstallable(requirement: str, env: dict[str, str]) -> Optional[str]:
    """Why pip cannot install ``requirement`` here (no index reachable, as on an offline GPU host, or the
    version not on it), else ``None``: asked of the index, nothing downloaded."""
    name, _, version = requirement.partition("==")
    proc = subprocess.run([sys.executable, "-m", "pip", "index", "versions", name, "--retries", "0", "--timeout", "10"], env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        return f"`pip index versions {name}` failed: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}"
    listed = re.search(r"Available versions: (.*)", proc.stdout)
    if listed is None or version not in [v.strip() for v in listed.group(1).split(",")]:
        return f"{version} is not among the versions the index lists"
    return None


@pytest.mark.slow
def test_wheel_without_extras_keeps_other_projects_green_and_runs_the_ready_test_as_the_readme_says(tmp_path):
    """A new user's environment, from the built wheel: a fresh virtual environment, the CPU torch of
    the README's first line (never a bare ``torch`` requirement: that pulls the multi-GB CUDA
    build), the package with no extras.  The README's install lines run as written, by the shell, in
    another project's folder (``$MOE_FQ_PARITY`` a copy of the checkout: they build the wheel and
    install it, reaching only the package registries).  An unrelated project with its own tests
    passes its pytest there (the ``pytest11`` plugin loads without Hypothesis); the example project
    runs the ready parity test and gets the counts its README quotes.

    Cost on the 2-core CPU machine: about 2-3 minutes, mostly installing torch into the new
    environment (``slow``: ``.ci/run`` runs it once, in its own step)."""
    import torch

    env = {k: v for k, v in _env().items() if k not in ("VIRTUAL_ENV", "MOE_FQ_ROOT", "PYTHONHOME", "PIP_NO_BUILD_ISOLATION")}
    cpu_torch = f"torch=={torch.__version__.split('+')[0]}"
    if (why := _uninstallable(cpu_torch, env)) is not None:
        pytest.skip(f"a new user's environment needs {cpu_torch} from a package index: {why}")
    src = tmp_path / "src"  # the checkout's files (tracked and new, not ignored): the build leaves nothing in the checkout
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for rel in filter(None, files.decode().split("\0")):
        if (REPO / rel).is_file():
            (src / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, src / rel)
    venv = tmp_path / "venv"
    _sh([sys.executable, "-m", "venv", str(venv)], tmp_path, env)
    py = str(venv / "bin" / "python")
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    env["MOE_FQ_PARITY"] = str(src)
    home = tmp_path / "their_project"  # where the README's lines run: another project's folder
    home.mkdir()
    lines = _readme_install_lines()
    assert lines[0] == cpu_torch.join(("pip install ", "")), lines  # the CPU torch first: never a bare torch requirement
    for line in lines:  # exactly as written, by the shell (its glob and $MOE_FQ_PARITY), with the new environment's pip
        _sh(["bash", "-c", line], home, env)
    no_hypothesis = subprocess.run([py, "-c", "import hypothesis"], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert no_hypothesis.returncode != 0, "Hypothesis is installed: not a base install"
    assert subprocess.run([py, "-c", "import torch; assert torch.version.cuda is None"], env=env).returncode == 0, "a CUDA torch came in"

    other = tmp_path / "unrelated_project"
    other.mkdir()
    (other / "test_unrelated.py").write_text("def test_arithmetic():\n    assert 1 + 1 == 2\n")
    proc = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=other, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and _counts(_summary(proc.stdout)) == {"passed": 1}, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Error while loading" not in proc.stdout + proc.stderr

    proj = _project(tmp_path)
    for command in ("python -m pytest --parity-suite smoke", "python -m pytest"):
        args = shlex.split(command)[3:]
        proc = subprocess.run([py, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args], cwd=proj, env=env, capture_output=True,
                              text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert _counts(_summary(proc.stdout)) == readme_counts(command), (command, _summary(proc.stdout))
    where = _sh([py, "-c", "import moe_fq_parity.harness as h; print(h.__file__)"], proj, env).stdout.strip()
    assert Path(where).is_relative_to(venv), where
