"""amax policies: how a case's amax is chosen from its data (or from the distribution's design).

* ``max``    -- max calibration (``reference.max_calibrate``) over the finite values: the spec
  rejects a non-finite amax, so NaN/inf inputs are left out of calibration.
* ``clip``   -- the magnitude of an actual element at the 3/4 quantile: values above it clip and
  at least one element sits exactly at ``|x| == amax``.
* ``tiny``   -- cycles ``2**-25, 2**-24, nextafter(2**-24, inf), 2**-23`` over experts/rows
  (both sides of the INT zero-output and FP8 treat-as-one thresholds).
* ``zero``   -- amax 0 on even experts (rows), calibrated max on the others.
* ``design`` -- the amax the distribution constructed.
* ``none``   -- no amax (``None``): the case's format derives its scales from the data (``from_data``).
"""

from __future__ import annotations

import math
from typing import Optional

import torch

from moe_fq_parity.reference import max_calibrate
from moe_fq_parity.reference.constants import TINY_AMAX

from .case import Case


def _calibrated(case: Case, x: torch.Tensor) -> torch.Tensor:
    finite = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype))
    return max_calibrate(finite, "per_channel" if case.granularity == "per_channel" else "per_tensor")


def _clip(case: Case, x: torch.Tensor) -> torch.Tensor:
    mag = torch.where(torch.isfinite(x), x.abs(), torch.zeros((), dtype=x.dtype)).to(torch.float32)
    rows = mag if case.granularity == "per_channel" else mag.reshape(1, -1)
    if rows.shape[-1] == 0:
        return _calibrated(case, x)
    srt = rows.sort(dim=-1).values
    q = srt[:, (3 * (rows.shape[-1] - 1)) // 4]
    q = torch.where(q > 0, q, srt[:, -1])
    return q if case.granularity == "per_channel" else q[0]


def _tiny_cycle(count: int, start: int) -> torch.Tensor:
    t = torch.tensor(TINY_AMAX, dtype=torch.float32)
    options = torch.stack([t / 2, t, torch.nextafter(t, torch.tensor(math.inf)), t * 2])
    return options[(torch.arange(count) + start) % 4]


def expert_amax(case: Case, i: int, x: torch.Tensor, design: Optional[torch.Tensor]) -> Optional[torch.Tensor]:
    """fp32 amax of expert ``i`` (``()`` per expert, ``[out]`` per channel) under ``case.amax``;
    ``None`` under ``none``."""
    if case.amax == "none":
        return None
    rows = x.shape[0] if case.granularity == "per_channel" else 1
    if case.amax == "max":
        return _calibrated(case, x)
    if case.amax == "clip":
        return _clip(case, x)
    if case.amax == "tiny":
        t = _tiny_cycle(rows, i)
        return t if case.granularity == "per_channel" else t[0]
    if case.amax == "zero":
        cal = _calibrated(case, x)
        parity = (torch.arange(rows) + i) % 2 == 0 if case.granularity == "per_channel" else torch.tensor(i % 2 == 0)
        return torch.where(parity, torch.zeros(()), cal)
    if case.amax == "design":
        if design is None:
            raise ValueError(f"case {case.id}: distribution {case.dist!r} designs no amax")
        return design.to(torch.float32)
    raise ValueError(f"unknown amax policy {case.amax!r}")
