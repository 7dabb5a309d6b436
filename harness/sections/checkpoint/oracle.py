"""The single-process truths every distributed result is compared with.

* ``build_truth`` -- the whole model built and calibrated in this process, TP=1/EP=1 (no process
  group, no sync step): full ``[E, ...]`` weights, buffers, derived parameters, fake-quantized
  weights, per format.  Same calibration code as the ranks (``harness.sections.checkpoint.quant``), on the
  whole tensors instead of slices.
* ``truth_entries`` -- what a correct checkpoint of that model holds, key by key.
* ``oracle_state`` -- a checkpoint loaded whole by one process (``safe_io.load_full``), read back
  into the canonical form, so its fake-quantized weights can be computed without any layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from moe_fq_parity.harness.sections import SectionRow

from .checks import assemble, canonical_pieces, diff_bits, missing, verdict_from_diffs
from .layout import Coords, Layout
from .model import FCS, MoEConfig, full_weights
from .quant import calibrate, quant_format, quant_params
from .shards import LocalState, field_tp_axis, from_loaded, full_vectors, key_plan, slice_full, to_specs

TRUTH_LAYOUT = Layout(1, 1)
TRUTH_COORDS = Coords(0, 0)


@dataclass(frozen=True)
class Truth:
    """Everything about the model at TP=1/EP=1.

    * ``weights[fc]``: ``[E, out, in]``;
    * ``states[qf_id][fc][buffer]``: ``[E, ...]`` calibrated buffers;
    * ``params[qf_id]["{fc}/{field}"]``: buffers, derived parameters, ``fq`` and ``weight``.
    """

    cfg: MoEConfig
    seed: int
    weights: dict[str, torch.Tensor]
    states: dict[str, dict[str, dict[str, torch.Tensor]]]
    params: dict[str, dict[str, torch.Tensor]]


def build_truth(cfg: MoEConfig, seed: int, qf_ids: tuple[str, ...]) -> Truth:
    """Build and calibrate the whole model in this process (see the module docstring)."""
    w = {fc: full_weights(cfg, seed, fc) for fc in FCS}
    states, params = {}, {}
    for qf_id in qf_ids:
        qf = quant_format(qf_id)
        states[qf_id] = {fc: calibrate(w[fc], qf) for fc in FCS}
        params[qf_id] = {**quant_params(w, states[qf_id], qf), **{f"{fc}/weight": w[fc] for fc in FCS}}
    return Truth(cfg, seed, w, states, params)


def truth_entries(
    truth: Truth, qlayout: str, qf_id: str, index_mode: str = "global", layout: Layout = TRUTH_LAYOUT
) -> dict[str, torch.Tensor]:
    """``key -> whole tensor`` of a checkpoint of ``truth`` in ``qlayout`` written under ``layout``
    (correct for ``index_mode="global"``).  Only ``vector_per_key`` depends on ``layout``: it
    holds the vector keys of local indices ``i < n_local``."""
    qf = quant_format(qf_id)
    plan = key_plan(truth.cfg, TRUTH_LAYOUT, TRUTH_COORDS, qlayout, qf, index_mode)
    n_local = layout.num_local_experts(truth.cfg.num_experts)
    plan = [e for e in plan if e.vector_index is None or e.local_index < n_local]
    state = full_vectors(LocalState(truth.weights, truth.states[qf_id]), qf, index_mode)
    return {s.key: s.local for s in to_specs(state, plan)}


def oracle_state(full: dict[str, torch.Tensor], cfg: MoEConfig, qlayout: str, qf_id: str, layout: Layout = TRUTH_LAYOUT) -> LocalState:
    """A whole checkpoint (``load_full``) in canonical ``[E, ...]`` form, read as the ranks of
    ``layout`` would read it (``shards.slice_full``) and assembled; ``KeyError`` names a missing
    key, ``ValueError`` a piece that cannot be read or ranks that disagree."""
    qf = quant_format(qf_id)
    ranks = []
    for _, c in layout.all_coords():
        plan = key_plan(cfg, layout, c, qlayout, qf)
        ranks.append((c, from_loaded({e.key: slice_full(full, e, layout, c) for e in plan}, plan)))
    if len(ranks) == 1:
        return ranks[0][1]
    fields = [(fc, "weight") for fc in FCS] + [(fc, b.name) for fc in FCS for b in qf.buffers]
    out = LocalState({}, {fc: {} for fc in FCS})
    for fc, name in fields:
        pieces = []
        shape: tuple[int, ...] = ()
        for c, st in ranks:
            t = st.get(fc, name)
            shape, offsets = canonical_pieces(t, field_tp_axis(fc, name, qf), layout, c, cfg.num_experts)
            pieces.append((offsets, t))
        whole, problems = assemble(pieces, shape, pieces[0][1].dtype)
        if problems:
            raise ValueError(f"{fc}/{name}: " + "; ".join(problems))
        if name == "weight":
            out.weights[fc] = whole
        else:
            out.quant[fc][name] = whole
    return out


def content_verdict(check_id: str, fields: dict, oracle: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> SectionRow:
    """Checkpoint content, loaded whole by one process, against the keys and bits it must hold."""
    diffs = [
        diff_bits(f"ckpt:{k}", v, oracle[k]) if k in oracle else missing(f"ckpt:{k}", f"missing from the checkpoint (expected {tuple(v.shape)})")
        for k, v in expected.items()
    ]
    extra = [f"unexpected key {k!r} {tuple(oracle[k].shape)}" for k in oracle if k not in expected]
    return verdict_from_diffs(check_id, fields, diffs, extra)
