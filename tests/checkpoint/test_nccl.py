"""The matrix on GPUs: NCCL, one GPU per rank (``pytest tests/checkpoint -m gpu`` on a 2-GPU machine).

Layouts up to the number of GPUs (2 GPUs: TP1/EP1, TP1/EP2, TP2/EP1, every pair).  The same checks
as the gloo run: round trips against the single-process copy and the truth, invariance, negative
controls, bad inputs; and Megatron-Core ``dist_checkpointing`` when it is installed.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.sections.checkpoint.engines import MegatronEngine
from moe_fq_parity.harness.sections.checkpoint.layout import matrix_layouts
from moe_fq_parity.harness.sections.checkpoint.matrix import DistPlan, run_plan

pytestmark = [
    pytest.mark.dist,
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason=f"needs >= 2 GPUs for NCCL ranks, found {torch.cuda.device_count()}"),
]


def _check(plan: DistPlan, workdir) -> None:
    verdicts = run_plan(plan, str(workdir))
    failed = [v for v in verdicts if v.verdict != "pass"]
    assert not failed, "\n".join(f"{v.id}: {v.verdict}: {v.message[:600]}" for v in failed)
    kinds = {v.id.split("/")[0] for v in verdicts}
    assert {"roundtrip", "invariance", "content", "bad_input"} <= kinds


def _layouts():
    return tuple(matrix_layouts(min(8, torch.cuda.device_count())))


def test_nccl_matrix(tmp_path, dist_seed):
    lays = _layouts()
    _check(DistPlan(dist_seed, lays, lays, device="cuda"), tmp_path)


def test_megatron_engine(tmp_path, dist_seed):
    ok, why = MegatronEngine().available("cuda")
    if not ok:
        pytest.skip(why)
    lays = _layouts()
    _check(DistPlan(dist_seed, lays, lays, device="cuda", engine="megatron", negative_controls=False), tmp_path)
