"""Public functional API of the kernels, mirroring ``reference.api`` names and signatures.

* ``fake_quant(x, amax, fmt, variant=None, *, check_values=True, **options)``: one tensor
  ``[..., out, in]`` (a stacked ``[N, out, in]`` grouped weight, or a single expert).
* ``fake_quant_experts(weights, amax, fmt, variant=None, *, check_values=True, **options)``: a list
  of N experts (ragged shapes and empty experts allowed), ``amax`` ``[N]`` or ``[N, out]``.
* ``ste_backward(x, amax, grad_out, mode)`` / ``ste_backward_experts(weights, amax, grads, mode)``;
* ``variants(fmt)``: the reference variants implemented (the default one).

Each call is one kernel launch (none for empty input or pass-through backward) and returns
exactly the bits of the reference default variant (``variant=None``).  ``check_values=True``
validates amax values and, where the reference raises on input values (negative input to unsigned
INT, NaN input to NVFP4), reads the kernel's flags: one device sync per call.  With
``check_values=False`` there is no sync; bad values then give the outputs documented in
``kernels/fwd_kernel.py`` instead of an error.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import env, launch
from .amax import amax_for_list, amax_for_stacked
from .formats import DEFAULT_VARIANTS, FMT_NVFP4, parse_spec
from .geometry import check_expert_list, check_stacked, expert_matrix_shape

STE_MODES = ("pass_through", "clipped")


def variants(fmt: str) -> tuple[str, ...]:
    """The reference variants of ``fmt`` the kernel reproduces: its default only."""
    parse_spec(fmt, None, {})
    return (DEFAULT_VARIANTS[fmt],)


def fake_quant(x: torch.Tensor, amax: torch.Tensor, fmt: str, variant: str | None = None, *, check_values: bool = True, **options) -> torch.Tensor:
    """Fake-quantize ``x`` (``[..., out, in]``, contiguous) with one kernel launch; output dtype = ``x.dtype``.

    * ``amax``: per tensor ``()``, per expert ``x.shape[:-2]``, per channel ``x.shape[:-1]``
      (NVFP4: the global amax, per tensor or per expert), on ``x``'s device.
    * ``variant``: ``None``/``"default"`` or the default's name; others raise ``ValueError``.
    * ``options``: INT ``unsigned``, ``narrow_range``; NVFP4 ``block_size`` (16 only).

    Example: ``fake_quant(w, w.abs().amax(dim=(1, 2)).float(), "fp8_e4m3")`` for ``w`` ``[N, out, in]``.
    """
    spec = parse_spec(fmt, variant, options)
    check_stacked(x)
    a = amax_for_stacked(amax, x.shape, x.device, nvfp4=spec.code == FMT_NVFP4)
    env.require_kernel(x.device)
    out = torch.empty_like(x)
    if x.numel():
        launch.fwd_stacked(x, out, a, spec, check=check_values)
    return out


def fake_quant_experts(
    weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: str | None = None, *, check_values: bool = True, **options
) -> list[torch.Tensor]:
    """Fake-quantize N experts (each ``[..., in]``, contiguous, one dtype and device) in one launch.

    * ``amax``: ``[N]`` fp32 (per expert) or ``[N, out]`` (per channel; every expert ``[out, in]``).
    * Returns N tensors shaped like the inputs (views into one buffer, each 128-byte aligned).
    * ``N = 0`` returns ``[]``; zero-size experts return empty tensors.
    """
    spec = parse_spec(fmt, variant, options)
    if len(weights) == 0:
        return []
    check_expert_list(weights)
    device = weights[0].device
    env.require_kernel(device)
    table = launch.expert_table(weights)
    a = amax_for_list(amax, [r for r, _ in table.shapes], device, nvfp4=spec.code == FMT_NVFP4)
    flat, outs = launch.alloc_outputs(table, weights[0].dtype, device)
    if any(w.numel() for w in weights):
        launch.fwd_list(table, weights, flat, a, spec, check=check_values)
    return outs


def _check_mode(mode: str) -> None:
    if mode not in STE_MODES:
        raise ValueError(f"mode must be one of {STE_MODES}, got {mode!r}")


def ste_backward(x: torch.Tensor, amax: torch.Tensor, grad_out: torch.Tensor, mode: str) -> torch.Tensor:
    """Input gradient of fake quant: ``grad_out`` itself (pass-through, no launch, no copy) or, for
    ``clipped``, ``grad_out`` where ``|x| <= amax`` else ``+0`` (one launch).  See ``reference.ste``."""
    _check_mode(mode)
    check_stacked(x)
    check_stacked(grad_out, "grad_out")
    if grad_out.shape != x.shape:
        raise ValueError(f"grad shape {tuple(grad_out.shape)} != input shape {tuple(x.shape)}")
    if grad_out.device != x.device:
        raise ValueError(f"grad_out is on {grad_out.device} but x is on {x.device}")
    a = amax_for_stacked(amax, x.shape, x.device, nvfp4=False)
    if mode == "pass_through":
        return grad_out
    env.require_kernel(x.device)
    out = torch.empty_like(grad_out)
    if x.numel():
        launch.bwd_stacked(x, grad_out, out, a)
    return out


def ste_backward_experts(
    weights: Sequence[torch.Tensor], amax: torch.Tensor, grads: Sequence[torch.Tensor], mode: str
) -> list[torch.Tensor]:
    """Per-expert straight-through backward for N experts in (at most) one launch.

    No amax value checks (the forward checked the same amax; a NaN amax gives zero gradients).
    """
    _check_mode(mode)
    if len(grads) != len(weights):
        raise ValueError(f"{len(grads)} gradients for {len(weights)} experts")
    if len(weights) == 0:
        return []
    check_expert_list(weights)
    check_expert_list(grads, "grads")
    for i, (w, g) in enumerate(zip(weights, grads)):
        if g.shape != w.shape:
            raise ValueError(f"grads[{i}] shape {tuple(g.shape)} != weights[{i}] shape {tuple(w.shape)}")
    if grads[0].device != weights[0].device:
        raise ValueError(f"grads are on {grads[0].device} but weights are on {weights[0].device}")
    rows = [expert_matrix_shape(w)[0] for w in weights]
    a = amax_for_list(amax, rows, weights[0].device, nvfp4=False)
    if mode == "pass_through":
        return list(grads)
    env.require_kernel(weights[0].device)
    table = launch.expert_table(weights, grads)
    flat, outs = launch.alloc_outputs(table, grads[0].dtype, grads[0].device)
    if any(w.numel() for w in weights):
        launch.bwd_list(table, weights, grads, flat, a)
    return outs
