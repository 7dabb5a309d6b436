"""amax validation and broadcasting: which scale applies to which element.

Layout only, no arithmetic.  A weight tensor is ``[..., out, in]``: a single expert
``[out, in]`` or a stacked grouped weight ``[N, out, in]``.  amax shapes:

* ``()`` or ``(1,)``       -> ``per_tensor``  (one scale for everything)
* ``x.shape[:-2]``          -> ``per_expert``  (``[N]`` for a stacked weight)
* ``x.shape[:-1]``          -> ``per_channel`` (``[N, out]`` / ``[out]``: one scale per output row)
* ``None``                  -> ``from_data``   (formats whose scales come from the data, one per tile
  of the last two dims: MX, FP8 block-wise; they take no amax at all, ``FROM_DATA``)

amax values: finite and ``>= 0``.  NaN, ±inf or negative amax raise ``ValueError`` (a
silent NaN/zero output would hide a calibration bug).  ``-0.0`` passes (``-0.0 >= 0``) and *is*
amax 0: its sign is dropped here, so every format and variant gives for ``-0.0`` exactly the bits
of ``+0.0`` (an amax is a magnitude; without this NVFP4's ``2688 / -0.0 = -inf`` would turn a
zero amax into zero outputs instead of the zero-amax rule).  Zero and tiny amax are defined per
format (see each format's numeric contract).  amax of any float dtype is converted to
fp32 (exact for bf16/fp16; fp64 rounds to nearest) by ``amax_to_fp32``, which checks the values in
the amax's own dtype first: an fp64 ``-1e-50`` is negative (not the ``-0.0`` it rounds to), and a
finite fp64 beyond fp32's range (``1e300``) is refused as such (not as "infinite").
"""

from __future__ import annotations

from typing import Optional

import torch

from .constants import FLOAT_DTYPES

AMAX_GRANULARITIES = ("per_tensor", "per_expert", "per_channel")
"""The granularities of an amax tensor."""
FROM_DATA = "from_data"
"""The granularity of a format that takes no amax (``amax=None``): each tile's scale comes from the
tile's own ``max |x|`` (``reference.mx``, ``reference.fp8_block``)."""
GRANULARITIES = AMAX_GRANULARITIES + (FROM_DATA,)


def check_input(x: torch.Tensor) -> None:
    """Raise ``TypeError``/``ValueError`` unless ``x`` is a float tensor with >= 1 dim that holds
    values (``check_has_values``)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in FLOAT_DTYPES:
        raise TypeError(f"input dtype must be one of {FLOAT_DTYPES}, got {x.dtype}")
    if x.dim() < 1:
        raise ValueError(f"input must have at least 1 dimension, got shape {tuple(x.shape)}")
    check_has_values(x)


def check_has_values(t: torch.Tensor, what: str = "input") -> None:
    """``ValueError`` for a tensor on the meta device: it has a shape but no values, so a fake quant
    (whose result depends on the values: scales, NaN checks) cannot be computed, only guessed."""
    if t.device.type == "meta":
        raise ValueError(f"{what} is on the meta device: a meta tensor holds no values to fake-quantize")


def granularity_of(x: torch.Tensor, amax: Optional[torch.Tensor]) -> str:
    """Name the granularity implied by ``amax.shape`` for input ``x`` (``None``: ``from_data``), or
    raise ``ValueError``."""
    if amax is None:
        return FROM_DATA
    shape = tuple(amax.shape)
    if shape in ((), (1,)):
        return "per_tensor"
    if x.dim() >= 3 and shape == tuple(x.shape[:-2]):
        return "per_expert"
    if x.dim() >= 2 and shape == tuple(x.shape[:-1]):
        return "per_channel"
    raise ValueError(
        f"amax shape {shape} does not fit input shape {tuple(x.shape)}: expected (), (1,), "
        f"{tuple(x.shape[:-2])} (per expert) or {tuple(x.shape[:-1])} (per channel)"
    )


def check_amax_values(amax: torch.Tensor) -> None:
    """Raise ``ValueError`` if any amax is NaN, infinite or negative."""
    if amax.numel() == 0:
        return
    if not bool((~(amax >= 0) | torch.isinf(amax)).any()):  # one reduction and one host sync when all is well
        return
    bad_nan = torch.isnan(amax)
    bad_inf = torch.isinf(amax)
    bad_neg = amax < 0
    for mask, what in ((bad_nan, "NaN"), (bad_inf, "infinite"), (bad_neg, "negative")):
        if bool(mask.any()):
            idx = tuple(int(i) for i in torch.nonzero(mask)[0].tolist())
            raise ValueError(f"amax is {what} at index {idx} (value {float(amax[idx])}); amax must be finite and >= 0")


def amax_to_fp32(amax: torch.Tensor) -> torch.Tensor:
    """``amax`` (a float tensor) as fp32, its values checked first in its own dtype
    (``check_amax_values``), then, for fp64, that none overflows fp32 (``ValueError`` naming the first
    index; bf16 and fp16 always fit).  Used by the reference and the kernels alike."""
    check_amax_values(amax)
    if amax.dtype == torch.float32:
        return amax
    a = amax.to(torch.float32)
    if amax.dtype == torch.float64 and amax.numel() and bool(torch.isinf(a).any()):
        idx = tuple(int(i) for i in torch.nonzero(torch.isinf(a))[0].tolist())
        raise ValueError(f"amax is {float(amax[idx])} at index {idx} ({amax.dtype}), beyond the largest fp32 "
                         f"({torch.finfo(torch.float32).max}); amax must be finite and >= 0 in fp32")
    return a


def broadcast_amax(x: torch.Tensor, amax: torch.Tensor) -> torch.Tensor:
    """Validate ``amax`` against ``x`` and return it as fp32, shaped to broadcast over ``x``.

    The result has ``x.dim()`` dims (trailing singleton dims appended) and lives on ``x.device``;
    an amax on another device is an error, not a silent copy.
    """
    check_input(x)
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"amax must be a torch.Tensor, got {type(amax).__name__}")
    if not amax.is_floating_point():
        raise TypeError(f"amax must be a float tensor, got {amax.dtype}")
    if amax.device != x.device:
        raise ValueError(f"amax is on {amax.device} but the input is on {x.device}")
    gran = granularity_of(x, amax)
    a = amax_to_fp32(amax).abs()  # -0.0 -> +0.0 (see the module docstring); every other valid value is unchanged
    if gran == "per_tensor":
        return a.reshape((1,) * x.dim())
    return a.reshape(tuple(a.shape) + (1,) * (x.dim() - a.dim()))


def to_tiles(xf: torch.Tensor, tile: tuple[int, int]) -> torch.Tensor:
    """``[..., out, in]`` -> ``[..., ceil(out/r), ceil(in/c), r*c]``: the tiles ``(r, c)`` of the last
    two dims, each flattened row-major; a partial tile is zero-padded (layout only; zeros never raise
    a tile's ``max |x|``).  ``(1, c)`` is a block of ``c`` along in-features."""
    r, c = tile
    if r < 1 or c < 1:
        raise ValueError(f"tile must be two positive ints, got {tile}")
    if xf.dim() < 2:
        xf = xf.reshape(1, *xf.shape)
    o, n = xf.shape[-2], xf.shape[-1]
    po, pn = (-o) % r, (-n) % c
    if po or pn:
        xf = torch.nn.functional.pad(xf, (0, pn, 0, po))
    lead = xf.shape[:-2]
    t = xf.reshape(*lead, (o + po) // r, r, (n + pn) // c, c)
    return t.transpose(-3, -2).reshape(*lead, (o + po) // r, (n + pn) // c, r * c)


def from_tiles(t: torch.Tensor, tile: tuple[int, int], shape: tuple[int, ...]) -> torch.Tensor:
    """Inverse of ``to_tiles``: back to ``shape`` (the padding dropped)."""
    r, c = tile
    lead = t.shape[:-3]
    nr, nc = t.shape[-3], t.shape[-2]
    y = t.reshape(*lead, nr, nc, r, c).transpose(-3, -2).reshape(*lead, nr * r, nc * c)
    o, n = (shape[-2], shape[-1]) if len(shape) >= 2 else (1, shape[-1])
    return y[..., :o, :n].reshape(shape)
