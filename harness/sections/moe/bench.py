"""The calibrated models one role's checks compare: grouped layouts and sequential experts.

All models get the same weights, biases and calibration batches (``harness.sections.moe.data``).

Grouped weight layouts (input ``per_expert`` throughout, so only the weight layout varies):
``shared`` (per_expert=False), ``n_quantizer``, ``one_vector_flat``, ``one_vector_broadcast``.

Input layouts (per-expert weights throughout, so only the input layout varies):
``grouped_shared`` (Model-Optimizer 0.47's grouped layer), ``grouped_per_expert``,
``grouped_synced``, ``sequential_per_expert`` (plain per-expert modules) and
``sequential_synced`` (Megatron SequentialMLP).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from .data import ExpertData, ExpertShape
from .layers import SequentialExperts, set_expert_params
from .quantized import QuantExperts, QuantGroupedExperts, QuantSequentialExperts, calibrate
from .roles import Recipe
from .te_adapter import make_grouped_linear

GROUPED_WEIGHT_LAYOUTS: dict[str, dict] = {
    "shared": dict(per_expert=False, input_layout="per_expert"),
    "n_quantizer": dict(per_expert=True, weight_layout="n_quantizer", input_layout="per_expert"),
    "one_vector_flat": dict(per_expert=True, weight_layout="one_vector", vector_form="flat", input_layout="per_expert"),
    "one_vector_broadcast": dict(per_expert=True, weight_layout="one_vector", vector_form="broadcast", input_layout="per_expert"),
}
INPUT_MODELS: dict[str, tuple[str, dict]] = {
    "grouped_shared": ("grouped", dict(per_expert=True, input_layout="shared")),
    "grouped_per_expert": ("grouped", dict(per_expert=True, input_layout="per_expert")),
    "grouped_synced": ("grouped", dict(per_expert=True, input_layout="synced")),
    "sequential_per_expert": ("sequential", dict(input_layout="per_expert")),
    "sequential_synced": ("sequential", dict(input_layout="synced")),
}
INPUT_AMAX_CLASS: dict[str, str] = {
    "grouped_shared": "max_over_experts",
    "grouped_synced": "max_over_experts",
    "sequential_synced": "max_over_experts",
    "grouped_per_expert": "own",
    "sequential_per_expert": "own",
}
"""The claim under test: models of one class quantize every expert's input with the same amax
and are therefore output-equivalent; models of different classes are not (on data whose
per-expert input amax differ)."""


@dataclass
class Bench:
    """Calibrated models of one (recipe, layer name, shape, data, grouped backend)."""

    recipe: Recipe
    name: str
    shape: ExpertShape
    data: ExpertData
    backend: str
    weight_models: dict[str, QuantGroupedExperts] = field(default_factory=dict)
    input_models: dict[str, QuantExperts] = field(default_factory=dict)
    _memo: dict[tuple, Any] = field(default_factory=dict, repr=False)

    def outputs(self, model: QuantExperts, routing: str) -> torch.Tensor:
        """``outputs(model, data, routing)``, computed once per (model, routing)."""
        return self._once(("out", id(model), routing), lambda: outputs(model, self.data, routing))

    def quantized_weights(self, model: QuantExperts) -> list[torch.Tensor]:
        """``model.quantized_weights()``, computed once per model."""
        return self._once(("fq", id(model)), model.quantized_weights)

    def _once(self, key: tuple, fn: Callable[[], Any]) -> Any:
        if key not in self._memo:
            self._memo[key] = fn()
        return self._memo[key]

    @property
    def sequential(self) -> QuantSequentialExperts:
        return self.input_models["sequential_per_expert"]  # type: ignore[return-value]


def _grouped(shape: ExpertShape, data: ExpertData, backend: str, device: torch.device):
    layer = make_grouped_linear(
        shape.num_experts, shape.in_features, shape.out_features, bias=shape.bias,
        params_dtype=shape.dtype, device=device, backend=backend,
    )
    set_expert_params(layer, data.weights, data.biases)
    return layer


def _sequential(shape: ExpertShape, data: ExpertData, device: torch.device) -> SequentialExperts:
    seq = SequentialExperts(shape.num_experts, shape.in_features, shape.out_features, bias=shape.bias, params_dtype=shape.dtype, device=device)
    set_expert_params(seq, data.weights, data.biases)
    return seq


def build_bench(recipe: Recipe, name: str, shape: ExpertShape, data: ExpertData, *, backend: str, device: torch.device | str) -> Bench:
    """Build and calibrate every model (``backend``: grouped layer backend, ``twin`` or ``te``)."""
    dev = torch.device(device)
    bench = Bench(recipe, name, shape, data, backend)
    for label, kw in GROUPED_WEIGHT_LAYOUTS.items():
        m = QuantGroupedExperts(_grouped(shape, data, backend, dev), recipe, name, **kw)
        calibrate(m, data.calib)
        bench.weight_models[label] = m
    for label, (host, kw) in INPUT_MODELS.items():
        if host == "grouped":
            m = QuantGroupedExperts(_grouped(shape, data, backend, dev), recipe, name, **kw)
        else:
            m = QuantSequentialExperts(_sequential(shape, data, dev), recipe, name, **kw)
        calibrate(m, data.calib)
        bench.input_models[label] = m
    return bench


@torch.no_grad()
def outputs(model: QuantExperts, data: ExpertData, routing: str) -> torch.Tensor:
    x, splits = data.routings[routing]
    return model(x, splits)


def gradients(model: QuantExperts, data: ExpertData, routing: str) -> tuple[list[torch.Tensor], torch.Tensor]:
    """``(weight grads per expert, input grad)`` of ``sum(out * grad_out)`` through the STE."""
    x, splits = data.routings[routing]
    params = model.expert_weight_params()
    for p in model.parameters():
        p.grad = None
    inp = x.clone().requires_grad_(True)
    out = model(inp, splits)
    out.backward(data.grad_out[routing])
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    return [g.detach().clone() for g in grads], inp.grad.detach().clone()
