"""One-line commands that rerun exactly one case and check (the ``repro`` field of every record)."""

from __future__ import annotations

import shlex


def repro_command(case_id: str, backend_spec: str, check: str, seed: int, mode: str = "strict") -> str:
    """``moe-fq-parity run --case ID --backend B --checks C --seed S [--mode M] --no-sections --out parity-repro``.

    ``--no-sections``: the rerun is that one case and check, without the report sections.

    ``--case`` parses the id back into the case (``cases.parse_case``), so fuzz-generated cases that
    are in no suite rerun too.
    """
    parts = ["moe-fq-parity", "run", "--case", case_id, "--backend", backend_spec, "--checks", check, "--seed", str(seed)]
    if mode != "strict":
        parts += ["--mode", mode]
    parts += ["--no-sections", "--out", "parity-repro"]
    return shlex.join(parts)
