"""Megatron-Core ``dist_checkpointing`` as the checkpoint engine, for real, on CPU with gloo.

``megatron_run`` (conftest) runs the same matrix as the DCP tests over ``MEGATRON_LAYOUTS``, as
the dist section's command (its JSON rows judged here, its stderr in ``test_quiet_imports``):
every round trip passes, every negative control is caught.  Megatron-Core 0.16.1's save makes
two CUDA calls (``engines.CUDA_CALLS_ON_SAVE``); ``test_save_needs_cuda_only_for_two_calls``
shows exactly that on a one-rank gloo group.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from moe_fq_parity.harness.sections.checkpoint import engines
from moe_fq_parity.harness.sections.checkpoint.layout import parse_layout
from moe_fq_parity.harness.sections.checkpoint.quant import QUANT_FORMATS
from moe_fq_parity.harness.sections.checkpoint.shards import QLAYOUTS, qlayout_applies

from .conftest import MEGATRON_LAYOUTS

pytestmark = pytest.mark.dist

LAYOUTS = [parse_layout(x) for x in MEGATRON_LAYOUTS]
CHECKPOINTS = sum(qlayout_applies(ql, f) for ql in QLAYOUTS for f in QUANT_FORMATS.values())
VECTOR_FORMATS = sum(qlayout_applies("vector_per_key", f) for f in QUANT_FORMATS.values())


def _explain(rows) -> str:
    return "\n".join(f"{r.id}: {r.verdict}: {r.message[:500]}" for r in rows)


def _all_pass(rows, n: int) -> None:
    assert len(rows) == n, f"expected {n} rows, got {len(rows)}:\n{_explain(rows)}"
    bad = [r for r in rows if r.verdict != "pass"]
    assert not bad, _explain(bad)


def test_every_stage_ran_and_nothing_failed(megatron_run):
    assert not megatron_run.rows("save/tp") and not megatron_run.rows("load/"), _explain(megatron_run.rows("save/") + megatron_run.rows("load/"))
    bad = [v for v in megatron_run.verdicts if v.verdict != "pass"]
    assert not bad, _explain(bad)


@pytest.mark.parametrize("save,load", [(s, lo) for s in LAYOUTS for lo in LAYOUTS], ids=lambda lay: lay.id)
def test_roundtrip(megatron_run, save, load):
    """Saved with ``dist_checkpointing.save`` under ``save`` (global expert offsets in the
    ShardedTensors), loaded with ``dist_checkpointing.load`` under ``load``: bit for bit."""
    refused = VECTOR_FORMATS if load.num_local_experts(8) > save.num_local_experts(8) else 0
    _all_pass(megatron_run.rows(f"roundtrip/{save.id}->{load.id}/"), CHECKPOINTS - refused)
    _all_pass(megatron_run.rows(f"refused/{save.id}->{load.id}/"), refused)


def test_negative_controls_fail_on_megatron_too(megatron_run):
    """Local expert index keys: Megatron-Core refuses to *save* the per-expert-key form (its
    sharding validation sees two ranks writing one key as the main replica); the stacked form it
    saves, and the content and round-trip checks catch it.  A TP sync that forgets
    ``_global_amax``, shared amax without the EP sync, the EP sync on per-expert state, and the
    ``[N_global]``-vector bugs are caught as with DCP."""
    refused_at_save = megatron_run.rows("negative/local_index/save/")
    assert refused_at_save and all("Invalid access pattern" in r.message for r in refused_at_save), _explain(refused_at_save)
    for prefix in ("negative/local_index/content/", "negative/no_global_amax_sync/", "negative/no_ep_sync/", "hazard/ep_sync_on_per_expert/",
                   "negative/vector_channel/", "negative/vector_global_rank/", "negative/payload_bitflip/"):
        rows = megatron_run.rows(prefix)
        assert rows and all(r.verdict == "pass" and "caught" in r.message for r in rows), (prefix, _explain(rows))


def test_the_section_with_megatron_prints_no_third_party_warnings(megatron_run):
    """The dist section's Megatron-Core rows (each rank is a process that imports Megatron-Core and
    saves or loads through it) printed 22 warning lines for one save and one load layout before, none
    now (a whole smoke ``run`` printed 87 and 162).  ``megatron_run`` is the section's command over
    the Megatron matrix (3 save x 3 load layouts, 14 ranks, ``PYTHONWARNINGS`` unset, stderr kept),
    so this check starts no ranks of its own."""
    assert megatron_run.returncode == 0, megatron_run.stderr[-2000:]
    assert "Warning" not in megatron_run.stderr, megatron_run.stderr[-3000:]


def test_cpu_shim_restores_torch_cuda():
    before = torch.cuda.synchronize, torch.cuda.current_device
    with pytest.raises(RuntimeError, match="boom"):
        with engines.cpu_shim():
            if not torch.cuda.is_available():
                assert torch.cuda.current_device() == torch.device("cpu")
            raise RuntimeError("boom")
    assert (torch.cuda.synchronize, torch.cuda.current_device) == before


@pytest.mark.skipif(torch.cuda.is_available(), reason="shows what needs CUDA on a host without it")
def test_save_needs_cuda_only_for_two_calls(tmp_path):
    """Without the shim, ``dist_checkpointing.save`` fails in ``preload_tensors`` (synchronize);
    with only that call replaced it fails in ``save_state_dict_async_finalize`` (current_device);
    with both replaced it saves and ``load`` reads it back (one gloo rank)."""
    ok, why = engines.ENGINES["megatron"].available("cpu")
    if not ok:
        pytest.skip(why)
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing import ShardedTensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        t = torch.arange(6, dtype=torch.float32)
        sd = lambda x: {"w": ShardedTensor.from_rank_offsets("w", x, replica_id=0)}  # noqa: E731
        os.makedirs(tmp_path / "a")
        with pytest.raises(Exception, match="not compiled with CUDA") as first:
            dist_checkpointing.save(sd(t.clone()), str(tmp_path / "a"))
        assert "preload_tensors" in "".join(str(f.name) for f in first.traceback)
        os.makedirs(tmp_path / "b")
        sync = torch.cuda.synchronize
        torch.cuda.synchronize = lambda *a, **k: None
        try:
            with pytest.raises(Exception, match="not compiled with CUDA") as second:
                dist_checkpointing.save(sd(t.clone()), str(tmp_path / "b"))
        finally:
            torch.cuda.synchronize = sync
        assert "save_state_dict_async_finalize" in "".join(str(f.name) for f in second.traceback)
        os.makedirs(tmp_path / "c")
        with engines.cpu_shim():
            dist_checkpointing.save(sd(t.clone()), str(tmp_path / "c"))
        back = dist_checkpointing.load(sd(torch.full((6,), float("nan"))), str(tmp_path / "c"))
        assert torch.equal(back["w"], t)
    finally:
        dist.destroy_process_group()
