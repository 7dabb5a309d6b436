"""One-line commands that rerun exactly one case and check (the ``repro`` field of every record)."""

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
