"""The external backends by name: implementations we did not write, judged against the reference.

Each external code path is its own backend (``harness.core.contract``), so a report can say which one
matched which reference variant:

* ``modelopt``        -- Model-Optimizer 0.47.0 on CUDA tensors: its JIT-built CUDA extension
  (INT, FP8) and its static blockwise Triton kernel (NVFP4);
* ``modelopt-eager``  -- the same public functions on CPU tensors: its eager torch code;
* ``te``, ``te-current`` -- Transformer Engine's own quantizers (delayed / current scaling),
  quantize -> dequantize;
* ``modelopt-mx``     -- Model-Optimizer's ``MXFP8QTensor`` / ``MXFP4QTensor`` quantize -> dequantize on CPU;
* ``modelopt-int4-block`` -- Model-Optimizer's INT4 block weight quantizer (``int4_per_block``), max-calibrated, on CPU;
* ``modelopt-int4-group`` -- its fake-quant pass alone on groups of 32, 64 or 128 (``fake_tensor_quant``), on CPU;
* ``torchao``, ``torchao-ceil``, ``torchao-even``, ``torchao-rceil`` -- torchao's
  ``prototype.mx_formats`` MX quantize -> dequantize, one per ``ScaleCalculationMode`` (``torchao``:
  FLOOR, its default, and its NVFP4), on CPU.

``EXTERNAL_BACKENDS`` is the registry: one line per backend, its ``module:object`` spec (the
harness' ``--backend`` syntax) and what to install.  ``BACKENDS`` and ``INSTALL_HINTS`` are its two
columns.  Importing this module imports no third-party library; each backend probes its own import
in ``available()`` and says why it cannot run.
"""

from __future__ import annotations

from typing import NamedTuple

_HERE = "moe_fq_parity.harness.backends"
_MODELOPT = "pip install 'moe-fq-parity[modelopt]'"
_TE = "pip install 'moe-fq-parity[te]' on a host with CUDA and cuDNN"
_TORCHAO = "pip install 'moe-fq-parity[torchao]'"

TORCHAO_BACKENDS = ("torchao", "torchao-ceil", "torchao-even", "torchao-rceil")
"""torchao's MX scale modes (FLOOR, its default and the one with NVFP4, then CEIL, EVEN, RCEIL): one backend each."""

FAMILIES: dict[str, tuple[str, ...]] = {"torchao": TORCHAO_BACKENDS}
"""A name ``variant_match --backend`` expands to several backends (every mode of one upstream)."""


class ExternalBackend(NamedTuple):
    """Where an external backend lives and what makes it available."""

    spec: str
    """``package.module:object``."""
    hint: str
    """The install command shown next to its reason when it is unavailable."""


EXTERNAL_BACKENDS: dict[str, ExternalBackend] = {
    "modelopt": ExternalBackend(f"{_HERE}.modelopt_backend:modelopt", _MODELOPT),
    "modelopt-eager": ExternalBackend(f"{_HERE}.modelopt_backend:modelopt_eager", _MODELOPT),
    "te": ExternalBackend(f"{_HERE}.te_backend:te", _TE),
    "te-current": ExternalBackend(f"{_HERE}.te_backend:te_current", _TE),
    "modelopt-mx": ExternalBackend(f"{_HERE}.modelopt_mx_backend:modelopt_mx", _MODELOPT),
    "modelopt-int4-block": ExternalBackend(f"{_HERE}.modelopt_int4_block:modelopt_int4_block", _MODELOPT),
    "modelopt-int4-group": ExternalBackend(f"{_HERE}.modelopt_int4_block:modelopt_int4_group", _MODELOPT),
    **{n: ExternalBackend(f"{_HERE}.torchao_backend:{n.replace('-', '_')}", _TORCHAO) for n in TORCHAO_BACKENDS},
}
"""External backend name -> where it lives and what to install, in report order."""

BACKENDS: dict[str, str] = {name: b.spec for name, b in EXTERNAL_BACKENDS.items()}
"""External backend name -> ``module:object``, in report order."""

INSTALL_HINTS: dict[str, str] = {name: b.hint for name, b in EXTERNAL_BACKENDS.items()}
"""What makes each external backend available, shown next to its reason when it is not."""
