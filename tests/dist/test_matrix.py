"""The CPU gloo matrix: every (save layout -> load layout) pair, invariance, content, negative
controls and bad inputs, judged from one shared run (``conftest.gloo_run``)."""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.sections.dist.layout import matrix_layouts
from moe_fq_parity.harness.sections.dist.quant import QUANT_FORMATS
from moe_fq_parity.harness.sections.dist.shards import QLAYOUTS

from .conftest import MAX_WORLD

pytestmark = pytest.mark.dist

LAYOUTS = matrix_layouts(MAX_WORLD)
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
    """EP 1, 2, 4, 8 and TP 1, 2 wherever the world fits 8 ranks."""
    assert {(lay.tp, lay.ep) for lay in LAYOUTS} == {(1, 1), (1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4)}


@pytest.mark.parametrize("save,load", [(s, lo) for s in LAYOUTS for lo in LAYOUTS], ids=lambda lay: lay.id)
def test_roundtrip(gloo_run, save, load):
    """Saved under ``save``, loaded under ``load``: every expert's amax, weight and fake-quantized
    weight equals the single-process copy and the TP=1/EP=1 truth, both quantizer layouts, all formats."""
    _all_pass(gloo_run.rows(f"roundtrip/{save.id}->{load.id}/"), len(QLAYOUTS) * len(QUANT_FORMATS))


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda lay: lay.id)
def test_layout_invariance(gloo_run, layout):
    """Per-expert/per-channel amax, NVFP4 block and global amax, block scales and fake-quantized
    weights after the sync step equal the TP=1/EP=1 values bit for bit."""
    _all_pass(gloo_run.rows(f"invariance/{layout.id}/"), len(QUANT_FORMATS))


def test_checkpoint_content(gloo_run):
    """Each checkpoint, loaded whole by one process without a process group, holds the truth."""
    _all_pass(gloo_run.rows("content/"), len(LAYOUTS) * len(QLAYOUTS) * len(QUANT_FORMATS))


@pytest.mark.parametrize("layout", [lay for lay in LAYOUTS if lay.ep > 1], ids=lambda lay: lay.id)
def test_local_index_writer_is_caught(gloo_run, layout):
    """Negative control: amax keyed by local expert index (dedup keeps one rank's experts) fails
    both the content check and the same-layout round trip, in both quantizer layouts."""
    content = gloo_run.rows(f"negative/local_index/content/{layout.id}/")
    roundtrip = gloo_run.rows(f"negative/local_index/{layout.id}->{layout.id}/")
    _all_pass(content, 2 * len(QLAYOUTS))
    _all_pass(roundtrip, 2 * len(QLAYOUTS))
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
