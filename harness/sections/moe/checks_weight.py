"""Weight-role checks: grouped weight-quantizer layouts against sequential per-expert quantizers.

Rows (role ``grouped_linear/weight/{name}``), every one able to fail:

* ``data/weight_amax_differ``          -- the N sequential amax are pairwise distinct *as the
  format sees them* (``compare.visible_amax``: for FP8/NVFP4 not a power of two apart);
  otherwise shared == per-expert and the checks below prove nothing;
* ``amax/sequential_eq_reference``     -- sequential amax == ``reference.max_calibrate_experts``;
* ``amax/shared_eq_max_sequential``    -- shared amax == elementwise max over sequential amax;
* ``amax/{layout}_eq_sequential``      -- per-expert amax of ``n_quantizer``, ``one_vector_flat``,
  ``one_vector_broadcast`` == sequential, expert by expert;
* ``fq_weight/sequential_eq_reference`` -- sequential fake-quantized weights ==
  ``reference.fake_quant_experts`` with the reference amax;
* ``fq_weight/{layout}_eq_sequential`` -- fake-quantized weights, per-expert layouts;
* ``fq_weight/shared_differs_control`` -- the shared layout's fake-quantized weights are *not*
  all equal to the sequential ones (the comparison can see a layout difference);
* ``output/{layout}_eq_sequential/{routing}`` -- layer outputs for routings ``calib`` (empty
  experts) and ``all_routed`` (uncalibrated experts receive tokens);
* ``grad/n_quantizer_eq_sequential/{routing}`` -- weight and input gradients through the STE
  (``all_routed`` sends tokens beyond the calibrated amax, so a clipped STE clips there).

All comparisons are bitwise (``harness.core.equality.bit_diff``).
"""

from __future__ import annotations

from moe_fq_parity import reference

from moe_fq_parity.harness.core.equality import bit_diff

from .bench import GROUPED_WEIGHT_LAYOUTS, Bench, gradients
from .compare import RowSink, count_distinct, elementwise_max, short
from .quantized import stacked_amax
from .roles import Role

PER_EXPERT_LAYOUTS = tuple(k for k in GROUPED_WEIGHT_LAYOUTS if k != "shared")
ROUTINGS = ("calib", "all_routed")


def weight_rows(bench: Bench, sink: RowSink) -> None:
    """Append every weight-role row of ``bench`` to ``sink``."""
    role = Role("grouped_linear", "weight", bench.name)
    spec = bench.sequential.weight_spec
    seq_amax = bench.sequential.weight_amax()
    n = len(seq_amax)
    with sink.guard(role, "data/weight_amax_differ"):
        distinct = count_distinct(seq_amax, spec.fmt)
        sink.add(role, "data/weight_amax_differ", ok=distinct == n, expected=f"{n}/{n} distinct to {spec.fmt}",
                 measured=f"{distinct}/{n} distinct", detail=f"sequential amax {short(seq_amax)}")
    with sink.guard(role, "amax/sequential_eq_reference"):
        ref_amax = reference.max_calibrate_experts(bench.data.weights, "per_channel" if spec.granularity == "per_channel" else "per_expert")
        sink.add_diff(role, "amax/sequential_eq_reference", bit_diff(list(ref_amax.unbind(0)), seq_amax, label="expert"))
    with sink.guard(role, "amax/shared_eq_max_sequential"):
        shared = bench.weight_models["shared"].weight_amax()
        sink.add_diff(role, "amax/shared_eq_max_sequential", bit_diff([elementwise_max(seq_amax)] * n, shared, label="expert"))
    for label in PER_EXPERT_LAYOUTS:
        with sink.guard(role, f"amax/{label}_eq_sequential"):
            sink.add_diff(role, f"amax/{label}_eq_sequential", bit_diff(seq_amax, bench.weight_models[label].weight_amax(), label="expert"))
    with sink.guard(role, "fq_weight/sequential_eq_reference"):
        ref_fq = reference.fake_quant_experts(bench.data.weights, stacked_amax(seq_amax), spec.fmt, spec.variant, **dict(spec.options))
        sink.add_diff(role, "fq_weight/sequential_eq_reference", bit_diff(ref_fq, bench.quantized_weights(bench.sequential), label="expert"))
    for label in PER_EXPERT_LAYOUTS + ("shared",):
        check = "fq_weight/shared_differs_control" if label == "shared" else f"fq_weight/{label}_eq_sequential"
        with sink.guard(role, check):
            diff = bit_diff(bench.quantized_weights(bench.sequential), bench.quantized_weights(bench.weight_models[label]), label="expert")
            sink.add_diff(role, check, diff, expect_equal=label != "shared")
    for routing in ROUTINGS:
        for label in PER_EXPERT_LAYOUTS:
            check = f"output/{label}_eq_sequential/{routing}"
            with sink.guard(role, check):
                expected, got = bench.outputs(bench.sequential, routing), bench.outputs(bench.weight_models[label], routing)
                sink.add_diff(role, check, bit_diff([expected], [got], label="output"))
    for routing in ROUTINGS:
        check = f"grad/n_quantizer_eq_sequential/{routing}"
        with sink.guard(role, check):
            gw_s, gx_s = gradients(bench.sequential, bench.data, routing)
            gw_g, gx_g = gradients(bench.weight_models["n_quantizer"], bench.data, routing)
            diff = bit_diff(gw_s + [gx_s], gw_g + [gx_g], label="grad (experts, then input)")
            sink.add_diff(role, check, diff, what=f"bitwise equal ({spec.ste_mode} STE)")
