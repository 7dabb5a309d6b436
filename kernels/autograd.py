"""``torch.autograd.Function`` wrappers: fake quant forward + straight-through backward.

Forward: the Triton kernel (one launch for all experts) or, with ``use_kernel=False``, the per-expert
reference loop (the module adapter's soft gate); both give the same bits.  Backward:
``pass_through`` returns the incoming gradients themselves (no launch, no copy); ``clipped`` zeroes
where ``|w| > amax`` in one launch (or the reference loop).  amax gets no gradient.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import launch
from .amax import AmaxView, amax_for_list
from .api import STE_MODES
from .formats import FMT_NVFP4, parse_spec
from .geometry import check_expert_list, expert_matrix_shape


def _reference():
    from moe_fq_parity import reference  # soft-gate fallback only

    return reference


class FakeQuantExpertsFn(torch.autograd.Function):
    """``apply(amax, fmt, options, ste_mode, use_kernel, table, *weights) -> tuple of N outputs``.

    ``options`` is a dict of format options; ``table`` an optional cached ``launch.ExpertTable`` for
    ``weights`` (the caller guarantees it matches; ``None`` builds one).
    """

    @staticmethod
    def forward(ctx, amax, fmt, options, ste_mode, use_kernel, table, *weights):  # type: ignore[override]
        ctx.ste_mode = ste_mode
        ctx.use_kernel = use_kernel
        ctx.set_materialize_grads(False)  # unused outputs give None: no zero tensors, no work
        if ste_mode == "clipped":
            ctx.save_for_backward(amax, *weights)
        if use_kernel:
            spec = parse_spec(fmt, None, options)
            table = table or launch.expert_table(weights)
            view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=spec.code == FMT_NVFP4)
            flat, outs = launch.alloc_outputs(table, weights[0].dtype, weights[0].device)
            if table.total:
                launch.fwd_list(table, weights, flat, view, spec, check=False)
            return tuple(outs)
        return tuple(_reference().fake_quant_experts(list(weights), amax, fmt, **options))

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        head = (None,) * 6
        if ctx.ste_mode == "pass_through":
            return head + grads
        amax, *weights = ctx.saved_tensors
        live = [i for i, g in enumerate(grads) if g is not None]
        out: list[torch.Tensor | None] = [None] * len(weights)
        if not live:
            return head + tuple(out)
        ws = [weights[i] for i in live]
        gs = [grads[i].contiguous() for i in live]
        a = amax if len(live) == len(weights) else amax[live]
        if ctx.use_kernel:
            res = _clipped_kernel(ws, gs, a)
        else:
            res = _reference().ste_backward_experts(ws, a, gs, "clipped")
        for i, r in zip(live, res):
            out[i] = r
        return head + tuple(out)


def _clipped_kernel(ws: list[torch.Tensor], gs: list[torch.Tensor], amax: torch.Tensor) -> list[torch.Tensor]:
    view: AmaxView = amax_for_list(amax, [expert_matrix_shape(w)[0] for w in ws], ws[0].device, nvfp4=False)
    table = launch.expert_table(ws, gs)
    flat, outs = launch.alloc_outputs(table, gs[0].dtype, gs[0].device)
    if table.total:
        launch.bwd_list(table, ws, gs, flat, view)
    return outs


def fake_quant_experts_ste(
    weights: Sequence[torch.Tensor],
    amax: torch.Tensor,
    fmt: str,
    *,
    ste_mode: str = "pass_through",
    use_kernel: bool = True,
    table: launch.ExpertTable | None = None,
    **options,
) -> list[torch.Tensor]:
    """Differentiable grouped fake quant of N experts (``amax`` ``[N]`` or ``[N, out]``, fp32).

    * ``ste_mode``: ``"pass_through"`` (Model-Optimizer's default) or ``"clipped"``.
    * ``use_kernel``: Triton kernel (True) or the per-expert reference loop (False): same bits.
    * No value checks and no device sync (callers validate amax once, e.g. the module adapter).
    """
    if ste_mode not in STE_MODES:
        raise ValueError(f"ste_mode must be one of {STE_MODES}, got {ste_mode!r}")
    parse_spec(fmt, None, options)
    if len(weights) == 0:
        return []
    check_expert_list(weights)
    return list(FakeQuantExpertsFn.apply(amax, fmt, dict(options), ste_mode, use_kernel, table, *weights))
