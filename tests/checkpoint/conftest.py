"""Fixtures of the distributed checkpoint tests.

``gloo_run`` is the CPU matrix (``LAYOUTS``: five layouts of up to 8 gloo ranks, every save ->
load pair, both quantizer layouts, three formats, negative controls, bad inputs) plus the launcher
probes, computed once per test run; ``test_matrix.py::test_every_layout_up_to_eight_ranks``
(``slow``) runs all seven layouts.  Under ``pytest -n`` every xdist worker that needs it takes a file lock in the run's shared
temp folder: the first computes and writes JSON, the others read it, so the ranks are started
once per run, not once per worker.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from moe_fq_parity.harness.sections import SectionRow
from moe_fq_parity.harness.sections.checkpoint.layout import parse_layout
from moe_fq_parity.harness.sections.checkpoint.matrix import DistPlan, run_plan

from . import probes

MAX_WORLD = 8
"""Gloo ranks are cheap on 2 cores with tiny tensors; 8 covers EP=8 and TP=2 x EP=4."""
LAYOUTS = tuple(parse_layout(x) for x in ("tp1ep1", "tp1ep2", "tp2ep1", "tp2ep2", "tp1ep8"))
"""The default tier's matrix: EP 1, 2 and 8 (one expert a rank), TP 1 and 2, TP x EP; 25 save ->
load pairs, 462 rows, 14.5 s on an idle 2-core machine against 30.7 s for the 49 pairs of all seven
layouts of ``matrix_layouts(MAX_WORLD)`` (EP=4 and TP=2 x EP=4 added), which the ``slow`` tier and
the ``ci``/``nightly`` report's dist section run."""
DEFAULT_SEED = 1234


@dataclass(frozen=True)
class DistRun:
    """Verdicts of the matrix and outcomes of the launcher probes; for a matrix run as the section's
    command (``megatron_run``), its exit status and stderr."""

    seed: int
    verdicts: tuple[SectionRow, ...]
    probes: dict
    returncode: int = 0
    stderr: str = ""

    def rows(self, prefix: str) -> list[SectionRow]:
        return [v for v in self.verdicts if v.id.startswith(prefix)]

    def to_json(self) -> dict:
        return {"seed": self.seed, "verdicts": [v.to_json() for v in self.verdicts], "probes": self.probes, "returncode": self.returncode,
                "stderr": self.stderr}

    @classmethod
    def from_json(cls, d: dict) -> "DistRun":
        return cls(d["seed"], tuple(SectionRow.from_json(v) for v in d["verdicts"]), d["probes"], d.get("returncode", 0), d.get("stderr", ""))


def _compute(seed: int, workdir: Path) -> DistRun:
    """The matrix, with the launcher probes beside it in one thread: they mostly wait (a 3 s
    deadline, a 2 s collective timeout: 7.4 s alone on 2 cores, two ranks each) while the matrix
    keeps the CPUs busy."""
    with ThreadPoolExecutor(1, thread_name_prefix="dist-probes") as pool:
        outcomes = pool.submit(lambda: {name: probes.outcome(name) for name in probes.PROBES})
        verdicts = run_plan(DistPlan(seed, LAYOUTS, LAYOUTS), str(workdir))
        return DistRun(seed, tuple(verdicts), outcomes.result())


MEGATRON_LAYOUTS = ("tp1ep1", "tp1ep2", "tp2ep2")
"""The Megatron-Core engine's CI matrix: EP grows and shrinks, TP on and off (9 save -> load
pairs, every format, quantizer layout and negative control); the report's ``dist`` section runs
it over the full matrix.  ~40 s wall on the shared 2-core machine, nearly all of it Megatron-Core's
save (each rank imports it, ~1.2 s, and its first save spawns a ``multiprocessing`` manager, ~1.6 s)."""


def _shared_run(tmp_path_factory: pytest.TempPathFactory, name: str, compute) -> DistRun:
    """Compute once per test run; under xdist the first worker computes, the others read JSON."""
    root = tmp_path_factory.getbasetemp()
    uid = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if uid:
        root = root.parent
    name = f"{name}-{uid or 'local'}"
    result = root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if result.exists():
            return DistRun.from_json(json.loads(result.read_text()))
        run = compute(root / f"{name}-work")
        tmp = result.with_suffix(".tmp")
        tmp.write_text(json.dumps(run.to_json()))
        os.replace(tmp, result)
        return run


@pytest.fixture(scope="session")
def megatron_run(tmp_path_factory: pytest.TempPathFactory, dist_seed: int) -> DistRun:
    """The matrix with Megatron-Core ``dist_checkpointing`` as the engine (skips with the pip hint
    when it is not installed), run as the dist section's command
    (``python -m moe_fq_parity.harness.sections.checkpoint --engine megatron``, ``PYTHONWARNINGS``
    unset) so that its stderr is the user's: ``test_the_section_with_megatron_prints_no_third_party_warnings`` checks it for third-party
    warnings, and this one run of 14 ranks (each importing Megatron-Core, saving or loading
    through it) replaces the separate 4-rank section run that check used to start (~15 s wall)."""
    from moe_fq_parity.harness.sections.checkpoint.engines import ENGINES

    ok, why = ENGINES["megatron"].available("cpu")
    if not ok:
        pytest.skip(why)

    def compute(workdir: Path) -> DistRun:
        workdir.mkdir(parents=True, exist_ok=True)
        rows = workdir / "rows.json"
        layouts = ",".join(MEGATRON_LAYOUTS)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARNINGS")}
        proc = subprocess.run([sys.executable, "-m", "moe_fq_parity.harness.sections.checkpoint", "--save", layouts, "--load", layouts,
                               "--engine", "megatron", "--seed", str(dist_seed), "--json", str(rows)],
                              cwd=workdir, env=env, capture_output=True, text=True, timeout=900)
        if proc.returncode not in (0, 1) or not rows.exists():  # 1: some row failed, which the tests explain
            raise RuntimeError(f"the dist section exited with {proc.returncode}:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
        verdicts = tuple(SectionRow.from_json(v) for v in json.loads(rows.read_text()))
        return DistRun(dist_seed, verdicts, {}, proc.returncode, proc.stderr)

    return _shared_run(tmp_path_factory, f"megatron-run-s{dist_seed}", compute)


@pytest.fixture(scope="session")
def dist_seed(request: pytest.FixtureRequest) -> int:
    """The parity plugin's seed when it is loaded, else ``PARITY_SEED``, else 1234."""
    if request.config.pluginmanager.hasplugin("moe_fq_parity.harness.run.pytest_plugin"):
        return request.getfixturevalue("parity_settings").seed
    return int(os.environ.get("PARITY_SEED", DEFAULT_SEED))


@pytest.fixture(scope="session")
def gloo_run(tmp_path_factory: pytest.TempPathFactory, dist_seed: int) -> DistRun:
    """The shared CPU run (see the module docstring)."""
    return _shared_run(tmp_path_factory, f"dist-run-s{dist_seed}", lambda workdir: _compute(dist_seed, workdir))
