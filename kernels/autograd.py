"""``torch.autograd.Function`` wrappers: fake quant forward + straight-through backward.

Forward: the Triton kernel (one launch for all experts) or, with ``use_kernel=False``, the per-expert
reference loop (the module adapter's soft gate); both give the same bits.  Backward:
``pass_through`` returns the incoming gradients themselves (no launch, no copy); ``clipped`` zeroes
where ``|w| > amax`` in one launch (or the reference loop).  amax gets no gradient.

Both directions use the cached expert tables of ``tables.table_for`` and never synchronise with
the device (value checks are the kernel's asynchronous ones, ``kernels/checks.py``), so a forward
+ backward can be captured in a CUDA graph once the tables exist (one eager step first).
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import checks, launch, tables
from .amax import reject_amax
from .api import STE_MODES, _clipped_launch, _validate_list, cached_spec, check_square_blocks, expert_amax, fake_quant, ste_backward
from .geometry import check_expert_list


def _reference():
    from moe_fq_parity import reference  # soft-gate fallback only

    return reference


class FakeQuantExpertsFn(torch.autograd.Function):
    """``apply(amax, fmt, options, ste_mode, use_kernel, check, *weights) -> tuple of N outputs``.

    ``options`` is a dict of format options; ``check`` the kernel's ``check_values`` mode.
    """

    @staticmethod
    def forward(ctx, amax, fmt, options, ste_mode, use_kernel, check, *weights):  # type: ignore[override]
        ctx.ste_mode = ste_mode
        ctx.use_kernel = use_kernel
        ctx.fmt = fmt
        ctx.set_materialize_grads(False)  # unused outputs give None: no zero tensors, no work
        if ste_mode == "clipped":
            ctx.save_for_backward(amax, *weights)
        if use_kernel:
            spec = cached_spec(fmt, None, options)
            if spec.from_data:
                reject_amax(fmt, amax)
            if spec.tile_rows > 1:
                check_square_blocks(weights, spec)
            table = tables.table_for(weights, validate=lambda: _validate_list(weights))
            view = expert_amax(spec, amax, table, check=bool(check))
            flat, outs = tables.alloc_outputs(table, weights[0].dtype, table.device)
            if table.total or check:
                launch.fwd_list(table, weights, flat, view, spec, check=check)
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
        if len(live) == len(weights):
            ws, gs, a = weights, [g.contiguous() for g in grads], amax
        else:
            ws = [weights[i] for i in live]
            gs = [grads[i].contiguous() for i in live]
            a = None if amax is None else amax[live]
        if ctx.use_kernel:
            res = _clipped_launch(ws, gs, a)
        else:
            res = _reference().ste_backward_experts(ws, a, gs, "clipped", fmt=ctx.fmt)
        for i, r in zip(live, res):
            out[i] = r
        return head + tuple(out)




class FakeQuantStackedFn(torch.autograd.Function):
    """``apply(amax, fmt, options, ste_mode, use_kernel, check, weight) -> fake-quantized weight``
    for one stacked ``[N, out, in]`` weight (``amax`` ``[N]`` or ``[N, out]``): one launch forward,
    none (pass-through) or one (clipped) backward, one autograd input whatever N is."""

    @staticmethod
    def forward(ctx, amax, fmt, options, ste_mode, use_kernel, check, weight):  # type: ignore[override]
        ctx.ste_mode = ste_mode
        ctx.use_kernel = use_kernel
        ctx.fmt = fmt
        if ste_mode == "clipped":
            ctx.save_for_backward(amax, weight)
        if use_kernel:
            return fake_quant(weight, amax, fmt, check_values=check, **options)
        return _reference().fake_quant(weight, amax, fmt, **options)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        head = (None,) * 6
        if ctx.ste_mode == "pass_through" or grad is None:
            return head + (grad,)
        amax, weight = ctx.saved_tensors
        if ctx.use_kernel:
            return head + (ste_backward(weight, amax, grad.contiguous(), "clipped"),)
        rows = _reference().ste_backward_experts(list(weight.unbind(0)), amax, list(grad.unbind(0)), "clipped", fmt=ctx.fmt)
        return head + (torch.stack(rows) if rows else torch.zeros_like(grad),)


def fake_quant_stacked_ste(
    weight: torch.Tensor,
    amax: torch.Tensor | None,
    fmt: str,
    *,
    ste_mode: str = "pass_through",
    use_kernel: bool = True,
    check_values: bool | str = True,
    **options,
) -> torch.Tensor:
    """Differentiable fake quant of one stacked ``[N, out, in]`` weight (``amax`` ``[N]`` or
    ``[N, out]``, fp32); the same bits as ``fake_quant_experts_ste`` on its rows.  Arguments as there."""
    if ste_mode not in STE_MODES:
        raise ValueError(f"ste_mode must be one of {STE_MODES}, got {ste_mode!r}")
    check = checks.check_mode(check_values)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 3:
        raise TypeError(f"weight must be one [N, out, in] tensor, got {type(weight).__name__}{tuple(getattr(weight, 'shape', ()))}")
    return FakeQuantStackedFn.apply(amax, fmt, dict(options), ste_mode, use_kernel, check, weight)


def fake_quant_experts_ste(
    weights: Sequence[torch.Tensor],
    amax: torch.Tensor | None,
    fmt: str,
    *,
    ste_mode: str = "pass_through",
    use_kernel: bool = True,
    check_values: bool | str = True,
    **options,
) -> list[torch.Tensor]:
    """Differentiable grouped fake quant of N experts (``amax`` ``[N]`` or ``[N, out]``, fp32; ``None``
    for a format whose scales come from the data: its clipped backward keeps every gradient but
    that of NaN weights).

    * ``ste_mode``: ``"pass_through"`` (Model-Optimizer's default) or ``"clipped"``.
    * ``use_kernel``: Triton kernel (True) or the per-expert reference loop (False): same bits.
    * ``check_values``: the kernel's checks (``True``: asynchronous, no device sync; ``"sync"``;
      ``False``), see ``kernels/checks.py``.  The reference loop always checks (it raises).
    """
    if ste_mode not in STE_MODES:
        raise ValueError(f"ste_mode must be one of {STE_MODES}, got {ste_mode!r}")
    cached_spec(fmt, None, options)
    check = checks.check_mode(check_values)
    if isinstance(weights, torch.Tensor):
        raise TypeError("weights must be a sequence of tensors (one per expert), got a single tensor")
    if len(weights) == 0:
        return []
    if not use_kernel:
        _validate_list_types(weights)
    return list(FakeQuantExpertsFn.apply(amax, fmt, dict(options), ste_mode, use_kernel, check, *weights))


def _validate_list_types(weights: Sequence[torch.Tensor]) -> None:
    check_expert_list(weights)
