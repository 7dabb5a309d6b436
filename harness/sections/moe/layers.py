"""Expert layers in pure torch: a twin of Transformer Engine ``GroupedLinear`` and sequential experts.

Forward contract (both layers, the definition the checks compare against)::

    x_0, ..., x_{N-1} = inp.split(m_splits)         rows of a 2-D [T, in] input, T = sum(m_splits)
    y_i = F.linear(x_i, w_i, b_i)                    one GEMM per expert, [m_i, out]; m_i = 0 allowed
    out = cat(y_0, ..., y_{N-1})                     [T, out], inp's dtype

``F.linear`` on the same operands is the same kernel in both layers, so grouped and sequential
outputs are bitwise equal for the same weights and routing (checked, not assumed).

``GroupedLinearTwin`` mirrors TE's names: parameters ``weight{i}`` ``[out, in]`` and, with
``bias=True``, ``bias{i}`` ``[out]``; with ``bias=False`` ``bias{i}`` is an empty plain tensor
attribute (not a parameter, not in the state dict), as in TE.  ``single_grouped_weight=True``
holds one ``weight`` ``[N, out, in]`` (and ``bias`` ``[N, out]``) instead, like TE's
``single_grouped_weight`` (logical shape; TE stores ``[N*out, in]``).  Both register a load
pre-hook that converts checkpoints of the other layout (``harness.sections.moe.state_dict``), as
Megatron's ``TEGroupedLinear`` does.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .state_dict import grouped_to_indexed, indexed_to_grouped, remapped_params

MSplits = Sequence[int] | torch.Tensor


def normalize_splits(m_splits: MSplits, num_gemms: int, num_tokens: int) -> list[int]:
    """``m_splits`` (list or int64 tensor ``(N,)``) as a list of N non-negative ints summing to ``num_tokens``."""
    if isinstance(m_splits, torch.Tensor):
        if m_splits.dim() != 1 or m_splits.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"m_splits tensor must be 1-D int64/int32, got {m_splits.dtype}{tuple(m_splits.shape)}")
        splits = [int(v) for v in m_splits.tolist()]
    else:
        splits = [int(v) for v in m_splits]
    if len(splits) != num_gemms:
        raise ValueError(f"m_splits has {len(splits)} entries for {num_gemms} experts")
    if any(s < 0 for s in splits):
        raise ValueError(f"m_splits must be >= 0, got {splits}")
    if sum(splits) != num_tokens:
        raise ValueError(f"m_splits sum to {sum(splits)} but the input has {num_tokens} rows")
    return splits


def split_tokens(inp: torch.Tensor, m_splits: MSplits, num_gemms: int) -> list[torch.Tensor]:
    """Rows of a 2-D ``inp`` split per expert (views; empty experts give ``[0, in]``)."""
    if inp.dim() != 2:
        raise ValueError(f"expert input must be 2-D [tokens, in_features], got {tuple(inp.shape)}")
    return list(inp.split(normalize_splits(m_splits, num_gemms, inp.shape[0]), dim=0))


def _check_dims(num_gemms: int, in_features: int, out_features: int) -> None:
    for name, v in (("num_gemms", num_gemms), ("in_features", in_features), ("out_features", out_features)):
        if int(v) != v or v < 1:
            raise ValueError(f"{name} must be a positive int, got {v!r}")


class GroupedLinearTwin(nn.Module):
    """Pure-torch ``transformer_engine.pytorch.GroupedLinear`` (no TP, no FP8, no fused wgrad).

    Everything after ``out_features`` is keyword-only: in TE, ``bias`` is not the fourth
    positional parameter (``sequence_parallel`` is), so positional use could not mean the same.

    * ``num_gemms``, ``in_features``, ``out_features``: as TE.
    * ``bias``: register ``bias{i}`` parameters (zero-initialised, as TE).
    * ``params_dtype``: parameter dtype (default ``torch.get_default_dtype()``, as TE).
    * ``device``: parameter device (default ``"cpu"``; TE's default is ``"cuda"``).
    * ``single_grouped_weight``: one ``weight`` ``[N, out, in]`` (+ ``bias`` ``[N, out]``).
    * ``init_std``: weights ~ N(0, init_std) drawn from ``generator`` (TE's default init is
      ``normal_(0, 0.023)``); the checks overwrite them with their own data.
    """

    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        *,
        bias: bool = True,
        params_dtype: torch.dtype | None = None,
        device: torch.device | str | None = None,
        single_grouped_weight: bool = False,
        init_std: float = 0.023,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        _check_dims(num_gemms, in_features, out_features)
        self.num_gemms = num_gemms
        self.in_features = in_features
        self.out_features = out_features
        self.use_bias = bool(bias)
        self.single_grouped_weight = bool(single_grouped_weight)
        dtype = params_dtype or torch.get_default_dtype()
        dev = torch.device(device or "cpu")
        w = torch.empty(num_gemms, out_features, in_features, dtype=torch.float32, device="cpu")
        w.normal_(0.0, init_std, generator=generator)
        w = w.to(device=dev, dtype=dtype)
        b = torch.zeros(num_gemms, out_features, dtype=dtype, device=dev)
        if self.single_grouped_weight:
            self.weight = nn.Parameter(w)
            if self.use_bias:
                self.bias = nn.Parameter(b)
        else:
            for i in range(num_gemms):
                self.register_parameter(f"weight{i}", nn.Parameter(w[i].clone()))
                if self.use_bias:
                    self.register_parameter(f"bias{i}", nn.Parameter(b[i].clone()))
                else:
                    setattr(self, f"bias{i}", torch.empty(0, dtype=dtype, device=dev))
        self.register_load_state_dict_pre_hook(_normalize_grouped_parameter_keys)

    def expert_weight(self, i: int) -> torch.Tensor:
        return self.weight[i] if self.single_grouped_weight else getattr(self, f"weight{i}")

    def expert_bias(self, i: int) -> torch.Tensor | None:
        if not self.use_bias:
            return None
        return self.bias[i] if self.single_grouped_weight else getattr(self, f"bias{i}")

    def forward(self, inp: torch.Tensor, m_splits: MSplits) -> torch.Tensor:
        """``cat_i F.linear(x_i, w_i, b_i)`` over the row splits of ``inp`` (see module docstring)."""
        xs = split_tokens(inp, m_splits, self.num_gemms)
        ys = [F.linear(x, self.expert_weight(i), self.expert_bias(i)) for i, x in enumerate(xs)]
        return torch.cat(ys, dim=0)


def _normalize_grouped_parameter_keys(module: GroupedLinearTwin, state_dict: dict, prefix: str, *args: Any) -> None:
    """Load pre-hook: convert indexed <-> grouped keys to the module's own layout (in place).

    Early returns (dict untouched), as Megatron's ``TEGroupedLinear`` hook: a single-grouped module
    stacks only when *all* N indexed keys and no grouped key are present; an indexed module splits
    only when the grouped key and *none* of the indexed keys are present.
    """
    for p in remapped_params(module):
        if module.single_grouped_weight:
            indexed_to_grouped(state_dict, prefix, p, module.num_gemms)
        else:
            grouped_to_indexed(state_dict, prefix, p, module.num_gemms)


class ExpertLinear(nn.Linear):
    """``nn.Linear`` with optional ``input_quantizer`` / ``weight_quantizer`` submodules.

    Without quantizers it is exactly ``nn.Linear``; with them (attached by
    ``harness.sections.moe.quantized``) ``forward(x) = F.linear(iq(x), wq(weight), bias)``.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, device=None, dtype=None) -> None:
        super().__init__(in_features, out_features, bias=bias, device=device, dtype=dtype)
        self.input_quantizer: nn.Module | None = None
        self.weight_quantizer: nn.Module | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.input_quantizer is not None:
            x = self.input_quantizer(x)
        w = self.weight if self.weight_quantizer is None else self.weight_quantizer(self.weight)
        return F.linear(x, w, self.bias)


class SequentialExperts(nn.Module):
    """``local_experts.{i}``: one ``ExpertLinear`` per expert, run in turn on its routed rows."""

    def __init__(
        self, num_experts: int, in_features: int, out_features: int, bias: bool = True,
        params_dtype: torch.dtype | None = None, device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        _check_dims(num_experts, in_features, out_features)
        self.num_experts = num_experts
        self.local_experts = nn.ModuleList(
            ExpertLinear(in_features, out_features, bias=bias, device=device or "cpu", dtype=params_dtype or torch.get_default_dtype())
            for _ in range(num_experts)
        )

    def forward(self, inp: torch.Tensor, m_splits: MSplits) -> torch.Tensor:
        xs = split_tokens(inp, m_splits, self.num_experts)
        return torch.cat([e(x) for e, x in zip(self.local_experts, xs)], dim=0)


def grouped_expert_weights(layer: nn.Module) -> list[torch.Tensor]:
    """The N expert weights ``[out, in]`` of a twin or a real TE ``GroupedLinear``."""
    if getattr(layer, "single_grouped_weight", False):
        return list(layer.weight.unbind(0))
    return [getattr(layer, f"weight{i}") for i in range(layer.num_gemms)]


def grouped_expert_biases(layer: nn.Module) -> list[torch.Tensor] | None:
    """The N expert biases ``[out]``, or ``None`` for a bias-free layer."""
    if not getattr(layer, "use_bias", False):
        return None
    if getattr(layer, "single_grouped_weight", False):
        return list(layer.bias.unbind(0))
    return [getattr(layer, f"bias{i}") for i in range(layer.num_gemms)]


@torch.no_grad()
def set_expert_params(layer: nn.Module, weights: Sequence[torch.Tensor], biases: Sequence[torch.Tensor] | None = None) -> None:
    """Copy N expert weights (and biases) into a grouped layer (twin or TE) or ``SequentialExperts``."""
    if isinstance(layer, SequentialExperts):
        targets_w = [e.weight for e in layer.local_experts]
        targets_b = [e.bias for e in layer.local_experts] if layer.local_experts[0].bias is not None else None
    else:
        targets_w = grouped_expert_weights(layer)
        targets_b = grouped_expert_biases(layer)
    if len(weights) != len(targets_w):
        raise ValueError(f"{len(weights)} weights for {len(targets_w)} experts")
    for t, w in zip(targets_w, weights):
        t.copy_(w)
    if biases is not None:
        if targets_b is None:
            raise ValueError("biases given for a layer without bias")
        for t, b in zip(targets_b, biases):
            t.copy_(b)
