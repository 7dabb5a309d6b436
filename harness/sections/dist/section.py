"""The report section ``dist``: every (save layout -> load layout, quantizer layout, format) pair.

``run(suite, seed, device)`` runs the matrix (``harness.sections.dist.matrix``) for each checkpoint
engine -- DCP, and Megatron-Core ``dist_checkpointing`` (rows prefixed ``megatron/``) -- with the
same negative controls, and returns one ``Section`` whose rows are the verdicts: ``roundtrip/...`` pairs,
``invariance/...`` layouts, ``content/...`` checkpoints, ``negative/...`` controls (pass = the
deliberate bug was caught), ``bad_input/...`` refusals; an engine that cannot run here is one
``skip`` row with the reason.

Suites: ``smoke`` -- layouts of up to 2 ranks; ``ci``, ``nightly``, ``ultra`` -- up to 8 ranks
(on CUDA: up to the number of GPUs, at least 2 needed).
"""

from __future__ import annotations

import shlex
import tempfile
from dataclasses import replace
from typing import Union

import torch

from moe_fq_parity.cases.catalogue import parse_suite, suite_table
from moe_fq_parity.harness.sections import Section, SectionRow

from .checks import Verdict
from .engines import ENGINES
from .layout import matrix_layouts
from .matrix import DistPlan, run_plan

SUITE_MAX_WORLD = suite_table({"smoke": 2, "ci": 8, "nightly": 8, "ultra": 8}, what="dist SUITE_MAX_WORLD")
COLUMNS = ["save", "load", "qlayout", "format", "engine", "tensors", "mismatches"]
TITLE = "Distributed checkpoints: per-expert quantizer state across TP/EP layouts"


def plan_for(suite: str, seed: int, device: str) -> Union[DistPlan, str]:
    """The DCP plan of a suite on a device, or the reason it cannot run here."""
    suite = parse_suite(suite)
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    max_world = SUITE_MAX_WORLD[suite]
    if device == "cuda":
        gpus = torch.cuda.device_count()
        if gpus < 2:
            return f"NCCL runs need at least 2 GPUs, found {gpus}"
        max_world = min(max_world, gpus)
    layouts = tuple(matrix_layouts(max_world))
    return DistPlan(seed, layouts, layouts, device=device)


def repro(v: SectionRow, seed: int, device: str) -> str:
    """A command that reruns the save and load layouts a row involves."""
    f = v.fields
    save = f.get("save") or ("tp1ep1" if "load" in f else "")
    load = f.get("load") or save
    args = ["python", "-m", "moe_fq_parity.harness.sections.dist", "--seed", str(seed), "--device", device, "--engine", str(f.get("engine", "dcp"))]
    if save:
        args += ["--save", save, "--load", load]
    return shlex.join(args)


def to_section(verdicts: list[SectionRow], seed: int, device: str, notes: str = "") -> Section:
    """Rows in run order; shown fields restricted to ``COLUMNS``."""
    rows = [
        SectionRow(v.id, v.verdict, {k: v.fields[k] for k in COLUMNS if k in v.fields}, repro(v, seed, device), v.message)
        for v in verdicts
    ]
    return Section(name="dist", title=TITLE, columns=COLUMNS, rows=rows, notes=notes)


def engine_row(v: SectionRow, engine: str) -> SectionRow:
    """Rows of the reference engine (``dcp``) keep their ids; another engine's are prefixed with
    its name (``megatron/roundtrip/...``), so both engines' rows stand side by side, unique."""
    if engine == "dcp" or v.id.startswith(f"engine/{engine}"):
        return v
    return replace(v, id=f"{engine}/{v.id}", fields={**v.fields, "engine": engine})


def engine_tally(engine: str, verdicts: list[SectionRow]) -> str:
    """``engine (version): P pass, F fail, S skip`` for the notes (the side-by-side summary)."""
    counts = {k: sum(v.verdict == k for v in verdicts) for k in ("pass", "fail", "skip")}
    version = ENGINES[engine].version() if hasattr(ENGINES[engine], "version") else ""
    label = f"{engine} ({'megatron-core ' + version})" if engine == "megatron" and version else engine
    return f"{label}: {counts['pass']} pass, {counts['fail']} fail, {counts['skip']} skip"


def run(suite: str, seed: int, device: str) -> Section:
    """The ``dist`` section (see the module docstring)."""
    plan = plan_for(suite, seed, device)
    note = ""
    if isinstance(plan, str) and device == "cuda":
        # one GPU: the gloo matrix on the host's CPUs still runs; NCCL is reported as skipped
        note = f"NCCL skipped ({plan}); this table is the gloo run on CPU"
        device = "cpu"
        plan = plan_for(suite, seed, device)
    if isinstance(plan, str):
        return to_section([Verdict("dist", "skip", {}, plan)], seed, device)
    verdicts: list[SectionRow] = []
    tallies = []
    with tempfile.TemporaryDirectory(prefix="parity-dist-") as workdir:
        for engine in ENGINES:
            # Every engine runs the same matrix and the same negative controls: a bug must be
            # caught whichever engine wrote and read the checkpoint.
            engine_verdicts = run_plan(replace(plan, engine=engine), f"{workdir}/{engine}")
            verdicts += [engine_row(v, engine) for v in engine_verdicts]
            tallies.append(engine_tally(engine, engine_verdicts))
    layouts = ", ".join(lay.id for lay in plan.save_layouts)
    notes = f"{'NCCL' if device == 'cuda' else 'gloo'} ranks per layout; layouts {layouts}; model {plan.cfg.id}; seed {seed}; " + "; ".join(tallies)
    if note:
        notes += f"; {note}"
    return to_section(verdicts, seed, device, notes)
