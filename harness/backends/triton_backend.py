"""Built-in backend ``triton``: adapter over our Triton kernel in ``kernels/`` (probed at runtime).

``kernels`` mirrors the reference's names (STYLE habit 4).  The adapter needs
``kernels.fake_quant_experts(weights, amax, fmt, variant=None, **options)`` and uses, when present,
``kernels.ste_backward_experts(weights, amax, grads, mode)``, ``kernels.fake_quant(x, amax, fmt,
variant=None, **options)`` (stacked ``[N, out, in]``), ``kernels.FORMATS`` and ``kernels.variants(fmt)``; a missing optional entry point raises
``NotImplementedError``, which the checks record as *skipped* with that reason.
Without CUDA it runs under the Triton interpreter (``harness.core.triton_env.prepare`` sets
``TRITON_INTERPRET=1`` unless triton was imported already).  Anything missing makes the backend *unavailable with the reason*, never passed.
"""

from __future__ import annotations

import importlib
import os
from typing import Any, Optional, Sequence

import torch

from moe_fq_parity.reference import FORMATS
from moe_fq_parity.reference.formats import format_spec

from moe_fq_parity.harness.core.triton_env import prepare

REQUIRED = "fake_quant_experts"


def _import_kernels() -> tuple[Optional[Any], str]:
    prepare()
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        return None, "no CUDA device and Triton is not in interpreter mode (TRITON_INTERPRET=1 before importing triton)"
    try:
        importlib.import_module("triton")
    except Exception as exc:  # noqa: BLE001
        return None, f"triton does not import: {type(exc).__name__}: {exc}"
    try:
        mod = importlib.import_module("moe_fq_parity.kernels")
    except Exception as exc:  # noqa: BLE001
        return None, f"kernels does not import: {type(exc).__name__}: {exc}"
    if not callable(getattr(mod, REQUIRED, None)):
        return None, f"kernels API not found: kernels.{REQUIRED} is missing"
    return mod, ""


def _declared(k: Any, formats: set[str]) -> tuple[dict[str, tuple[str, ...]], dict[str, dict[str, Optional[tuple]]]]:
    """What the kernel declares per format (``harness.core.contract``): its variants
    (``kernels.variants``) and the options of those variants in the registry, restricted to the
    values the kernel implements where it implements only some (``kernels.formats.OPTION_VALUES``).  The cases of anything else are not
    applicable to this backend (``harness.checks.plan``)."""
    probe = getattr(k, "variants", None)
    if not callable(probe):
        return {}, {}
    from moe_fq_parity.kernels.formats import OPTION_VALUES  # deferred: kernels needs the triton extra

    variants = {f: tuple(probe(f)) for f in sorted(formats)}
    options = {f: {o.name: OPTION_VALUES.get(o.name)
                   for v in variants[f] for o in format_spec(f).options_for(v) if o.code is not None} for f in variants}
    return variants, options


def _global_amax_only(fmt: str) -> bool:
    """Whether ``fmt`` scales in two levels (a global scale from amax, then per-block scales): its
    amax is per tensor or per expert, never per channel (the kernel's amax view checks that)."""
    return format_spec(fmt).global_scale_numerator is not None


class TritonBackend:
    """Our Triton kernel behind the backend contract (see the module docstring)."""

    name = "triton"

    def __init__(self) -> None:
        self._kernels, self._reason = _import_kernels()
        k = self._kernels
        # the kernel declares what it implements; a registered format it does not list is declined
        self._declared = set(getattr(k, "FORMATS", FORMATS)) if k is not None else set(FORMATS)
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.interpreter = self.device == "cpu"
        self.variants, self.options = _declared(k, self.formats) if k is not None else ({}, {})

    def available(self) -> tuple[bool, str]:
        if self._kernels is None:
            return False, self._reason
        return True, "Triton interpreter (TRITON_INTERPRET=1) on CPU" if self.interpreter else ""

    @property
    def formats(self) -> set[str]:
        """The registered formats the kernel declares (``kernels.FORMATS``); the checks skip the
        others with ``format_available``'s reason."""
        return self._declared & set(FORMATS)

    def format_available(self, fmt: str) -> tuple[bool, str]:
        """Whether the kernel implements ``fmt``, and why not."""
        if fmt not in self.formats:
            from moe_fq_parity.kernels.formats import decline_reason  # deferred: kernels needs the triton extra

            return False, f"the Triton kernel does not implement {fmt} ({decline_reason(fmt)}); it implements {sorted(self.formats)} (kernels.FORMATS)"
        return True, ""

    def _check_variant(self, fmt: str, variant: Optional[str]) -> None:
        ok, why = self.format_available(fmt)
        if not ok:
            raise NotImplementedError(why)
        probe = getattr(self._kernels, "variants", None)
        if variant is not None and callable(probe) and variant not in probe(fmt):
            raise NotImplementedError(f"kernels implements variants {tuple(probe(fmt))} of {fmt}, not {variant!r}")

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: Optional[str] = None, **options) -> list[torch.Tensor]:
        self._check_variant(fmt, variant)
        return list(self._kernels.fake_quant_experts(weights, amax, fmt, variant, **self._checked(options)))

    def _checked(self, options: dict) -> dict:
        """Parity compares rejections call by call: ask for the kernel's synchronous checks (its
        default checks raise from a later call, without blocking the host)."""
        if "check_values" in options:
            return options
        return {**options, "check_values": "sync"}

    def timed_entries(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, variant: Optional[str] = None, *,
                      stacked: Optional[torch.Tensor] = None, **options) -> dict:  # fmt: skip
        """Closures the ``perf`` check times (the quantities of ``benchmarks.bench``): ``default``, the
        public call as users make it (asynchronous checks); ``unchecked``, checks off; ``kernel``,
        the launch alone with its table prepared and outputs allocated once.  ``stacked``: time the
        one-tensor entry point on this ``[N, out, in]`` tensor instead of the expert list."""
        self._check_variant(fmt, variant)
        k = self._kernels
        from moe_fq_parity.kernels import api, launch, tables  # deferred: kernels needs the triton extra
        from moe_fq_parity.kernels.amax import amax_for_stacked, no_amax  # deferred: as above

        spec = api.cached_spec(fmt, variant, options)
        global_only = _global_amax_only(fmt)
        if stacked is not None:
            out = torch.empty_like(stacked)
            view = no_amax(stacked.device) if spec.from_data else amax_for_stacked(amax, stacked.shape, stacked.device, nvfp4=global_only)
            return {
                "default": lambda: k.fake_quant(stacked, amax, fmt, variant, **options),
                "unchecked": lambda: k.fake_quant(stacked, amax, fmt, variant, check_values=False, **options),
                "kernel": lambda: launch.fwd_stacked(stacked, out, view, spec, check=False),
            }
        ws = list(weights)
        table = tables.table_for(ws, validate=lambda: None)
        view = api.expert_amax(spec, amax, table)
        flat, _ = tables.alloc_outputs(table, ws[0].dtype, table.device)
        return {
            "default": lambda: k.fake_quant_experts(ws, amax, fmt, variant, **options),
            "unchecked": lambda: k.fake_quant_experts(ws, amax, fmt, variant, check_values=False, **options),
            "kernel": lambda: launch.fwd_list(table, ws, flat, view, spec, check=False),
        }

    def _optional(self, name: str):
        fn = getattr(self._kernels, name, None)
        if not callable(fn):
            raise NotImplementedError(f"kernels.{name} is not there")
        return fn

    def fake_quant_stacked(self, weight: torch.Tensor, amax: torch.Tensor, fmt: str, variant: Optional[str] = None, **options) -> torch.Tensor:
        self._check_variant(fmt, variant)
        return self._optional("fake_quant")(weight, amax, fmt, variant, **self._checked(options))

    def ste_backward(self, weights, amax, grads, fmt: str, mode: str, **options) -> list[torch.Tensor]:
        return list(self._optional("ste_backward_experts")(weights, amax, grads, mode))
