"""One-line commands that rerun exactly what a record or a section row reports (its ``repro`` field).

One function per kind of command: a case and check (``repro_command``), a self-test mutant
(``selftest_command``), MoE-section rows (``moe_section_command``), a distributed-checkpoint
save/load (``checkpoint_command``) and an external backend's variant match (``variant_match_command``).
"""

from __future__ import annotations

import shlex
from typing import Optional

from .equality import DEFAULT_NAN_BITS
from .tolerances import CALL_TIMEOUT_S


def repro_command(case_id: str, backend_spec: str, check: str, seed: int, mode: str = "strict", *,
                  timeout_s: Optional[float] = CALL_TIMEOUT_S, nan_bits: str = DEFAULT_NAN_BITS) -> str:
    """``moe-fq-parity run --case ID --backend B --checks C --seed S [--mode M] [--nan-bits strict]
    [--timeout T] --no-sections --out parity-repro``.

    ``--no-sections``: the rerun is that one case and check, without the report sections.

    ``--case`` parses the id back into the case (``cases.parse_case``), so fuzz-generated cases that
    are in no suite rerun too.  Every option that changes a verdict is spelled out when it differs
    from the default (``--timeout 0`` for a run without a time limit).
    """
    parts = ["moe-fq-parity", "run", "--case", case_id, "--backend", backend_spec, "--checks", check, "--seed", str(seed)]
    if mode != "strict":
        parts += ["--mode", mode]
    if nan_bits != DEFAULT_NAN_BITS:
        parts += ["--nan-bits", nan_bits]
    if (timeout_s or None) != CALL_TIMEOUT_S:
        parts += ["--timeout", f"{timeout_s or 0:g}"]
    parts += ["--no-sections", "--out", "parity-repro"]
    return shlex.join(parts)


def selftest_command(suite: str, seed: int, mutant: str, case_id: str = "") -> str:
    """``moe-fq-parity selftest --suite S --seed N --mutant M [--case ID]``: one mutant, on one case when given."""
    case = f" --case {case_id}" if case_id else ""
    return f"moe-fq-parity selftest --suite {suite} --seed {seed} --mutant {mutant}{case}"


def moe_section_command(suite: str, seed: int, device: str, row_id: str) -> str:
    """``python -m moe_fq_parity.harness.sections.moe ... --filter 'ROW'``: the MoE rows whose id contains ``row_id``."""
    return f"python -m moe_fq_parity.harness.sections.moe --suite {suite} --seed {seed} --device {device} --filter '{row_id}'"


def checkpoint_command(seed: int, device: str, engine: str, save: str = "", load: str = "") -> str:
    """``python -m moe_fq_parity.harness.sections.checkpoint --seed N --device D --engine E [--save L --load L2]``:
    the distributed-checkpoint matrix, or only the save layout ``save`` loaded as ``load`` (``load``
    defaults to ``save``)."""
    args = ["python", "-m", "moe_fq_parity.harness.sections.checkpoint", "--seed", str(seed), "--device", device, "--engine", engine]
    if save:
        args += ["--save", save, "--load", load or save]
    return shlex.join(args)


def variant_match_command(backend: str, fmt: str, seed: int, n_ties: int, n_split: int, *, narrow_range: bool = False,
                          mx_sizes: Optional[tuple[int, int]] = None) -> str:
    """``python -m moe_fq_parity.harness.sections.external.variant_match --backend B --format F ...``: which
    reference variant ``backend`` matches on ``fmt``, with every mismatching element; ``mx_sizes``:
    ``(shuffles, random blocks)`` of the match cases of a format without amax."""
    narrow = " --narrow-range" if narrow_range else ""
    mx = f" --mx-shuffles {mx_sizes[0]} --mx-random-blocks {mx_sizes[1]}" if mx_sizes is not None else ""
    return (f"python -m moe_fq_parity.harness.sections.external.variant_match --backend {backend} --format {fmt} --seed {seed} "
            f"--n-ties {n_ties} --n-split {n_split}{narrow}{mx}")
