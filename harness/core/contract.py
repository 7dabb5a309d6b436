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
* ``device: str`` -- where to put inputs (``"cpu"``/``"cuda"``); default: ``"cuda"`` if present;
* ``variants: Mapping[str, Collection[str]]`` -- per format, the reference variants it implements
  (the default variant among them); a format it leaves out: every variant may be asked for, and a
  decline is a skip;
* ``options: Mapping[str, Mapping[str, Optional[Collection]]]`` -- per format, the options it
  implements and the values it takes (``None``: any value of the option's type); a format it leaves
  out: every option may be asked for.

What a backend declares decides what is planned for it (``harness.checks.plan``): a case of a
format, variant or option value it does not declare is *not applicable* to it (counted per backend,
no record); a case it declares must be checked, and declining it (``NotImplementedError``,
``TypeError``, ``ValueError``) is a failure.

Nothing else is required: outside kernels plug in without glue (``--backend pkg.mod:obj``).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Optional, Protocol, Sequence, runtime_checkable

import torch

from moe_fq_parity.reference.formats import FORMATS, format_spec

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
    problems += declaration_problems(obj)
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


def declared_variants(backend: object, fmt: str) -> Optional[frozenset[str]]:
    """The variants of ``fmt`` the backend declares (``variants``), or ``None`` when it declares none."""
    table = getattr(backend, "variants", None)
    if not isinstance(table, Mapping) or fmt not in table:
        return None
    return frozenset(table[fmt])


def declared_options(backend: object, fmt: str) -> Optional[Mapping[str, Optional[Collection]]]:
    """The options of ``fmt`` the backend declares (``options``: name -> accepted values or ``None``
    for any), or ``None`` when it declares none."""
    table = getattr(backend, "options", None)
    if not isinstance(table, Mapping) or fmt not in table:
        return None
    return table[fmt]


def declaration_problems(obj: object) -> list[str]:
    """How the optional ``variants``/``options`` declarations miss the contract (empty when they meet it)."""
    problems = []
    for attr in ("variants", "options"):
        table = getattr(obj, attr, None)
        if table is None:
            continue
        if not isinstance(table, Mapping):
            problems.append(f"`{attr}` must map a format to what it implements, got {type(table).__name__}")
            continue
        for fmt, declared in table.items():
            if fmt not in FORMATS:
                problems.append(f"`{attr}` names the unknown format {fmt!r}; known: {FORMATS}")
                continue
            spec = format_spec(fmt)
            if attr == "variants":
                unknown = sorted(set(declared) - set(spec.variants)) if isinstance(declared, Collection) and not isinstance(declared, str) else None
                if unknown is None:
                    problems.append(f"`variants[{fmt!r}]` must be a collection of variant names, got {declared!r}")
                elif unknown:
                    problems.append(f"`variants[{fmt!r}]` names unknown variants {unknown}; known: {spec.variant_names}")
            elif not isinstance(declared, Mapping) or not set(declared) <= {o.name for o in spec.options}:
                problems.append(f"`options[{fmt!r}]` must map option names of {fmt} ({[o.name for o in spec.options]}) to accepted values "
                                f"or None, got {declared!r}")
    return problems
