"""The backend contract: what any fake-quant implementation must offer to be judged.

A *backend* is any object with:

* ``name: str``
* ``formats: set[str]`` -- a subset of the registered formats (``reference.FORMATS``)
* ``fake_quant(weights, amax, fmt, **options) -> list[Tensor]``

  - ``weights``: a sequence of N expert tensors ``[out_i, in_i]`` on one device (ragged shapes
    and empty experts allowed);
  - ``amax``: fp32, ``[N]`` per expert or ``[N, out]`` per channel (NVFP4: the per-expert global
    amax ``[N]``), on the weights' device; ``None`` for a format that takes no amax (MX, FP8
    block-wise: ``FormatSpec.takes_amax`` false, scales from the data per tile);
  - ``options``: ``variant`` (a reference variant name, default ``None``), INT ``narrow_range``
    and ``unsigned``, NVFP4 ``block_size``, ``tile_2d`` (MX, FP8 block-wise, NVFP4 ``te``),
    ``fp32_scale`` (FP8 block-wise ``te``); a backend raises ``TypeError``/``ValueError`` for an
    option it does not implement (never ignores it);
  - returns N tensors with the input's shape, dtype and device.

Optional:

* ``ste_backward(weights, amax, grads, fmt, mode, **options) -> list[Tensor]`` with ``mode`` in
  ``{"pass_through", "clipped"}``;
* ``fake_quant_stacked(weight, amax, fmt, **options) -> Tensor`` for a stacked ``[N, out, in]``;
* ``available() -> tuple[bool, str]``: whether it can run here, and why not;
* ``device: str`` -- where to put inputs (``"cpu"``/``"cuda"``); default: ``"cuda"`` if present.

Nothing else is required: outside kernels plug in without glue (``--backend pkg.mod:obj``).
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from moe_fq_parity.reference.formats import FORMATS

STE_MODES = ("pass_through", "clipped")


@runtime_checkable
class Backend(Protocol):
    """Structural type of a backend (see the module docstring)."""

    name: str
    formats: set[str]

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, **options) -> list[torch.Tensor]: ...


class ContractError(TypeError):
    """A backend object does not meet the contract; the message says what is missing."""


def check_backend(obj: object, origin: str = "") -> None:
    """Raise ``ContractError`` naming every way ``obj`` misses the contract."""
    where = f" ({origin})" if origin else ""
    problems: list[str] = []
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        problems.append("missing a non-empty `name: str`")
    formats = getattr(obj, "formats", None)
    if not isinstance(formats, (set, frozenset)) or not formats:
        problems.append("missing `formats: set[str]`")
    elif not set(formats) <= set(FORMATS):
        problems.append(f"`formats` has unknown entries {sorted(set(formats) - set(FORMATS))}; known: {FORMATS}")
    if not callable(getattr(obj, "fake_quant", None)):
        problems.append("missing a callable `fake_quant(weights, amax, fmt, **options)`")
    for opt in ("ste_backward", "fake_quant_stacked", "available"):
        if hasattr(obj, opt) and not callable(getattr(obj, opt)):
            problems.append(f"`{opt}` is present but not callable")
    if problems:
        raise ContractError(f"backend {name or obj!r}{where} does not meet the contract: " + "; ".join(problems))


def backend_device(backend: object) -> torch.device:
    """The device a backend wants its inputs on."""
    dev = getattr(backend, "device", None)
    if dev:
        return torch.device(dev)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def backend_available(backend: object) -> tuple[bool, str]:
    """``(True, "")`` or ``(False, reason)`` from the backend's optional ``available()``."""
    probe = getattr(backend, "available", None)
    if probe is None:
        return True, ""
    try:
        ok, reason = probe()
    except Exception as exc:  # a probe that raises is a reason, not a crash
        return False, f"available() raised {type(exc).__name__}: {exc}"
    return bool(ok), str(reason)
