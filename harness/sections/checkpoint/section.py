"""The report section ``dist``: every (save layout -> load layout, quantizer layout, format) pair.

``run(suite, seed, device)`` runs the matrix (``harness.sections.checkpoint.matrix``) for each checkpoint
engine -- DCP, and Megatron-Core ``dist_checkpointing`` (rows prefixed ``megatron/``) -- with the
same negative controls, and returns one ``Section`` whose rows are the verdicts: ``roundtrip/...`` pairs,
``invariance/...`` layouts, ``content/...`` checkpoints, ``negative/...`` controls (pass = the
deliberate bug was caught), ``bad_input/...`` refusals; an engine that cannot run here is one
``skip`` row with the reason.

Suites: ``smoke`` -- layouts of up to 2 ranks; ``ci``, ``nightly``, ``ultra`` -- up to 8 ranks
(on CUDA: up to the number of GPUs, at least 2 needed).

``run(..., part=Part(i, n))`` runs part ``i`` of ``n`` of the section (a shard's share: its share of
the save layouts of every engine, with everything that reads their checkpoints,
``matrix.run_plan_blocks``); its blocks are keyed ``(engine index, *matrix key)``.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from typing import Optional, Union

import torch

from moe_fq_parity.cases.catalogue import parse_suite, suite_table
from moe_fq_parity.harness.core.repro import checkpoint_command
from moe_fq_parity.harness.sections import Part, Section, SectionRow, section_from_blocks

from .checks import Verdict
from .engines import ENGINES
from .launch import start_fork_server
from .layout import matrix_layouts
from .matrix import DistPlan, run_plan_blocks

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
    return checkpoint_command(seed, device, str(f.get("engine", "dcp")), save, f.get("load") or save)


def to_rows(verdicts: list[SectionRow], seed: int, device: str, workdir: str = "") -> list[SectionRow]:
    """Rows in run order; shown fields restricted to ``COLUMNS``; the run's temporary folder
    ``workdir`` (deleted after the run) written ``<workdir>`` in messages, so two runs of the same
    seed give the same rows."""
    def message(text: str) -> str:
        return text.replace(workdir, "<workdir>") if workdir else text

    return [SectionRow(v.id, v.verdict, {k: v.fields[k] for k in COLUMNS if k in v.fields}, repro(v, seed, device), message(v.message))
            for v in verdicts]


def engine_row(v: SectionRow, engine: str) -> SectionRow:
    """Rows of the reference engine (``dcp``) keep their ids; another engine's are prefixed with
    its name (``megatron/roundtrip/...``), so both engines' rows stand side by side, unique."""
    if engine == "dcp" or v.id.startswith(f"engine/{engine}"):
        return v
    return replace(v, id=f"{engine}/{v.id}", fields={**v.fields, "engine": engine})


def engine_label(engine: str) -> str:
    """``engine`` with its version where known (``megatron (megatron-core 0.x)``), for the notes."""
    version = ENGINES[engine].version() if hasattr(ENGINES[engine], "version") else ""
    return f"{engine} (megatron-core {version})" if engine == "megatron" and version else engine


def prepare() -> None:
    """Before the section's turn (``harness.sections.processes.start_sections``): start the ranks' fork server."""
    start_fork_server()


def host_only(device: str) -> bool:
    """True when this section uses no GPU on a run on ``device``: on CPU, and on a CUDA host with
    fewer than two GPUs (the gloo matrix on the host's CPUs; ``harness.sections`` then starts it
    beside the run's cases).  ``torch.cuda.device_count`` asks NVML and creates no CUDA context."""
    return device == "cpu" or (device.startswith("cuda") and isinstance(plan_for("smoke", 0, "cuda"), str))


def run(suite: str, seed: int, device: str, part: Optional[Part] = None) -> Section:
    """The ``dist`` section, or its ``part`` (see the module docstring).  The notes do not depend on
    the part (each engine's pass/fail/skip counts are the table's: its rows carry the engine)."""
    plan = plan_for(suite, seed, device)
    note = ""
    if isinstance(plan, str) and device == "cuda":
        # one GPU: the gloo matrix on the host's CPUs still runs; NCCL is reported as skipped
        note = f"NCCL skipped ({plan}); this table is the gloo run on CPU"
        device = "cpu"
        plan = plan_for(suite, seed, device)
    if isinstance(plan, str):
        first = part is None or part.index == 1
        return section_from_blocks("dist", TITLE, COLUMNS, [((0,), to_rows([Verdict("dist", "skip", {}, plan)], seed, device))] if first else [],
                                   part=part)
    blocks = []
    with tempfile.TemporaryDirectory(prefix="parity-dist-") as workdir:
        for e, engine in enumerate(ENGINES):
            # Every engine runs the same matrix and the same negative controls: a bug must be
            # caught whichever engine wrote and read the checkpoint.
            for key, rows in run_plan_blocks(replace(plan, engine=engine), f"{workdir}/{engine}", part):
                blocks.append(((e, *key), to_rows([engine_row(v, engine) for v in rows], seed, device, workdir)))
    layouts = ", ".join(lay.id for lay in plan.save_layouts)
    notes = (f"{'NCCL' if device == 'cuda' else 'gloo'} ranks per layout; layouts {layouts}; model {plan.cfg.id}; seed {seed}; "
             f"engines {', '.join(engine_label(e) for e in ENGINES)}")
    if note:
        notes += f"; {note}"
    return section_from_blocks("dist", TITLE, COLUMNS, blocks, notes, part)
