"""Input-role checks: input-amax layouts side by side and which of them are output-equivalent.

Rows (role ``grouped_linear/input/{name}``):

* ``data/input_amax_differ``              -- calibrated experts' input amax pairwise distinct as
  the format sees them (``compare.visible_amax``);
* ``amax/per_expert_eq_reference``        -- each expert's amax == running max over the
  calibration batches of ``reference.max_calibrate`` of its routed rows (0 for no rows), for
  ``grouped_per_expert`` and ``sequential_per_expert``;
* ``amax/shared_eq_max_per_expert``       -- ``grouped_shared`` amax == max over per-expert amax;
* ``amax/synced_eq_shared``               -- every expert of ``sequential_synced`` and
  ``grouped_synced`` holds the shared amax;
* ``amax/uncalibrated_expert_zero``       -- experts without calibration tokens hold ``+0``
  (bits ``0x00000000``) in the per-expert layouts;
* ``layouts/{model}``                     -- the amax each expert is quantized with, per model
  (the side-by-side table); fails if any amax is NaN, infinite or negative;
* ``equivalence/{a}~{b}/{routing}``       -- outputs of two models bitwise equal or not; the
  expectation is ``bench.INPUT_AMAX_CLASS`` (same class <=> equivalent).
"""

from __future__ import annotations

from itertools import combinations

import torch

from moe_fq_parity import reference

from moe_fq_parity.harness.core.equality import bit_diff

from .bench import INPUT_AMAX_CLASS, INPUT_MODELS, Bench
from .checks_weight import ROUTINGS
from .compare import RowSink, count_distinct, elementwise_max, short
from .layers import split_tokens
from .roles import Role


def reference_input_amax(bench: Bench) -> list[torch.Tensor]:
    """Per-expert input amax from the reference alone: running max of max|x_i| over batches."""
    n = bench.shape.num_experts
    running: list[torch.Tensor | None] = [None] * n
    for x, splits in bench.data.calib:
        for i, xi in enumerate(split_tokens(x, splits, n)):
            running[i] = reference.update_running_amax(running[i], reference.max_calibrate(xi, "per_tensor"))
    return [r if r is not None else torch.zeros(()) for r in running]


def input_rows(bench: Bench, sink: RowSink) -> None:
    """Append every input-role row of ``bench`` to ``sink``."""
    role = Role("grouped_linear", "input", bench.name)
    models = bench.input_models
    per_expert = models["sequential_per_expert"].input_amax()
    empty = set(bench.shape.empty)
    calibrated = [a for i, a in enumerate(per_expert) if i not in empty]
    with sink.guard(role, "data/input_amax_differ"):
        fmt = models["sequential_per_expert"].input_spec.fmt
        distinct = count_distinct(calibrated, fmt)
        sink.add(role, "data/input_amax_differ", ok=distinct == len(calibrated) >= 2,
                 expected=f"{len(calibrated)}/{len(calibrated)} distinct to {fmt} (>= 2)", measured=f"{distinct} distinct",
                 detail=f"calibrated experts' input amax {short(calibrated)}")
    with sink.guard(role, "amax/per_expert_eq_reference"):
        ref = reference_input_amax(bench)
        got = models["sequential_per_expert"].input_amax() + models["grouped_per_expert"].input_amax()
        sink.add_diff(role, "amax/per_expert_eq_reference", bit_diff(ref + ref, got, label="expert (sequential, then grouped)"))
    shared = models["grouped_shared"].input_amax()
    with sink.guard(role, "amax/shared_eq_max_per_expert"):
        sink.add_diff(role, "amax/shared_eq_max_per_expert", bit_diff([elementwise_max(per_expert)] * len(shared), shared, label="expert"))
    with sink.guard(role, "amax/synced_eq_shared"):
        synced = models["sequential_synced"].input_amax() + models["grouped_synced"].input_amax()
        sink.add_diff(role, "amax/synced_eq_shared", bit_diff([shared[0]] * len(synced), synced, label="expert (sequential, then grouped)"))
    with sink.guard(role, "amax/uncalibrated_expert_zero"):
        got = [a for label in ("sequential_per_expert", "grouped_per_expert") for i, a in enumerate(models[label].input_amax()) if i in empty]
        sink.add_diff(role, "amax/uncalibrated_expert_zero", bit_diff([torch.zeros((), device=g.device) for g in got], got, label="expert"),
                      what=f"+0 for experts {sorted(empty)}")
    for label, model in models.items():
        with sink.guard(role, f"layouts/{label}"):
            amax = model.input_amax()
            flat = torch.stack([a.reshape(()) for a in amax])
            ok = bool(torch.isfinite(flat).all() and (flat >= 0).all())
            sink.add(role, f"layouts/{label}", ok=ok, expected="finite, >= 0 for every expert",
                     measured=short(amax, limit=16), detail=f"host {INPUT_MODELS[label][0]}, class {INPUT_AMAX_CLASS[label]}")
    for routing in ROUTINGS:
        for a, b in combinations(models, 2):
            check = f"equivalence/{a}~{b}/{routing}"
            with sink.guard(role, check):
                same_class = INPUT_AMAX_CLASS[a] == INPUT_AMAX_CLASS[b]
                diff = bit_diff([bench.outputs(models[a], routing)], [bench.outputs(models[b], routing)], label="output")
                sink.add_diff(role, check, diff, expect_equal=same_class, what="output-equivalent")
