"""The plugin from another project: a throwaway project outside this repository, the installed
package only, the example backend of ``examples/own_kernel`` (correct: passes; rounding half away
from zero: fails with the offender table and a repro command that reruns the failure)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

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
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", *args], cwd=proj, env=_env(),
                          capture_output=True, text=True, timeout=600)


def _summary(out: str) -> str:
    return out.strip().splitlines()[-1] if out.strip() else ""


def test_correct_backend_passes_in_a_project_outside_the_repository(tmp_path):
    proj = _project(tmp_path)
    proc = _pytest(proj, "--parity-suite", "smoke", "-rs")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    summary = _summary(proc.stdout)
    assert "19 passed" in summary and "failed" not in summary, summary
    assert "backend formats ['int8'] do not include fp8_e4m3" in proc.stdout  # other formats skip with the reason
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
    assert "elements differ (tie_flip" in block.splitlines()[0]
    assert "first 10 offenders:" in block and "expert  row  col" in block and "pre_round" in block
    repro_line = next(ln for ln in block.splitlines() if ln.startswith("repro: "))
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
