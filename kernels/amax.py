"""amax validation and addressing for the kernels (layout only, no arithmetic).

The kernel reads amax element ``(e, r)`` (expert ``e``, row ``r``) at ``e*se + r*sr`` of an fp32
buffer.  Granularities (as in ``reference/granularity.py``):

* per tensor ``()``/``(1,)`` (stacked input only): ``se = sr = 0``;
* per expert ``[N]`` (``x.shape[:-2]`` when stacked): ``sr = 0``;
* per channel ``[N, out]`` (``x.shape[:-1]`` when stacked): one value per output row.

Non-fp32 float amax is converted to fp32 (exact for bf16/fp16), and a negated view (negative bit
set) is read by value, as the reference reads it (a copy of the few amax values; the kernel reads
memory, which holds the negated values).  An amax on another device than the weights is an error,
not a silent copy.  Values (finite, >= 0) of an fp32 amax are checked by the forward kernel
itself (``kernels/checks.py``): the amax is read from its address on every launch, so an amax
written in place between calls is always the one used and checked.  A checked call (``check``)
with an amax of another dtype checks its values before the conversion, in its own dtype, with the
reference's rule and messages (``reference.granularity.amax_to_fp32``: an fp64 ``-1e-50`` is
negative, not the ``-0.0`` it rounds to; an fp64 ``1e300`` does not fit fp32): one host sync, which
an fp32 amax never costs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from moe_fq_parity.reference.api import reject_amax  # noqa: F401  (the reference's rule, used by the kernels' entry points)
from moe_fq_parity.reference.granularity import amax_to_fp32


class AmaxView(NamedTuple):
    """fp32 amax buffer plus strides; ``per_channel`` tells the kernel to read one value per row
    (a tuple: built on every call, at a third of a frozen dataclass's cost)."""

    data: torch.Tensor
    se: int
    sr: int
    per_channel: bool


def _as_fp32(amax: torch.Tensor, device: torch.device, check: bool) -> torch.Tensor:
    """``amax`` as fp32 on ``device``; ``check``: the values of a non-fp32 amax checked in its own
    dtype before the conversion (``amax_to_fp32``; an fp32 amax is checked by the kernel)."""
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"amax must be a torch.Tensor, got {type(amax).__name__}")
    if not amax.is_floating_point():
        raise TypeError(f"amax must be a float tensor, got {amax.dtype}")
    if amax.device != device:
        raise ValueError(f"amax is on {amax.device} but the input is on {device}")
    if amax.is_neg():
        amax = amax.resolve_neg()
    if amax.dtype == torch.float32:
        return amax
    return amax_to_fp32(amax) if check else amax.to(torch.float32)


def _view(a: torch.Tensor, per_channel: bool) -> AmaxView:
    if per_channel:
        return AmaxView(a, a.stride(0), a.stride(1), True)
    return AmaxView(a, a.stride(0) if a.dim() else 0, 0, False)


def amax_for_list(amax: torch.Tensor, rows: list[int], device: torch.device, *, nvfp4: bool, check: bool = False) -> AmaxView:
    """``[N]`` (per expert) or ``[N, out]`` (per channel, every expert having ``out`` rows); ``check``: as
    in ``_as_fp32``."""
    a = _as_fp32(amax, device, check)
    n = len(rows)
    if a.dim() == 0 or a.shape[0] != n:
        raise ValueError(f"amax shape {tuple(a.shape)} does not give one entry per expert for N={n}")
    if a.dim() == 1:
        return _view(a, False)
    if a.dim() == 2:
        if nvfp4:
            raise ValueError("NVFP4 takes a per-tensor or per-expert global amax, not a per-channel one")
        for i, r in enumerate(rows):
            if r != a.shape[1]:
                raise ValueError(f"per-channel amax {tuple(a.shape)} does not fit expert {i} with {r} rows")
        return _view(a, True)
    raise ValueError(f"amax must be [N] or [N, out], got {tuple(a.shape)}")


def amax_for_stacked(amax: torch.Tensor, shape: torch.Size, device: torch.device, *, nvfp4: bool, check: bool = False) -> AmaxView:
    """amax for one tensor ``[..., out, in]`` viewed as ``[N, out, in]`` (``N`` = product of leads);
    ``check``: as in ``_as_fp32``."""
    if type(amax) is torch.Tensor and amax.dtype == torch.float32 and amax.device == device and amax.dim() == 1 and len(shape) == 3 \
            and amax.shape[0] == shape[0] and not amax.is_neg():  # fmt: skip
        return AmaxView(amax, amax.stride(0), 0, False)  # the usual per-expert [N] of an [N, out, in] weight, without a reshape
    a = _as_fp32(amax, device, check)
    s = tuple(a.shape)
    lead = tuple(shape[:-2]) if len(shape) >= 2 else ()
    n = int(torch.Size(lead).numel())
    if s in ((), (1,)):
        return AmaxView(a.reshape(()), 0, 0, False)
    if len(shape) >= 3 and s == lead:
        return _view(a.reshape(n), False)
    if len(shape) >= 2 and s == tuple(shape[:-1]):
        if nvfp4:
            raise ValueError("NVFP4 takes a per-tensor or per-expert global amax, not a per-channel one")
        return _view(a.reshape(n, shape[-2]), True)
    raise ValueError(
        f"amax shape {s} does not fit input shape {tuple(shape)}: expected (), (1,), "
        f"{lead} (per expert) or {tuple(shape[:-1])} (per channel)"
    )


def amax_for_rows(amax: torch.Tensor, shapes, common: int | None, device: torch.device, *, nvfp4: bool, check: bool = False) -> AmaxView:
    """``amax_for_list`` for a cached table whose experts are ``(rows, cols)`` ``shapes`` (``common``:
    their common row count, ``None`` if ragged): the usual amax shapes take no per-expert loop."""
    n = len(shapes)
    fast = type(amax) is torch.Tensor and amax.dtype == torch.float32 and amax.device == device and not amax.is_neg()
    a = amax if fast else _as_fp32(amax, device, check)
    if a.dim() == 1 and a.shape[0] == n:
        return AmaxView(a, a.stride(0), 0, False)
    if a.dim() == 2 and a.shape[0] == n and not nvfp4 and common == a.shape[1]:
        return AmaxView(a, a.stride(0), a.stride(1), True)
    return amax_for_list(a, [r for r, _ in shapes], device, nvfp4=nvfp4)


_NO_AMAX: dict[torch.device, AmaxView] = {}


def no_amax(device: torch.device) -> AmaxView:
    """The view a format without amax (scales from the data) launches with: one fp32 ``+inf`` read
    by no forward, and by the clipped backward as every element's bound (``|x| <= inf`` keeps every
    gradient but that of NaN ``x``, the reference's clipped STE with ``amax=None``)."""
    view = _NO_AMAX.get(device)
    if view is None:
        view = _NO_AMAX[device] = AmaxView(torch.full((1,), float("inf"), dtype=torch.float32, device=device), 0, 0, False)
    return view
