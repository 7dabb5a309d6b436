"""Public entry points of the reference: one dispatcher over formats and variants.

``fake_quant(x, amax, fmt, variant=None, **options)`` works on one tensor ``[..., out, in]``
(a single expert or a stacked ``[N, out, in]``); ``fake_quant_experts`` on a list of N
experts (ragged shapes and empty experts allowed).  What a format takes comes from its
``FormatSpec`` (``reference.formats``): options that a format or variant does not take, or of
the wrong type, raise ``TypeError`` naming them; nothing is silently ignored.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

from .formats import format_spec
from .granularity import FROM_DATA, amax_to_fp32, check_has_values, check_input, granularity_of
from .result import FakeQuantResult
from .ste import DEFAULT_CLIP_RULE, ste_backward


def variants(fmt: str) -> tuple[str, ...]:
    """Names of the variants of ``fmt``; the first is the default."""
    return format_spec(fmt).variant_names


def default_variant(fmt: str) -> str:
    return format_spec(fmt).default_variant


def _variant_fn(x: torch.Tensor, amax: torch.Tensor, fmt: str, variant: str | None, options: dict[str, Any]) -> Callable[..., FakeQuantResult]:
    """The registry's function for ``fmt``/``variant`` after the registry's checks: variant name,
    options (names and types), amax granularity (shape only; the variant validates the values)."""
    spec = format_spec(fmt)
    name = spec.resolve_variant(variant)
    spec.check_options(name, options)
    if amax is None and spec.takes_amax:
        raise TypeError(spec.granularity_problem(FROM_DATA))
    if not spec.takes_amax and amax is not None:
        check_input(x)
        reject_amax(fmt, amax, x)
    if amax is None or isinstance(amax, torch.Tensor):
        check_input(x)
        spec.check_granularity(granularity_of(x, amax))
    return spec.variants[name]


def fake_quant_traced(x: torch.Tensor, amax: Optional[torch.Tensor], fmt: str, variant: str | None = None, **options) -> FakeQuantResult:
    """Like ``fake_quant`` but returns the full ``FakeQuantResult`` (pre-rounding values too)."""
    return _variant_fn(x, amax, fmt, variant, options)(x, amax, **options)


def fake_quant(x: torch.Tensor, amax: Optional[torch.Tensor], fmt: str, variant: str | None = None, **options) -> torch.Tensor:
    """Fake-quantize ``x`` (``[..., out, in]``) to ``fmt`` with ``amax``; output dtype = ``x.dtype``.

    * ``fmt``: a registered format (``reference.FORMATS``: ``int8``, ``int4``, ``fp8_e4m3``, ``nvfp4``,
      ``mxfp8``, ``mxfp4``, ``fp8_block``, ``int4_group``).
    * ``amax``: per tensor ``()``, per expert ``x.shape[:-2]``, per channel ``x.shape[:-1]``, where
      the format takes it (``FormatSpec.amax_granularities``; NVFP4: per tensor or per expert);
      ``None`` for a format whose scales come from the data (granularity ``from_data``: MX, FP8
      block-wise, INT4 group-wise), and only for those.
    * ``variant``: ``None``/``"default"`` or a name from ``variants(fmt)``.
    * ``options``: the format's options (``FormatSpec.options``: INT ``unsigned``, ``narrow_range``;
      NVFP4 ``block_size``, and ``block_amax`` for ``modelopt_static``), type-checked.
    """
    return fake_quant_traced(x, amax, fmt, variant, **options).out


def reject_amax(fmt: str, amax: object, x: Optional[torch.Tensor] = None) -> None:
    """Raise when a format whose scales come from the data (``FormatSpec.takes_amax`` false) gets an
    amax: ``TypeError`` for anything but a tensor (the only valid amax is ``None``), ``ValueError``
    naming the granularity for a tensor (read against ``x``, the stacked input; without ``x``, a
    list's amax: per expert or, 2-D, per channel).  The reference and the kernels both raise this."""
    if amax is None:
        return
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"{fmt} takes no amax (granularity {FROM_DATA}: its scales come from the data); pass amax=None")
    gran = granularity_of(x, amax) if x is not None else ("per_channel" if amax.dim() == 2 else "per_expert")
    raise ValueError(format_spec(fmt).granularity_problem(gran))


def split_expert_amax(weights: Sequence[torch.Tensor], amax: Optional[torch.Tensor], *, fmt: Optional[str] = None
                      ) -> list[Optional[torch.Tensor]]:
    """Split ``[N]`` (per expert) or ``[N, out]`` (per channel) amax into one amax per expert;
    ``amax=None`` with the ``fmt`` of a format that takes no amax gives ``None`` for every expert.

    Raises ``ValueError`` when the amax does not fit the list (count or per-channel rows),
    ``TypeError`` when it is not a tensor (``None`` included, unless ``fmt`` takes no amax).
    """
    n = len(weights)
    if amax is None and fmt is not None and not format_spec(fmt).takes_amax:
        return [None] * n
    if not isinstance(amax, torch.Tensor):
        raise TypeError(f"amax must be a torch.Tensor, got {type(amax).__name__}")
    if amax.dim() == 0 or amax.shape[0] != n:
        raise ValueError(f"amax shape {tuple(amax.shape)} does not give one entry per expert for N={n}")
    if amax.dim() == 1:
        return [amax[i] for i in range(n)]
    if amax.dim() == 2:
        for i, w in enumerate(weights):
            if w.dim() != 2 or w.shape[0] != amax.shape[1]:
                raise ValueError(f"per-channel amax {tuple(amax.shape)} does not fit expert {i} of shape {tuple(w.shape)}")
        return [amax[i] for i in range(n)]
    raise ValueError(f"amax must be [N] or [N, out], got {tuple(amax.shape)}")


def _check_values_held(tensors: Sequence[object], what: str) -> None:
    """``check_has_values`` for each tensor of an expert list, naming the expert (``weights[i]``)."""
    for i, t in enumerate(tensors):
        if isinstance(t, torch.Tensor):
            check_has_values(t, f"{what}[{i}]")


def fake_quant_experts(
    weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: str | None = None, **options
) -> list[torch.Tensor]:
    """Fake-quantize N expert tensors ``[out_i, in_i]`` with per-expert/per-channel ``amax``.

    Each expert is computed independently (the per-expert loop is the definition of the
    grouped result); empty experts return empty tensors.  ``block_amax`` (NVFP4 static) is a
    list of per-expert block amax tensors here.  ``fmt``, ``variant`` and the options are checked
    before anything else, also for an empty list (``N = 0`` returns ``[]`` only for valid arguments).
    """
    if isinstance(weights, torch.Tensor) or not isinstance(weights, (list, tuple)):
        what = "a single tensor" if isinstance(weights, torch.Tensor) else type(weights).__name__
        raise TypeError(f"weights must be a sequence of tensors (one per expert), got {what}")
    block_amax = options.pop("block_amax", None)
    spec = format_spec(fmt)
    spec.check_options(variant, options if block_amax is None else {**options, "block_amax": torch.zeros(0)})
    if block_amax is not None and (not isinstance(block_amax, (list, tuple)) or len(block_amax) != len(weights)):
        raise TypeError(f"block_amax must be a list of one tensor per expert ({len(weights)}), got {type(block_amax).__name__}")
    if amax is None and spec.takes_amax:  # whether an amax is passed at all is checked even for N = 0
        raise TypeError(spec.granularity_problem(FROM_DATA))
    if not spec.takes_amax:
        reject_amax(fmt, amax)
    _check_values_held(weights, "weights")
    per = split_expert_amax(weights, amax, fmt=fmt)
    if isinstance(amax, torch.Tensor) and amax.is_floating_point():
        amax_to_fp32(amax)  # every expert's values at once, in the amax's own dtype: an error names the expert (and row)
    out = []
    for i, (w, a) in enumerate(zip(weights, per)):
        kw = dict(options)
        if block_amax is not None:
            kw["block_amax"] = block_amax[i]
        out.append(fake_quant(w, a, fmt, variant, **kw))
    return out


def ste_backward_experts(
    weights: Sequence[torch.Tensor], amax: Optional[torch.Tensor], grads: Sequence[torch.Tensor], mode: str,
    *, clip_rule: str = DEFAULT_CLIP_RULE, fmt: Optional[str] = None,
) -> list[torch.Tensor]:
    """Per-expert straight-through backward (see ``reference.ste``; each expert's amax is its own
    0-dim or ``[out]`` tensor, so ``clip_rule="torch_promotion"`` compares per-expert amax in the
    weights' dtype and per-channel amax in fp32).  ``amax=None`` needs the ``fmt`` of a format
    without amax (``split_expert_amax``)."""
    if len(grads) != len(weights):
        raise ValueError(f"{len(grads)} gradients for {len(weights)} experts")
    _check_values_held(weights, "weights")
    for i, (w, g) in enumerate(zip(weights, grads)):
        if isinstance(w, torch.Tensor) and isinstance(g, torch.Tensor) and g.device != w.device:
            raise ValueError(f"grads[{i}] is on {g.device} but weights[{i}] is on {w.device}")
    per = split_expert_amax(weights, amax, fmt=fmt)
    return [ste_backward(w, a, g, mode, clip_rule=clip_rule) for w, a, g in zip(weights, per, grads)]
