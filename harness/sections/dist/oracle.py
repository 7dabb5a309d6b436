"""The single-process truths every distributed result is compared with.

* ``build_truth`` -- the whole model built and calibrated in this process, TP=1/EP=1 (no process
  group, no sync step): full ``[E, ...]`` weights, buffers, derived parameters, fake-quantized
  weights, per format.  Same calibration code as the ranks (``harness.sections.dist.quant``), on the
  whole tensors instead of slices.
* ``truth_entries`` -- what a correct checkpoint of that model holds, key by key.
* ``oracle_state`` -- a checkpoint loaded whole by one process (``safe_io.load_full``), read back
  into the canonical form, so its fake-quantized weights can be computed without any layout.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checks import Verdict, diff_bits, missing, verdict_from_diffs
from .layout import Coords, Layout
from .model import FCS, MoEConfig, full_weights
from .quant import calibrate, quant_format, quant_params
from .shards import LocalState, from_loaded, key_plan, to_specs

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


def truth_entries(truth: Truth, qlayout: str, qf_id: str) -> dict[str, torch.Tensor]:
    """``key -> whole tensor`` of a correct checkpoint of ``truth`` in ``qlayout``."""
    plan = key_plan(truth.cfg, TRUTH_LAYOUT, TRUTH_COORDS, qlayout, quant_format(qf_id))
    return {s.key: s.local for s in to_specs(LocalState(truth.weights, truth.states[qf_id]), plan)}


def oracle_state(full: dict[str, torch.Tensor], cfg: MoEConfig, qlayout: str, qf_id: str) -> LocalState:
    """A whole checkpoint (``load_full``) in canonical form; ``KeyError`` names a missing key."""
    plan = key_plan(cfg, TRUTH_LAYOUT, TRUTH_COORDS, qlayout, quant_format(qf_id))
    return from_loaded(full, plan)


def content_verdict(check_id: str, fields: dict, oracle: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> Verdict:
    """Checkpoint content, loaded whole by one process, against the keys and bits it must hold."""
    diffs = [
        diff_bits(f"ckpt:{k}", v, oracle[k]) if k in oracle else missing(f"ckpt:{k}", f"missing from the checkpoint (expected {tuple(v.shape)})")
        for k, v in expected.items()
    ]
    extra = [f"unexpected key {k!r} {tuple(oracle[k].shape)}" for k in oracle if k not in expected]
    return verdict_from_diffs(check_id, fields, diffs, extra)
