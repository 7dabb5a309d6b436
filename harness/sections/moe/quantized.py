"""Quantized expert layers: a grouped layer (twin or real TE) and sequential experts with quantizers.

``QuantGroupedExperts(layer, recipe, name, *, per_expert, weight_layout, input_layout)``::

    x_i  = inp.split(m_splits)[i]
    xq_i = input_quantizer(x_i)                        amax per input layout (below)
    wq_i = weight_quantizer(weight_i)                  amax per weight layout
    out  = layer(cat(xq_i), m_splits) with weight_i := wq_i     (te_adapter.grouped_forward)

State dicts carry the upstream keys (``weight_quantizer_{i}._amax``, ``state_dict.UPSTREAM_KEYS``);
loading accepts those, the internal ``weight_quantizer.{i}._amax`` and the one-vector forms.

``QuantSequentialExperts(experts, recipe, name, *, input_layout)`` attaches one weight and one
input ``MaxQuantizer`` to every ``local_experts.{i}`` (state keys
``experts.local_experts.{i}.weight_quantizer._amax``) and runs each expert on its rows.

Input-amax layouts (``INPUT_LAYOUTS``):

* ``shared``     -- one amax for all experts: max over all routed tokens (Model-Optimizer's
  grouped-layer input quantizer, docs/measured.md §8); grouped layer only;
* ``per_expert`` -- one amax per expert from its own routed tokens (plain per-expert modules);
* ``synced``     -- per-expert amax, then max-synced across the local experts after calibration
  (Megatron SequentialMLP).  Bitwise equal to ``shared`` by construction of max.

The per-expert opt-in for weights (``per_expert``) is a required keyword: ``False`` -> weight
layout ``shared``; ``True`` -> ``n_quantizer`` (default) or ``one_vector``.  Nothing is read
from the environment.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import torch
from torch import nn

from .layers import MSplits, SequentialExperts, grouped_expert_weights, split_tokens
from .quantizers import ExpertQuantizer, MaxQuantizer, fake_quant_spec, max_sync_, piece_shape, set_quant_mode
from .roles import Recipe, Role
from .state_dict import n_to_vector, to_internal_keys, to_upstream_keys, vector_to_n
from .te_adapter import grouped_forward

INPUT_LAYOUTS = ("shared", "per_expert", "synced")

Batch = tuple[torch.Tensor, MSplits]


def _param_device(layer: nn.Module) -> torch.device:
    return next(layer.parameters()).device


class QuantGroupedExperts(nn.Module):
    """A grouped expert linear with weight and input quantizers (see module docstring).

    * ``layer``: a ``GroupedLinearTwin`` or a real TE ``GroupedLinear`` (``num_gemms``, ``weight{i}``).
    * ``recipe``/``name``: specs of roles ``("grouped_linear", "weight"|"input", name)``.
    * ``per_expert``: the weight per-expert opt-in, required; ``weight_layout``: ``None`` (derived),
      ``shared``, ``n_quantizer`` or ``one_vector`` (must agree with ``per_expert``).
    * ``input_layout``: one of ``INPUT_LAYOUTS``; ``vector_form``: ``flat``/``broadcast`` (one_vector).
    """

    def __init__(
        self, layer: nn.Module, recipe: Recipe, name: str, *, per_expert: bool,
        weight_layout: str | None = None, input_layout: str = "shared", vector_form: str = "flat",
    ) -> None:
        super().__init__()
        if not isinstance(per_expert, bool):
            raise TypeError(f"per_expert must be True or False, got {per_expert!r}")
        if weight_layout is None:
            weight_layout = "n_quantizer" if per_expert else "shared"
        if per_expert != (weight_layout != "shared"):
            raise ValueError(f"per_expert={per_expert} contradicts weight_layout={weight_layout!r}")
        if input_layout not in INPUT_LAYOUTS:
            raise ValueError(f"input_layout must be one of {INPUT_LAYOUTS}, got {input_layout!r}")
        self.layer = layer
        self.name = name
        self.per_expert = per_expert
        self.input_layout = input_layout
        n, out = layer.num_gemms, layer.out_features
        dev = _param_device(layer)
        self.weight_spec = recipe.spec_for(Role("grouped_linear", "weight", name))
        self.input_spec = recipe.spec_for(Role("grouped_linear", "input", name))
        self.weight_quantizer = ExpertQuantizer(self.weight_spec, n, out, weight_layout, vector_form=vector_form, device=dev)
        in_layout = "shared" if input_layout == "shared" else "n_quantizer"
        self.input_quantizer = ExpertQuantizer(self.input_spec, n, out, in_layout, device=dev)
        self.register_load_state_dict_pre_hook(_normalize_quantizer_keys)
        self.register_state_dict_post_hook(_upstream_quantizer_keys)

    @property
    def num_experts(self) -> int:
        return self.layer.num_gemms

    def forward(self, inp: torch.Tensor, m_splits: MSplits) -> torch.Tensor:
        xs = split_tokens(inp, m_splits, self.num_experts)
        xq = self.input_quantizer(xs)
        wq = self.weight_quantizer(grouped_expert_weights(self.layer))
        return grouped_forward(self.layer, torch.cat(xq, dim=0), m_splits, wq)

    def finish_calibration(self) -> None:
        if self.input_layout == "synced":
            self.input_quantizer.sync_()

    def weight_amax(self) -> list[torch.Tensor]:
        return self.weight_quantizer.amax_per_expert()

    def input_amax(self) -> list[torch.Tensor]:
        return self.input_quantizer.amax_per_expert()

    @torch.no_grad()
    def quantized_weights(self) -> list[torch.Tensor]:
        """Each expert's fake-quantized weight with the amax its layout gives it."""
        ws = grouped_expert_weights(self.layer)
        return [fake_quant_spec(w, a, self.weight_spec) for w, a in zip(ws, self.weight_amax())]

    def expert_weight_params(self) -> list[torch.Tensor]:
        return grouped_expert_weights(self.layer)


def _upstream_quantizer_keys(module: QuantGroupedExperts, state_dict: dict, prefix: str, local_metadata: dict) -> None:
    """State-dict post-hook: per-expert quantizers under their upstream keys ``{q}_{i}.{buf}``
    (``state_dict.UPSTREAM_KEYS``)."""
    for qname in ("weight_quantizer", "input_quantizer"):
        if getattr(module, qname).layout == "n_quantizer":
            to_upstream_keys(state_dict, prefix, module.num_experts, quantizer=qname)


def _normalize_quantizer_keys(module: QuantGroupedExperts, state_dict: dict, prefix: str, *args) -> None:
    """Load pre-hook: bring N-quantizer (upstream or internal keys) or one-vector amax keys to the
    module's layout (internal module paths, ``state_dict.UPSTREAM_KEYS``)."""
    n = module.num_experts
    for qname in ("weight_quantizer", "input_quantizer"):
        q: ExpertQuantizer = getattr(module, qname)
        nd = len(q.piece)
        if q.layout == "n_quantizer":
            to_internal_keys(state_dict, prefix, n, quantizer=qname)
            vector_to_n(state_dict, prefix, n, piece_ndim=nd, quantizer=qname, naming="list")
        elif q.layout == "one_vector":
            for naming in ("list", "suffix"):
                n_to_vector(state_dict, prefix, n, piece_ndim=nd, quantizer=qname, naming=naming, form=q.vector_form)


class QuantSequentialExperts(nn.Module):
    """``SequentialExperts`` with one weight and one input quantizer per expert.

    * ``input_layout``: ``per_expert`` or ``synced`` (``shared`` is not a sequential layout).
    """

    def __init__(self, experts: SequentialExperts, recipe: Recipe, name: str, *, input_layout: str = "per_expert") -> None:
        super().__init__()
        if input_layout not in ("per_expert", "synced"):
            raise ValueError(f"sequential input_layout must be per_expert or synced, got {input_layout!r}")
        self.experts = experts
        self.name = name
        self.input_layout = input_layout
        self.weight_spec = recipe.spec_for(Role("sequential_linear", "weight", name))
        self.input_spec = recipe.spec_for(Role("sequential_linear", "input", name))
        for e in experts.local_experts:
            dev = e.weight.device
            e.weight_quantizer = MaxQuantizer(self.weight_spec, piece_shape(self.weight_spec, e.out_features), device=dev)
            e.input_quantizer = MaxQuantizer(self.input_spec, (), device=dev)

    @property
    def num_experts(self) -> int:
        return self.experts.num_experts

    def forward(self, inp: torch.Tensor, m_splits: MSplits) -> torch.Tensor:
        return self.experts(inp, m_splits)

    def finish_calibration(self) -> None:
        if self.input_layout == "synced":
            max_sync_([e.input_quantizer for e in self.experts.local_experts])

    def weight_amax(self) -> list[torch.Tensor]:
        return [e.weight_quantizer.amax for e in self.experts.local_experts]

    def input_amax(self) -> list[torch.Tensor]:
        return [e.input_quantizer.amax for e in self.experts.local_experts]

    @torch.no_grad()
    def quantized_weights(self) -> list[torch.Tensor]:
        return [fake_quant_spec(e.weight, e.weight_quantizer.amax, self.weight_spec) for e in self.experts.local_experts]

    def expert_weight_params(self) -> list[torch.Tensor]:
        return [e.weight for e in self.experts.local_experts]


QuantExperts = QuantGroupedExperts | QuantSequentialExperts


@torch.no_grad()
def calibrate(model: QuantExperts, batches: Iterable[Batch]) -> None:
    """Max-calibrate weights and inputs over ``batches`` of ``(inp, m_splits)``, then quantize mode.

    Weights are observed at every forward (running max of the same tensor: its amax); inputs
    from the routed rows only, so experts with no tokens keep amax 0 (``quantizers``).
    """
    set_quant_mode(model, "calibrate")
    seen = 0
    for inp, splits in batches:
        model(inp, splits)
        seen += 1
    if seen == 0:
        raise ValueError("calibration needs at least one batch")
    model.finish_calibration()
    set_quant_mode(model, "quantize")


def stacked_amax(amax: Sequence[torch.Tensor]) -> torch.Tensor:
    """Per-expert amax list -> ``[N]`` / ``[N, out]`` (the reference's per-expert layout)."""
    return torch.stack(list(amax), dim=0)
