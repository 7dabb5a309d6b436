"""Public functional API of the kernels, mirroring ``reference.api`` names and signatures.

* ``fake_quant(x, amax, fmt, variant=None, *, check_values=True, **options)``: one tensor
  ``[..., out, in]`` (a stacked ``[N, out, in]`` grouped weight, or a single expert).
* ``fake_quant_experts(weights, amax, fmt, variant=None, *, check_values=True, **options)``: a list
  of N experts (ragged shapes and empty experts allowed), ``amax`` ``[N]`` or ``[N, out]``.
* ``ste_backward(x, amax, grad_out, mode)`` / ``ste_backward_experts(weights, amax, grads, mode)``;
* ``variants(fmt)``: the reference variants implemented (the default one).

Each call is one kernel launch (none for empty input or pass-through backward) and returns
exactly the bits of the reference default variant (``variant=None``).

Checks (``check_values``, see ``kernels/checks.py``): the kernel itself checks amax values and,
where the reference raises on input values (negative input to unsigned INT, NaN input to NVFP4,
NaN or inf input to INT4 group-wise), the input.  ``True`` (default) never blocks the host: on a
CUDA device the ``ValueError`` is raised by a later checked call (or
``kernels.raise_pending_errors()``) and the bad outputs are NaN; ``"sync"`` raises in the call itself at the cost of one device sync; ``False`` checks nothing.
An amax of another dtype than fp32 is checked in the call, in its own dtype, before its conversion
(``kernels/amax.py``; one host sync).

Host cost: the expert list's table (addresses, shapes, launch geometry) is cached
(``tables.table_for``), so a repeated call (same weights, new amax values or not) skips the
per-expert validation and every host-to-device copy, and launches the compiled kernel directly.
Shape/type errors are raised on the host whenever the table is new.  A checked call costs the
host what an unchecked one does (its flags go straight to mapped host memory, ``kernels/checks.py``);
most of the list calls' growth with N is PyTorch creating the N output views and reading the N
tensors' key attributes.  The stacked calls (``fake_quant``, ``ste_backward``) cache their launch
plan on shape, dtype, device and options (``launch._stacked_plan``) and do no per-expert work on
the host.  Repeated launches hand the compiled kernel's launcher raw device addresses
(``launch._launch``).  Measured host time per call: ``docs/kernels_performance.md`` sections 2 and 9.
"""

from __future__ import annotations

from typing import Sequence

import torch

from . import checks, env, launch, tables
from .amax import AmaxView, amax_for_list, amax_for_rows, amax_for_stacked, no_amax, reject_amax
from .formats import DEFAULT_VARIANTS, FMT_NVFP4, QuantSpec, parse_spec
from .geometry import check_expert_list, check_stacked, expert_matrix_shape
from moe_fq_parity.reference.api import split_expert_amax
from moe_fq_parity.reference.granularity import check_has_values

STE_MODES = ("pass_through", "clipped")

_SPECS: dict[tuple, QuantSpec] = {}


def cached_spec(fmt: str, variant: str | None, options: dict) -> QuantSpec:
    """``parse_spec`` memoised on hashable arguments (options with unhashable values are parsed
    every time, and rejected by ``parse_spec`` as before)."""
    try:
        key = (fmt, variant, tuple(sorted(options.items())))
        spec = _SPECS.get(key)
    except TypeError:
        return parse_spec(fmt, variant, options)
    if spec is None:
        spec = _SPECS[key] = parse_spec(fmt, variant, options)
    return spec


def _require_list(weights, what: str) -> None:
    if isinstance(weights, torch.Tensor):
        raise TypeError(f"{what} must be a sequence of tensors (one per expert), got a single tensor")


def variants(fmt: str) -> tuple[str, ...]:
    """The reference variants of ``fmt`` the kernel reproduces: its default only."""
    parse_spec(fmt, None, {})
    return (DEFAULT_VARIANTS[fmt],)


def fake_quant(x: torch.Tensor, amax: torch.Tensor, fmt: str, variant: str | None = None, *, check_values: bool | str = True, **options) -> torch.Tensor:
    """Fake-quantize ``x`` (``[..., out, in]``, contiguous) with one kernel launch; output dtype = ``x.dtype``.

    * ``amax``: per tensor ``()``, per expert ``x.shape[:-2]``, per channel ``x.shape[:-1]``
      (NVFP4: the global amax, per tensor or per expert), on ``x``'s device; ``None`` for the formats
      whose scales come from the data (``int4_group``, ``fp8_block``, ``mxfp8``, ``mxfp4``), which
      refuse an amax as the reference does.
    * ``variant``: ``None``/``"default"`` or the default's name; others raise ``ValueError``.
    * ``options``: INT ``unsigned``, ``narrow_range``; NVFP4 ``block_size`` (16 only); FP8 block-wise
      ``fp32_scale``; ``tile_2d`` (MX, FP8 block-wise, NVFP4: square tiles of the last two dims).
    * ``check_values``: ``True`` (asynchronous checks), ``"sync"`` or ``False``; see the module docstring.

    Example: ``fake_quant(w, w.abs().amax(dim=(1, 2)).float(), "fp8_e4m3")`` for ``w`` ``[N, out, in]``.
    """
    spec = cached_spec(fmt, variant, options)
    mode = checks.check_mode(check_values)
    check_stacked(x)
    if spec.from_data:
        reject_amax(fmt, amax, x)
        a = no_amax(x.device)
    else:
        a = amax_for_stacked(amax, x.shape, x.device, nvfp4=spec.code == FMT_NVFP4, check=bool(mode))
    env.require_kernel(x.device)
    out = torch.empty_like(x)
    if x.numel():
        launch.fwd_stacked(x, out, a, spec, check=mode)
    return out


def fake_quant_experts(
    weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: str | None = None, *, check_values: bool | str = True, **options
) -> list[torch.Tensor]:
    """Fake-quantize N experts (each ``[..., in]``, contiguous, one dtype and device) in one launch.

    * ``amax``: ``[N]`` fp32 (per expert) or ``[N, out]`` (per channel; every expert ``[out, in]``);
      ``None`` for a format whose scales come from the data.
    * Returns N tensors shaped like the inputs (views into one buffer, each 128-byte aligned).
    * ``N = 0`` returns ``[]``; zero-size experts return empty tensors.
    * ``check_values``: ``True`` (asynchronous checks, no host sync), ``"sync"`` (raises in the
      call, one device sync) or ``False``; see the module docstring.
    """
    spec = cached_spec(fmt, variant, options)
    mode = checks.check_mode(check_values)
    _require_list(weights, "weights")
    if spec.from_data:
        reject_amax(fmt, amax)
    if len(weights) == 0:
        split_expert_amax(weights, amax, fmt=fmt)  # the reference's rule: amax a tensor with one entry per expert (none), or None
        return []
    if spec.tile_rows > 1:
        check_square_blocks(weights, spec)
    table = tables.table_for(weights, validate=lambda: _validate_list(weights))
    a = expert_amax(spec, amax, table, check=bool(mode))
    flat, outs = tables.alloc_outputs(table, weights[0].dtype, table.device)
    if table.total or mode:
        launch.fwd_list(table, weights, flat, a, spec, check=mode)
    return outs


def expert_amax(spec: QuantSpec, amax: torch.Tensor | None, table: tables.ExpertTable, *, check: bool = False) -> AmaxView:
    """The amax view of a list launch of ``spec`` over ``table`` (``no_amax`` for a format whose
    scales come from the data; the caller has rejected an amax for it); ``check``: a non-fp32 amax's
    values checked before its conversion (``kernels.amax``)."""
    if spec.from_data:
        return no_amax(table.device)
    return amax_for_rows(amax, table.shapes, table.rows, table.device, nvfp4=spec.code == FMT_NVFP4, check=check)


def check_square_blocks(weights: Sequence[torch.Tensor], spec: QuantSpec) -> None:
    """``tile_2d`` over an expert list: the kernel views an expert ``[..., out, in]`` as one
    ``[rows, in]`` matrix, whose square tiles are the reference's (those of the last two dims) when
    the expert has at most two dims or ``out`` is a multiple of the tile; other experts raise
    ``ValueError`` (the stacked call, ``fake_quant``, takes any shape)."""
    for i, w in enumerate(weights):
        if isinstance(w, torch.Tensor) and w.dim() > 2 and w.shape[-2] % spec.tile_rows:
            raise ValueError(f"weights[{i}] has shape {tuple(w.shape)}: tile_2d over a list takes experts of at most two dims or "
                             f"with out-features a multiple of {spec.tile_rows}; pass it as 2-D experts or through fake_quant")


def _validate_list(weights: Sequence[torch.Tensor]) -> None:
    _, device = check_expert_list(weights)
    check_has_values(weights[0], "weights[0]")  # one device for all: the reference's error for a meta expert
    env.require_kernel(device)


def _check_mode(mode: str) -> None:
    if mode not in STE_MODES:
        raise ValueError(f"mode must be one of {STE_MODES}, got {mode!r}")


def ste_backward(x: torch.Tensor, amax: torch.Tensor | None, grad_out: torch.Tensor, mode: str) -> torch.Tensor:
    """Input gradient of fake quant: ``grad_out`` itself (pass-through, no launch, no copy) or, for
    ``clipped``, ``grad_out`` where ``|x| <= amax`` else ``+0`` (one launch).  ``amax=None`` (a format
    whose scales come from the data): ``clipped`` keeps every gradient but that of NaN ``x``.  See
    ``reference.ste``."""
    _check_mode(mode)
    check_stacked(x)
    check_stacked(grad_out, "grad_out")
    if grad_out.shape != x.shape:
        raise ValueError(f"grad shape {tuple(grad_out.shape)} != input shape {tuple(x.shape)}")
    if grad_out.device != x.device:
        raise ValueError(f"grad_out is on {grad_out.device} but x is on {x.device}")
    a = no_amax(x.device) if amax is None else amax_for_stacked(amax, x.shape, x.device, nvfp4=False)
    if mode == "pass_through":
        return grad_out
    env.require_kernel(x.device)
    out = torch.empty_like(grad_out)
    if x.numel():
        launch.bwd_stacked(x, grad_out, out, a)
    return out


def ste_backward_experts(
    weights: Sequence[torch.Tensor], amax: torch.Tensor | None, grads: Sequence[torch.Tensor], mode: str
) -> list[torch.Tensor]:
    """Per-expert straight-through backward for N experts in (at most) one launch.

    No amax value checks (the forward checked the same amax; a NaN amax gives zero gradients).
    ``amax=None`` (a format whose scales come from the data): ``clipped`` keeps every gradient but
    that of NaN ``x``.
    """
    _check_mode(mode)
    _require_list(weights, "weights")
    _require_list(grads, "grads")
    if len(grads) != len(weights):
        raise ValueError(f"{len(grads)} gradients for {len(weights)} experts")
    if len(weights) == 0:
        return []
    if mode == "pass_through":
        _validate_pairs(weights, grads, kernel=False)
        if amax is not None:
            amax_for_list(amax, [expert_matrix_shape(w)[0] for w in weights], weights[0].device, nvfp4=False)
        return list(grads)
    return _clipped_launch(weights, grads, amax)


def _clipped_launch(weights: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], amax: torch.Tensor | None) -> list[torch.Tensor]:
    """The clipped-STE kernel over an expert list (validated on a table-cache miss); one launch."""
    table = tables.table_for(weights, grads, validate=lambda: _validate_pairs(weights, grads))
    a = no_amax(table.device) if amax is None else amax_for_rows(amax, table.shapes, table.rows, table.device, nvfp4=False)
    flat, outs = tables.alloc_outputs(table, grads[0].dtype, table.device)
    if table.total:
        launch.bwd_list(table, weights, grads, flat, a)
    return outs


def _validate_pairs(weights: Sequence[torch.Tensor], grads: Sequence[torch.Tensor], kernel: bool = True) -> None:
    check_expert_list(weights)
    check_expert_list(grads, "grads")
    for i, (w, g) in enumerate(zip(weights, grads)):
        if g.shape != w.shape:
            raise ValueError(f"grads[{i}] shape {tuple(g.shape)} != weights[{i}] shape {tuple(w.shape)}")
    if grads[0].device != weights[0].device:
        raise ValueError(f"grads are on {grads[0].device} but weights are on {weights[0].device}")
    check_has_values(weights[0], "weights[0]")
    if kernel:
        env.require_kernel(weights[0].device)
