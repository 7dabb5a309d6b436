"""Pure-torch fake quantizers with ``_amax`` buffers, and the per-expert layouts of a grouped layer.

Numeric contract
================
* Calibration is max calibration (``reference.max_calibrate``): amax of one expert's tensor is
  ``max|x|`` (``per_tensor``: a scalar) or ``max|x|`` per output row (``per_channel``: ``[out]``),
  exact, kept as fp32 in ``_amax`` and folded across batches with a NaN-propagating running max
  (``reference.update_running_amax``).
* **Uncalibrated experts** (an expert that received no tokens): ``_amax`` stays ``0``, the max
  over the empty set (``_amax`` buffers are created as zeros).  Fake quant then applies the
  format's zero-amax rule from ``reference``: INT -> every element ``+0``; FP8 E4M3 -> amax
  treated as 1; NVFP4 -> global scale clamped to fp32 max, elements collapse to ~0 (tiny
  values).  The synced layout replaces it by the max over experts.  Model-Optimizer 0.47 differs
  here (measured on CPU, ``tests/moe/test_modelopt_crosscheck.py``): such a quantizer has *no*
  ``_amax`` and later quantizes dynamically with each input's own max; the two agree on every
  expert that saw calibration tokens and differ only when an uncalibrated expert gets tokens.
* Fake quant is ``reference.fake_quant(x, amax, spec.fmt, spec.variant, **spec.options)`` in
  the forward and ``reference.ste_backward(x, amax, grad, spec.ste_mode)`` in the backward;
  amax gets no gradient.  An empty tensor (an expert with no tokens) is returned as an empty
  copy without calling the reference (the reference's NVFP4 path rejects 0-row tensors).

Layouts of one role's N quantizers on a grouped layer (``ExpertQuantizer``), with state keys:

* ``shared``      -- ``{q}._amax`` one amax for all experts = max over experts (pre-0.47
  Model-Optimizer weights; Model-Optimizer's grouped *input* quantizer);
* ``n_quantizer`` -- ``{q}.{i}._amax``, one ``MaxQuantizer`` per expert (Model-Optimizer 0.47);
* ``one_vector``  -- ``{q}._amax`` ``[N]`` / ``[N, out]`` (form ``flat``) or ``[N, 1, 1]`` /
  ``[N, out, 1]`` (form ``broadcast``).

Modes (``set_quant_mode``): ``off`` (identity), ``calibrate`` (observe amax, return input
unchanged), ``quantize`` (fake quant with the stored amax).  Nothing is read from the environment.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from moe_fq_parity.reference import fake_quant, max_calibrate, ste_backward, update_running_amax

from .roles import QuantSpec
from .state_dict import VECTOR_FORMS

QUANT_MODES = ("off", "calibrate", "quantize")
WEIGHT_LAYOUTS = ("shared", "n_quantizer", "one_vector")


def fake_quant_spec(x: torch.Tensor, amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:
    """``reference.fake_quant`` of ``x`` for ``spec`` (empty ``x``: an empty copy)."""
    if x.numel() == 0:
        return x.detach().clone()
    return fake_quant(x.detach(), amax, spec.fmt, spec.variant, **dict(spec.options))


class FakeQuantSTE(torch.autograd.Function):
    """Forward ``fake_quant_spec``; backward ``reference.ste_backward`` with ``spec.ste_mode``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, amax: torch.Tensor, spec: QuantSpec) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(x, amax)
        ctx.mode = spec.ste_mode
        return fake_quant_spec(x, amax, spec)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        x, amax = ctx.saved_tensors
        if x.numel() == 0:
            return grad, None, None
        return ste_backward(x, amax, grad, ctx.mode), None, None


def _calib_granularity(spec: QuantSpec) -> str:
    return "per_channel" if spec.granularity == "per_channel" else "per_tensor"


def piece_shape(spec: QuantSpec, out_features: int) -> tuple[int, ...]:
    """Shape of one expert's amax: ``()`` per tensor, ``(out,)`` per channel."""
    return (out_features,) if spec.granularity == "per_channel" else ()


class _Moded(nn.Module):
    mode: str = "off"

    def _check_mode(self) -> None:
        if self.mode not in QUANT_MODES:
            raise ValueError(f"quantizer mode must be one of {QUANT_MODES}, got {self.mode!r}")


class MaxQuantizer(_Moded):
    """One quantizer: ``spec``, an fp32 ``_amax`` buffer of ``amax_shape`` (zeros until calibrated)."""

    def __init__(self, spec: QuantSpec, amax_shape: tuple[int, ...] = (), *, device: torch.device | str = "cpu") -> None:
        super().__init__()
        self.spec = spec
        self.register_buffer("_amax", torch.zeros(amax_shape, dtype=torch.float32, device=device))

    @property
    def amax(self) -> torch.Tensor:
        return self._amax

    @torch.no_grad()
    def observe(self, x: torch.Tensor) -> None:
        """Fold ``max_calibrate(x)`` into ``_amax`` (running max)."""
        new = max_calibrate(x, _calib_granularity(self.spec)).to(self._amax.device)
        self._amax.copy_(update_running_amax(self._amax, new))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._check_mode()
        if self.mode == "calibrate":
            self.observe(x)
            return x
        if self.mode == "quantize":
            return FakeQuantSTE.apply(x, self._amax, self.spec)
        return x


@torch.no_grad()
def max_sync_(quantizers: Sequence[MaxQuantizer]) -> torch.Tensor:
    """Set every quantizer's amax to the elementwise max over all of them (Megatron's expert sync)."""
    if not quantizers:
        raise ValueError("nothing to sync")
    synced = quantizers[0].amax.clone()
    for q in quantizers[1:]:
        synced = torch.maximum(synced, q.amax)
    for q in quantizers:
        q.amax.copy_(synced)
    return synced


class ExpertQuantizer(_Moded):
    """The N quantizers of one role of a grouped layer, in one of ``WEIGHT_LAYOUTS``.

    * ``spec``: the role's ``QuantSpec``; ``num_experts``: N; ``out_features``: rows per expert
      (sizes ``per_channel`` amax); ``layout``: ``shared`` | ``n_quantizer`` | ``one_vector``;
      ``vector_form``: ``flat`` | ``broadcast`` (``one_vector`` only; ``ValueError`` otherwise).

    ``forward(xs)`` takes and returns a list of N expert tensors.
    """

    def __init__(
        self, spec: QuantSpec, num_experts: int, out_features: int, layout: str, *,
        vector_form: str = "flat", device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        if layout not in WEIGHT_LAYOUTS:
            raise ValueError(f"layout must be one of {WEIGHT_LAYOUTS}, got {layout!r}")
        if vector_form not in VECTOR_FORMS:
            raise ValueError(f"vector_form must be one of {VECTOR_FORMS}, got {vector_form!r}")
        if layout != "one_vector" and vector_form != "flat":
            raise ValueError(f"vector_form applies to the one_vector layout only, not {layout!r}")
        self.spec = spec
        self.layout = layout
        self.vector_form = vector_form
        self.num_experts = num_experts
        self.piece = piece_shape(spec, out_features)
        if layout == "n_quantizer":
            for i in range(num_experts):
                self.add_module(str(i), MaxQuantizer(spec, self.piece, device=device))
        elif layout == "shared":
            self.register_buffer("_amax", torch.zeros(self.piece, dtype=torch.float32, device=device))
        else:
            shape = (num_experts,) + self.piece
            if vector_form == "broadcast":
                shape = shape + (1,) * (3 - len(shape))
            self.register_buffer("_amax", torch.zeros(shape, dtype=torch.float32, device=device))

    def children_quantizers(self) -> list[MaxQuantizer]:
        if self.layout != "n_quantizer":
            raise ValueError(f"layout {self.layout!r} has no per-expert quantizer modules")
        return [getattr(self, str(i)) for i in range(self.num_experts)]

    def expert_amax(self, i: int) -> torch.Tensor:
        """The amax expert ``i`` is quantized with (piece shape, fp32)."""
        if not 0 <= i < self.num_experts:
            raise IndexError(f"expert {i} out of range for N={self.num_experts}")
        if self.layout == "n_quantizer":
            return getattr(self, str(i)).amax
        if self.layout == "shared":
            return self._amax
        return self._amax[i].reshape(self.piece)

    def amax_per_expert(self) -> list[torch.Tensor]:
        return [self.expert_amax(i) for i in range(self.num_experts)]

    @torch.no_grad()
    def observe(self, xs: Sequence[torch.Tensor]) -> None:
        """Fold each expert's ``max_calibrate`` into its amax (``shared``: into the one amax)."""
        self._check_len(xs)
        gran = _calib_granularity(self.spec)
        if self.layout == "n_quantizer":
            for q, x in zip(self.children_quantizers(), xs):
                q.observe(x)
            return
        new = [max_calibrate(x, gran).to(self._amax.device) for x in xs]
        if self.layout == "shared":
            acc = self._amax.clone()
            for a in new:
                acc = update_running_amax(acc, a)
            self._amax.copy_(acc)
        else:
            for i, a in enumerate(new):
                self._amax[i].copy_(update_running_amax(self._amax[i].reshape(self.piece), a).reshape(self._amax[i].shape))

    @torch.no_grad()
    def sync_(self) -> torch.Tensor:
        """Max-sync the per-expert amax (``n_quantizer``/``one_vector``); returns the synced amax."""
        if self.layout == "n_quantizer":
            return max_sync_(self.children_quantizers())
        if self.layout == "shared":
            return self._amax.clone()
        synced = self._amax.amax(dim=0)
        self._amax.copy_(synced.unsqueeze(0).expand_as(self._amax))
        return synced.reshape(self.piece)

    def _check_len(self, xs: Sequence[torch.Tensor]) -> None:
        if len(xs) != self.num_experts:
            raise ValueError(f"{len(xs)} tensors for {self.num_experts} experts")

    def forward(self, xs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        self._check_mode()
        self._check_len(xs)
        if self.mode == "calibrate":
            self.observe(xs)
            return list(xs)
        if self.mode == "quantize":
            return [FakeQuantSTE.apply(x, self.expert_amax(i), self.spec) for i, x in enumerate(xs)]
        return list(xs)


def set_quant_mode(module: nn.Module, mode: str) -> None:
    """Set ``mode`` on every quantizer inside ``module`` (children of ``ExpertQuantizer`` included)."""
    if mode not in QUANT_MODES:
        raise ValueError(f"mode must be one of {QUANT_MODES}, got {mode!r}")
    for m in module.modules():
        if isinstance(m, _Moded):
            m.mode = mode
