"""Thin adapter: the real Transformer Engine ``GroupedLinear`` when it can run here, else the twin.

Assumptions about the real module (TE 2.14-2.20, docs/measured.md §8), each checked by
``tests/moe/test_te_parity.py`` on a GPU machine:

1. ``transformer_engine.pytorch`` imports only with CUDA and cuDNN; the import is lazy (never at
   module import time) and any failure is reported as the reason, not raised.
2. ``GroupedLinear(num_gemms, in_features, out_features, bias=..., params_dtype=..., device=...)``
   with default ``parallel_mode=None`` (no TP) and the default per-GEMM parameters
   ``weight{i}`` ``[out, in]`` / ``bias{i}`` ``[out]``; ``single_grouped_weight`` is not used
   (it needs ``NVTE_GROUPED_LINEAR_SINGLE_PARAM=1`` and grouped tensors; the twin models it).
3. ``forward(inp, m_splits)`` with ``m_splits`` a Python list (accepted by every version; 2.17+
   also takes an int64 tensor) computes ``cat_i(x_i @ w_i^T + b_i)`` outside FP8 autocast.
4. The forward reads the weights as ``getattr(self, f"weight{i}")`` at call time, so
   ``torch.func.functional_call`` can substitute fake-quantized weights (how
   ``harness.sections.moe.quantized`` quantizes a real TE layer without touching TE's own FP8 machinery).
5. Its state dict holds ``weight{i}``/``bias{i}`` plus ``_extra_state`` (FP8 metadata); weights
   are copied parameter by parameter (``layers.set_expert_params``), never via ``load_state_dict``.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn
from torch.func import functional_call

from .layers import GroupedLinearTwin, MSplits, normalize_splits

BACKENDS = ("auto", "twin", "te")


def te_available() -> tuple[bool, str]:
    """``(True, version)`` when the real ``GroupedLinear`` can be built and run here, else ``(False, reason)``."""
    if not torch.cuda.is_available():
        return False, "no CUDA device: transformer_engine needs CUDA and cuDNN to import"
    try:
        import transformer_engine  # noqa: F401
        import transformer_engine.pytorch as te
    except Exception as exc:  # ImportError, OSError (cudnn .so missing), RuntimeError from the extension
        return False, f"transformer_engine.pytorch not importable: {type(exc).__name__}: {exc}"
    if not hasattr(te, "GroupedLinear"):
        return False, "transformer_engine.pytorch has no GroupedLinear"
    return True, f"transformer_engine {getattr(transformer_engine, '__version__', '?')}"


def is_real_te(layer: nn.Module) -> bool:
    """True when ``layer`` is a real ``transformer_engine.pytorch.GroupedLinear``."""
    return type(layer).__module__.startswith("transformer_engine")


def make_grouped_linear(
    num_gemms: int,
    in_features: int,
    out_features: int,
    *,
    bias: bool = True,
    params_dtype: torch.dtype | None = None,
    device: torch.device | str = "cpu",
    backend: str = "auto",
    single_grouped_weight: bool = False,
) -> nn.Module:
    """A grouped expert linear: real TE (``backend="te"``, or ``"auto"`` on CUDA with TE) or the twin.

    ``backend="te"`` raises ``RuntimeError`` with the reason when TE cannot run here;
    ``single_grouped_weight=True`` is a twin-only layout (``ValueError`` with ``backend="te"``).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    dev = torch.device(device)
    use_te = False
    if backend in ("auto", "te") and dev.type == "cuda" and not single_grouped_weight:
        ok, why = te_available()
        use_te = ok
        if backend == "te" and not ok:
            raise RuntimeError(f"real GroupedLinear requested but unavailable: {why}")
    elif backend == "te":
        raise ValueError("backend='te' needs device='cuda' and single_grouped_weight=False")
    if use_te:
        import transformer_engine.pytorch as te

        return te.GroupedLinear(num_gemms, in_features, out_features, bias=bias, params_dtype=params_dtype, device=dev)
    return GroupedLinearTwin(
        num_gemms, in_features, out_features, bias=bias, params_dtype=params_dtype, device=dev,
        single_grouped_weight=single_grouped_weight,
    )


def grouped_forward(layer: nn.Module, inp: torch.Tensor, m_splits: MSplits, weights: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
    """``layer(inp, m_splits)`` with the expert weights optionally replaced by ``weights``.

    ``m_splits`` is handed to the layer as a list (assumption 3).  Replacement goes through
    ``torch.func.functional_call`` (assumption 4); gradients flow into whatever produced
    ``weights`` (e.g. a straight-through fake quantizer of the layer's own parameters).
    """
    splits = normalize_splits(m_splits, layer.num_gemms, inp.shape[0])
    if weights is None:
        return layer(inp, splits)
    if len(weights) != layer.num_gemms:
        raise ValueError(f"{len(weights)} weights for {layer.num_gemms} experts")
    if getattr(layer, "single_grouped_weight", False):
        sub = {"weight": torch.stack(list(weights), dim=0)}
    else:
        sub = {f"weight{i}": w for i, w in enumerate(weights)}
    return functional_call(layer, sub, (inp, splits))
