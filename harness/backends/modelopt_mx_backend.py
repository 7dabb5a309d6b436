"""Model-Optimizer 0.47.0's MX tensors (``modelopt.torch.quantization.qtensor``), quantize ->
dequantize, as a contract backend on CPU (``modelopt-mx``).

* ``mxfp8``: ``MXFP8QTensor.quantize(w)`` -> ``(qtensor, scale)``, then
  ``qtensor.dequantize(w.dtype, scale=scale)``: E8M0 exponent ``clamp(ceil(log2(A / 448)), -127,
  127)`` (fp32 ``torch.log2``; ``-127`` unless ``A / 448 > 0``), elements ``x * 2**(127 - c)``
  clamped to +-448 and cast to ``float8_e4m3fn``; accepts a last dim that is not a multiple of 32
  (zero-padded blocks) and 3-D ``[E, out, in]`` weights.
* ``mxfp4``: ``MXFP4QTensor.quantize(w, 32)``, then ``dequantize(w.dtype, scale=..., block_sizes={-1: 32})``:
  exponent ``ceil(max(log2(A / 6), -127))`` (no upper clamp), elements ``x / 2**c`` rounded by counting
  the E2M1 midpoints strictly below ``|x|`` (ties toward zero), the sign from ``torch.sign`` (``+0``
  is written as ``-0``).  The last dim must be a multiple of 32 (else declined).

No amax (``amax=None``): every scale comes from the data.  ``pip install 'moe-fq-parity[modelopt]'``.
"""

from __future__ import annotations

from typing import Optional, Sequence

import torch

from moe_fq_parity.reference import FORMATS

from .quiet_imports import try_import
from .modelopt_backend import INSTALL, modelopt_version
from .torchao_backend import check_mx_call

_QTENSOR = "modelopt.torch.quantization.qtensor"
MX_BLOCK = 32
"""Model-Optimizer's MX block along the last dim."""


class ModeloptMXBackend:
    """Model-Optimizer's ``MXFP8QTensor`` / ``MXFP4QTensor`` (see the module docstring)."""

    name = "modelopt-mx"
    device = "cpu"

    def __init__(self) -> None:
        self.formats = {"mxfp8", "mxfp4"} & set(FORMATS)

    @staticmethod
    def upstream_version() -> Optional[str]:
        return modelopt_version()

    def available(self) -> tuple[bool, str]:
        mod, why = try_import(_QTENSOR)
        if mod is None:
            return False, f"{why} ({INSTALL})"
        return True, ""

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: Optional[torch.Tensor], fmt: str, **options) -> list[torch.Tensor]:
        ok, why = self.available()
        if not ok:
            raise RuntimeError(why)
        if fmt not in self.formats:
            raise ValueError(f"{self.name} does not run {fmt}; it runs {sorted(self.formats)}")
        opts = dict(options)
        if opts.pop("variant", None) not in (None, "default"):
            raise ValueError(f"{self.name} is one implementation and has no variants")
        check_mx_call(self.name, "Model-Optimizer's MX tensors", fmt, amax, opts)
        qt = try_import(_QTENSOR)[0]
        out = []
        with torch.no_grad():
            for w in weights:
                if w.numel() == 0:
                    out.append(torch.empty_like(w))
                elif fmt == "mxfp8":
                    q, scale = qt.MXFP8QTensor.quantize(w.contiguous())
                    out.append(q.dequantize(w.dtype, scale=scale))
                else:
                    if w.shape[-1] % MX_BLOCK:
                        raise NotImplementedError(f"Model-Optimizer's MXFP4 needs the last dim ({w.shape[-1]}) to be a multiple of {MX_BLOCK}")
                    q, scale = qt.MXFP4QTensor.quantize(w.contiguous(), MX_BLOCK)
                    out.append(q.dequantize(w.dtype, scale=scale, block_sizes={-1: MX_BLOCK}).reshape(w.shape))
        return out


modelopt_mx = ModeloptMXBackend()
"""Model-Optimizer 0.47.0 MXFP8 / MXFP4 tensors on CPU."""
