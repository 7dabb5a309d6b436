"""Model-Optimizer 0.47.0's INT4 block quantizer (the ``INT4_BLOCKWISE_WEIGHT_ONLY_CFG`` preset,
``int4_per_block``) as a contract backend on CPU (``modelopt-int4-block``), format ``int4_group``.

Per expert weight ``w``, what ``mtq.quantize`` with that preset does to a weight quantizer (its
``algorithm: max``, ``weight_only_quantize`` then ``finish_stats_collection``), on one fresh
``TensorQuantizer`` built from the preset's ``*weight_quantizer`` entry (``num_bits: 4``,
``block_sizes: {-1: 128, "type": "static"}``, ``narrow_range`` False: grid ``-8..7``):

1. calibration pass (``enable_calib``, ``disable_quant``, ``quantizer(w)``): the static block path
   zero-pads the last dim to a multiple of 128 (``_setup_for_blockquant``: ``F.pad`` at the end),
   reshapes to ``[-1, 128]`` and ``MaxCalibrator.collect`` takes ``reduce_amax`` over each row:
   ``A = max(|amax(x)|, |amin(x)|)`` per block, in ``w``'s dtype (exact).  ``collect`` asserts the
   block amax holds no NaN and no Inf (``AssertionError`` "detected nan/inf values in amax");
2. ``load_calib_amax``: the quantizer's ``_amax`` is that ``[n_blocks, 1]`` tensor;
3. fake-quant pass (``enable_quant``, ``disable_calib``, ``quantizer(w)``): pad and reshape again, then
   ``fake_tensor_quant`` -> on a CPU tensor ``_tensor_quant`` (eager torch, fp32): ``s = 7 / A``;
   where ``A <= 2**-24`` (tested once per tensor on ``min(A)``, applied per block) ``s = 0``;
   ``q = clamp(round(x * s), -8, 7)``; ``s = 1`` where it was zeroed; ``y = q / s``; cast back to
   ``w``'s dtype, reshaped and the padding sliced off.

That is ``reference.int_group`` variant ``eager`` (declared in ``variants``; the planner reports the
others as not applicable).  Partial groups (in-features not a multiple of 128) are zero-padded as the
reference pads them.  NaN or Inf in a weight: Model-Optimizer's own calibration refuses it (step 1);
this backend raises ``ValueError`` with that message, as the spec (``rejects_nan``) requires.
``pip install 'moe-fq-parity[modelopt]'``.

``modelopt-int4-group`` is the fake-quant pass alone (step 3) on groups of ``group_size`` (32, 64 or
128, Model-Optimizer's INT4 presets): the groups of one expert and their ``reduce_amax`` (NaN- and
inf-propagating, no calibration to refuse them) through the public ``tensor_quant.fake_tensor_quant(x,
amax, None, 4, False, False)``, which on a CPU tensor is ``_tensor_quant``: ``reference.int_group``
variant ``modelopt``, NaN and inf input included.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

from moe_fq_parity.reference import FORMATS

from .quiet_imports import try_import
from .modelopt_backend import INSTALL, modelopt_version

_QUANT = "modelopt.torch.quantization"
FORMAT = "int4_group"
VARIANT = "eager"
"""The ``reference.int_group`` variant Model-Optimizer's CPU block path computes (module docstring)."""


def preset_weight_config(mtq: Any) -> dict:
    """The ``*weight_quantizer`` attributes of Model-Optimizer's ``INT4_BLOCKWISE_WEIGHT_ONLY_CFG``."""
    for entry in mtq.INT4_BLOCKWISE_WEIGHT_ONLY_CFG["quant_cfg"]:
        if entry.get("quantizer_name") == "*weight_quantizer" and "cfg" in entry:
            return dict(entry["cfg"])
    raise RuntimeError("INT4_BLOCKWISE_WEIGHT_ONLY_CFG has no *weight_quantizer entry")


class ModeloptInt4BlockBackend:
    """Model-Optimizer's INT4 block weight quantizer, max-calibrated per expert (module docstring)."""

    name = "modelopt-int4-block"
    device = "cpu"

    def __init__(self) -> None:
        self.formats = {FORMAT} & set(FORMATS)
        self.variants = {f: (VARIANT,) for f in self.formats}
        self.options: dict[str, dict] = {f: {} for f in self.formats}

    upstream_version = staticmethod(modelopt_version)
    """Installed ``nvidia-modelopt`` version, or ``None``."""

    def available(self) -> tuple[bool, str]:
        """Whether Model-Optimizer's quantization package imports here, and what to install if not."""
        why = try_import(_QUANT)[1]
        return (not why, f"{why} ({INSTALL})" if why else "")

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: Optional[torch.Tensor], fmt: str, **options) -> list[torch.Tensor]:
        """Each expert through its own calibrated quantizer; ``variant`` may be left out or be ``"eager"``."""
        self._check_call(fmt, amax, dict(options))
        mtq = try_import(_QUANT)[0]
        cfg = preset_weight_config(mtq)
        with torch.no_grad():
            return [torch.empty_like(w) if w.numel() == 0 else self._one(mtq, cfg, w.contiguous()) for w in weights]

    def _check_call(self, fmt: str, amax: Optional[torch.Tensor], opts: dict) -> None:
        """Raise for what this backend cannot run: not installed (``RuntimeError``), another format, variant
        or an amax (``ValueError``), an option (``TypeError``)."""
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        variant = opts.pop("variant", None)
        if fmt not in self.formats or variant not in (None, VARIANT):
            raise ValueError(f"{self.name} runs {sorted(self.formats)}, variant {VARIANT!r} only; got {fmt} variant {variant!r}")
        if opts:
            raise TypeError(f"{self.name} {fmt} does not take option(s) {sorted(opts)}")
        if amax is not None:
            raise ValueError(f"{fmt} takes no amax (its scales come from the data); pass amax=None")

    @staticmethod
    def _one(mtq: Any, cfg: dict, w: torch.Tensor) -> torch.Tensor:
        from modelopt.torch.quantization.config import QuantizerAttributeConfig

        q = mtq.nn.TensorQuantizer(QuantizerAttributeConfig(**cfg))
        q.enable_calib()
        q.disable_quant()
        try:
            q(w)
        except AssertionError as exc:  # MaxCalibrator.collect's NaN/Inf amax assertions
            raise ValueError(f"Model-Optimizer's max calibration refuses this weight: {exc}") from exc
        q.load_calib_amax()
        q.enable_quant()
        q.disable_calib()
        return q(w)


modelopt_int4_block = ModeloptInt4BlockBackend()
"""Model-Optimizer 0.47.0 INT4 block (128 along in-features) weight quantizer on CPU."""

GROUP_VARIANT = "modelopt"
GROUP_SIZES = (32, 64, 128)


class ModeloptInt4GroupBackend(ModeloptInt4BlockBackend):
    """Model-Optimizer's ``fake_tensor_quant`` on the groups of each expert (module docstring)."""

    name = "modelopt-int4-group"

    def __init__(self) -> None:
        super().__init__()
        self.variants = {f: (GROUP_VARIANT,) for f in self.formats}
        self.options = {f: {"group_size": GROUP_SIZES} for f in self.formats}

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: Optional[torch.Tensor], fmt: str, **options) -> list[torch.Tensor]:
        """Each expert's groups through ``fake_tensor_quant`` with their ``reduce_amax``."""
        opts = dict(options)
        group = opts.pop("group_size", 128)
        variant = opts.pop("variant", None)
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        if fmt not in self.formats or variant not in (None, GROUP_VARIANT) or group not in GROUP_SIZES:
            raise ValueError(f"{self.name} runs {sorted(self.formats)}, variant {GROUP_VARIANT!r}, group_size in {GROUP_SIZES}; "
                             f"got {fmt} variant {variant!r} group_size {group!r}")
        if opts:
            raise TypeError(f"{self.name} {fmt} does not take option(s) {sorted(opts)}")
        if amax is not None:
            raise ValueError(f"{fmt} takes no amax (its scales come from the data); pass amax=None")
        from modelopt.torch.quantization.tensor_quant import fake_tensor_quant
        from modelopt.torch.quantization.utils import reduce_amax

        out = []
        with torch.no_grad():
            for w in weights:
                if w.numel() == 0:
                    out.append(torch.empty_like(w))
                    continue
                n = w.shape[-1]
                g = torch.nn.functional.pad(w, (0, (-n) % group)).reshape(-1, group)
                y = fake_tensor_quant(g, reduce_amax(g, axis=-1, keepdims=True), None, 4, False, False)
                out.append(y.reshape(*w.shape[:-1], -1)[..., :n].contiguous())
        return out


modelopt_int4_group = ModeloptInt4GroupBackend()
"""Model-Optimizer 0.47.0 ``fake_tensor_quant`` on INT4 groups of 32, 64 or 128 on CPU."""
