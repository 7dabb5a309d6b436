"""The CPU gloo matrix: every (save layout -> load layout) pair, invariance, content, negative
controls and bad inputs, judged from one shared run (``conftest.gloo_run``: the five layouts of
``conftest.LAYOUTS``); ``test_every_layout_up_to_eight_ranks`` (``slow``) runs all seven."""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.sections.checkpoint.layout import matrix_layouts
from moe_fq_parity.harness.sections.checkpoint.quant import QUANT_FORMATS
from moe_fq_parity.harness.sections.checkpoint.shards import QLAYOUTS, qlayout_applies

from moe_fq_parity.harness.sections.checkpoint.matrix import DistPlan, run_plan

from .conftest import LAYOUTS, MAX_WORLD

pytestmark = pytest.mark.dist

BAD_KINDS = (
    "fewer_experts",
    "more_experts",
    "shape",
    "format",
    "qlayout",
    "truncated_data",
    "truncated_metadata",
    "garbled_metadata",
    "unsafe_metadata",
    "bytes_entry",
    "missing_dir",
)


def _explain(rows) -> str:
    return "\n".join(f"{r.id}: {r.verdict}: {r.message[:600]}" for r in rows)


def _all_pass(rows, expected_count: int) -> None:
    assert len(rows) == expected_count, f"expected {expected_count} rows, got {len(rows)}:\n{_explain(rows)}"
    failed = [r for r in rows if r.verdict != "pass"]
    assert not failed, _explain(failed)


def test_every_stage_ran(gloo_run):
    """No save or load layout lost its ranks (those give ``save/...``/``load/...`` fail rows)."""
    broken = gloo_run.rows("save/") + gloo_run.rows("load/")
    assert not broken, _explain(broken)


def test_matrix_covers_issue_6_layouts():
    """EP 1, 2, 4, 8 and TP 1, 2 wherever the world fits 8 ranks; the default tier's five keep EP 1, 2
    and 8 (one expert a rank), TP 1 and 2 and TP x EP."""
    assert {(lay.tp, lay.ep) for lay in matrix_layouts(MAX_WORLD)} == {(1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4)}
    assert {(lay.tp, lay.ep) for lay in LAYOUTS} == {(1, 1), (1, 2), (1, 8), (2, 1), (2, 2)}


@pytest.mark.slow
def test_every_layout_up_to_eight_ranks(tmp_path, dist_seed):
    """All seven layouts, all 49 save -> load pairs: every row passes (the negative controls pass
    by being caught), no stage lost its ranks, and every pair has its round-trip rows."""
    layouts = tuple(matrix_layouts(MAX_WORLD))
    rows = run_plan(DistPlan(dist_seed, layouts, layouts), str(tmp_path))
    failed = [r for r in rows if r.verdict != "pass"]
    assert not failed, _explain(failed)
    for save in layouts:
        for load in layouts:
            got = [r for r in rows if r.id.startswith((f"roundtrip/{save.id}->{load.id}/", f"refused/{save.id}->{load.id}/"))]
            assert len(got) == CHECKPOINTS, (save.id, load.id, len(got))


VECTOR_FORMATS = [q for q, f in QUANT_FORMATS.items() if qlayout_applies("vector_per_key", f)]
CHECKPOINTS = sum(qlayout_applies(ql, f) for ql in QLAYOUTS for f in QUANT_FORMATS.values())
"""Checkpoints per save layout: every format in every quantizer layout it is written in."""


def _refused(save, load) -> int:
    """``vector_per_key`` keys are local: loads onto ranks holding more experts than the writer's are refused."""
    return len(VECTOR_FORMATS) if load.num_local_experts(8) > save.num_local_experts(8) else 0


@pytest.mark.parametrize("save,load", [(s, lo) for s in LAYOUTS for lo in LAYOUTS], ids=lambda lay: lay.id)
def test_roundtrip(gloo_run, save, load):
    """Saved under ``save``, loaded under ``load``: every expert's amax, weight and fake-quantized
    weight equals the single-process copy and the TP=1/EP=1 truth, every quantizer layout, all
    formats; the ``[N_global]``-vector checkpoints a layout cannot read are refused on every rank
    with the missing key named."""
    refused = gloo_run.rows(f"refused/{save.id}->{load.id}/")
    _all_pass(gloo_run.rows(f"roundtrip/{save.id}->{load.id}/"), CHECKPOINTS - _refused(save, load))
    _all_pass(refused, _refused(save, load))
    assert all("vector_per_key" in r.id and "missing" in r.message for r in refused)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.id)
def test_layout_invariance(gloo_run, layout):
    """Per-expert/per-channel amax, NVFP4 block and global amax, block scales and fake-quantized
    weights after the sync step equal the TP=1/EP=1 values bit for bit."""
    _all_pass(gloo_run.rows(f"invariance/{layout.id}/"), len(QUANT_FORMATS))


def test_checkpoint_content(gloo_run):
    """Each checkpoint, loaded whole by one process without a process group, holds the truth."""
    _all_pass(gloo_run.rows("content/"), len(LAYOUTS) * CHECKPOINTS)


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.ep > 1], ids=lambda lay: lay.id)
def test_local_index_writer_is_caught(gloo_run, layout):
    """Negative control: amax keyed by local expert index (dedup keeps one rank's experts) fails
    both the content check and the same-layout round trip, in both quantizer layouts."""
    content = gloo_run.rows(f"negative/local_index/content/{layout.id}/")
    roundtrip = gloo_run.rows(f"negative/local_index/{layout.id}->{layout.id}/")
    local_qlayouts = [q for q in QLAYOUTS if q != "vector_per_key"]
    _all_pass(content, 2 * len(local_qlayouts))
    _all_pass(roundtrip, 2 * len(local_qlayouts))
    assert all("caught" in r.message for r in content + roundtrip)


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.tp > 1], ids=lambda lay: lay.id)
def test_forgotten_global_amax_sync_is_caught(gloo_run, layout):
    """Negative control: a TP sync that skips ``_global_amax`` is caught by the invariance check."""
    rows = gloo_run.rows(f"negative/no_global_amax_sync/{layout.id}/")
    _all_pass(rows, sum(any(b.name == "_global_amax" for b in f.buffers) for f in QUANT_FORMATS.values()))
    assert all("_global_amax" in r.message for r in rows)


def test_silent_payload_bitflip_is_caught(gloo_run):
    """Negative control: DCP loads a checkpoint with one flipped payload bit without an error
    (no checksums); the content check against the truth names the key and element."""
    rows = gloo_run.rows("negative/payload_bitflip/content/")
    _all_pass(rows, 1)
    assert "weight0: 1/" in rows[0].message or "weight: 1/" in rows[0].message, rows[0].message


@pytest.mark.parametrize("kind", BAD_KINDS)
def test_bad_input_refused(gloo_run, kind):
    """Every rank of every load layout refuses the checkpoint with the expected error class and a
    message naming the key and both shapes (or why the file is unreadable / unsafe)."""
    _all_pass(gloo_run.rows(f"bad_input/{kind}/"), len(LAYOUTS))


def test_bad_kinds_listed_here_are_all_built(gloo_run):
    """The kinds above are exactly the ones the run built (a new kind gets a test)."""
    assert {r.id.split("/")[1] for r in gloo_run.rows("bad_input/")} == set(BAD_KINDS)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.id)
def test_per_expert_formats_keep_per_expert_granularity(gloo_run, layout):
    """After the sync steps every per-expert format's scales are each expert's own."""
    per_expert = [q for q, f in QUANT_FORMATS.items() if f.experts == "per_expert"]
    _all_pass(gloo_run.rows(f"granularity/{layout.id}/"), len(per_expert))


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.ep > 1], ids=lambda lay: lay.id)
def test_shared_expert_amax_needs_the_ep_sync(gloo_run, layout):
    """Shared-expert formats: leaving out the EP sync, or its ``_global_amax`` part, is caught."""
    shared = [q for q, f in QUANT_FORMATS.items() if f.experts == "shared"]
    with_global = [q for q in shared if any(b.name == "_global_amax" for b in QUANT_FORMATS[q].buffers)]
    _all_pass(gloo_run.rows(f"negative/no_ep_sync/{layout.id}/"), len(shared))
    rows = gloo_run.rows(f"negative/no_ep_global_amax_sync/{layout.id}/")
    _all_pass(rows, len(with_global))
    assert all("_global_amax" in r.message for r in rows)


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.ep > 1], ids=lambda lay: lay.id)
def test_ep_sync_on_per_expert_state_is_reported_with_expert_indices(gloo_run, layout):
    """The cross-change hazard: an EP all-reduce over per-expert quantizers is a per-expert
    granularity violation naming the experts whose scales it changed."""
    per_expert = [q for q, f in QUANT_FORMATS.items() if f.experts == "per_expert"]
    rows = gloo_run.rows(f"hazard/ep_sync_on_per_expert/{layout.id}/")
    _all_pass(rows, len(per_expert))
    for r in rows:
        assert "per-expert granularity violation" in r.message and "experts [" in r.message, r.message
        assert r.fields["experts_changed"], r.fields


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.id)
def test_vector_format_writer_forcing_per_channel_amax_is_caught(gloo_run, layout):
    """Negative control: a per-channel amax squeezed into the ``[N_global]`` vector fails the
    content check and the same-layout round trip."""
    content = gloo_run.rows(f"negative/vector_channel/content/{layout.id}/")
    roundtrip = gloo_run.rows(f"negative/vector_channel/{layout.id}->{layout.id}/")
    _all_pass(content + roundtrip, 2)


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.tp > 1], ids=lambda lay: lay.id)
def test_vector_sliced_at_the_global_rank_is_caught(gloo_run, layout):
    """Negative control: under TP > 1, slicing the vector at the global rank instead of the EP rank."""
    rows = gloo_run.rows("negative/vector_global_rank/")
    rows = [r for r in rows if f"->{layout.id}/" in r.id]
    _all_pass(rows, 2)


def test_vector_size_mismatch_is_refused_unless_opted_in(gloo_run):
    """A vector of the wrong size: refused with the key and both sizes; skipped *and reported*
    when opted in; a loader that skips it silently is caught by the state check."""
    refused = gloo_run.rows("vector_size/refused/")
    _all_pass(refused, len(VECTOR_FORMATS))
    assert all("(7,)" in r.message and "(8,)" in r.message and "weight_quantizer_0." in r.message for r in refused)
    _all_pass(gloo_run.rows("vector_size/opt_in_skip/"), len(VECTOR_FORMATS))
    silent = gloo_run.rows("negative/vector_silent_skip/")
    _all_pass(silent, len(VECTOR_FORMATS))
    assert all("got nan" in r.message for r in silent)
