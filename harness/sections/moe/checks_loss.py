"""Quantisation error against the unquantised (BF16) layer, per weight layout, at EP = 1 and 2.

Expert parallelism is modelled in one process: under EP = 2 rank ``r`` holds experts
``[r*N/2, (r+1)*N/2)`` as its own grouped layer (or sequential experts), calibrated on the rows
routed to them only; the layer output is the two ranks' outputs in token order (tokens arrive
sorted by expert).  No EP sync runs, so a ``shared`` weight amax is the max over the *local*
experts only.

Rows (role ``grouped_linear/weight/{name}``, routing ``calib``):

* ``loss/{model}/ep{e}`` -- ``mean((y_q - y)^2)`` in fp32 of the quantised output ``y_q`` against the
  same layer with quantisers off (``y``, BF16), for the grouped layouts and ``sequential``
  (per-expert modules): finite and > 0 (0 would mean nothing was quantised);
* ``loss/grouped_eq_sequential/ep{e}`` -- the per-expert grouped layer (``n_quantizer``) and the
  sequential experts give bitwise-equal outputs, hence equal losses;
* ``loss/ep2_eq_ep1/{model}`` -- per-expert layouts: EP = 2 outputs bitwise equal to EP = 1
  (per-expert scales do not depend on which rank holds an expert); ``shared``: *not* equal
  (without an EP sync its amax is the local max: what the EP sync of shared amax fixes).

Cost: each bench builds 5 models x 2 ranks more (timed: docs/measured.md §13).
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from moe_fq_parity.harness.core.equality import bit_diff

from .bench import GROUPED_WEIGHT_LAYOUTS, Bench
from .compare import RowSink
from .layers import SequentialExperts, set_expert_params
from .quantized import QuantExperts, QuantGroupedExperts, QuantSequentialExperts, calibrate, set_quant_mode
from .roles import Role
from .te_adapter import make_grouped_linear

ROUTING = "calib"
"""The first calibration batch: every routed expert calibrated on its own rows (routing
``all_routed`` would add experts whose amax is 0, whose error dwarfs everything else)."""
EP_SIZES = (1, 2)
MODELS = tuple(GROUPED_WEIGHT_LAYOUTS) + ("sequential",)


def _rows_of(splits: list[int], lo: int, hi: int) -> slice:
    return slice(sum(splits[:lo]), sum(splits[:hi]))


def _local_model(bench: Bench, label: str, lo: int, hi: int) -> QuantExperts:
    """Model ``label`` over experts ``[lo, hi)`` only, calibrated on their rows."""
    shape, data, dev = bench.shape, bench.data, bench.data.weights[0].device
    n = hi - lo
    weights = data.weights[lo:hi]
    biases = data.biases[lo:hi] if data.biases is not None else None
    if label == "sequential":
        seq = SequentialExperts(n, shape.in_features, shape.out_features, bias=shape.bias, params_dtype=shape.dtype, device=dev)
        set_expert_params(seq, weights, biases)
        model: QuantExperts = QuantSequentialExperts(seq, bench.recipe, bench.name, input_layout="per_expert")
    else:
        layer = make_grouped_linear(n, shape.in_features, shape.out_features, bias=shape.bias, params_dtype=shape.dtype,
                                    device=dev, backend=bench.backend)
        set_expert_params(layer, weights, biases)
        model = QuantGroupedExperts(layer, bench.recipe, bench.name, **GROUPED_WEIGHT_LAYOUTS[label])
    calibrate(model, [(x[_rows_of(s, lo, hi)], s[lo:hi]) for x, s in data.calib])
    return model


@torch.no_grad()
def _outputs(model: QuantExperts, x: torch.Tensor, splits: list[int], quantized: bool) -> torch.Tensor:
    set_quant_mode(model, "quantize" if quantized else "off")
    try:
        return model(x, splits)
    finally:
        set_quant_mode(model, "quantize")


def ep_outputs(bench: Bench, label: str, ep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(quantised, unquantised)`` outputs of ``label`` under EP = ``ep`` on routing ``all_routed``."""
    n = bench.shape.num_experts
    if n % ep:
        raise ValueError(f"{n} experts do not split over EP={ep}")
    x, splits = bench.data.routings[ROUTING]
    q, ref = [], []
    for r in range(ep):
        lo, hi = r * n // ep, (r + 1) * n // ep
        model = _local_model(bench, label, lo, hi)
        rows = x[_rows_of(splits, lo, hi)]
        q.append(_outputs(model, rows, splits[lo:hi], True))
        ref.append(_outputs(model, rows, splits[lo:hi], False))
    return torch.cat(q), torch.cat(ref)


def mse(a: torch.Tensor, b: torch.Tensor) -> float:
    """``mean((a - b)^2)`` in fp32."""
    return float(((a.float() - b.float()) ** 2).mean())


def loss_rows(bench: Bench, sink: RowSink, outputs: Callable[[Bench, str, int], tuple[torch.Tensor, torch.Tensor]] = ep_outputs) -> None:
    """Append the loss rows of ``bench`` (see the module docstring)."""
    role = Role("grouped_linear", "weight", bench.name)
    got: dict[tuple[str, int], tuple[torch.Tensor, torch.Tensor]] = {}
    for ep in EP_SIZES:
        for label in MODELS:
            check = f"loss/{label}/ep{ep}"
            with sink.guard(role, check):
                got[(label, ep)] = outputs(bench, label, ep)
                value = mse(*got[(label, ep)])
                rel = value / max(float((got[(label, ep)][1].float() ** 2).mean()), 1e-30)
                sink.add(role, check, ok=math.isfinite(value) and value > 0, expected="finite and > 0 (mean squared error vs BF16)",
                         measured=f"{value:.6g} (relative {rel:.3g})", detail=f"{bench.shape.num_experts // ep} experts per rank, routing {ROUTING}")
        check = f"loss/grouped_eq_sequential/ep{ep}"
        with sink.guard(role, check):
            (gq, gr), (sq, sr) = got[("n_quantizer", ep)], got[("sequential", ep)]
            diff = bit_diff([gq, gr], [sq, sr], label="quantised, unquantised output #")
            sink.add(role, check, ok=diff.equal, expected="grouped (n_quantizer) and sequential outputs bitwise equal: equal losses",
                     measured=f"grouped {mse(gq, gr):.6g}, sequential {mse(sq, sr):.6g}", mismatches=diff.mismatches, detail=diff.summary())
    for label in MODELS:
        check = f"loss/ep2_eq_ep1/{label}"
        with sink.guard(role, check):
            diff = bit_diff([got[(label, 1)][0]], [got[(label, 2)][0]], label="output")
            sink.add_diff(role, check, diff, expect_equal=label != "shared",
                          what="EP=2 output equal to EP=1" + (" (shared amax without EP sync is the local max)" if label == "shared" else ""))
