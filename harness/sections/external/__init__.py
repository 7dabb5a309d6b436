"""Implementations we did not write, judged against the reference: Model-Optimizer, Transformer Engine, torchao.

Each external code path is its own backend (``harness.core.contract``), so a report can say which one
matched which reference variant:

* ``modelopt``        -- Model-Optimizer 0.47.0 on CUDA tensors: its JIT-built CUDA extension
  (INT, FP8) and its static blockwise Triton kernel (NVFP4);
* ``modelopt-eager``  -- the same public functions on CPU tensors: its eager torch code;
* ``te``, ``te-current`` -- Transformer Engine's own quantizers (delayed / current scaling),
  quantize -> dequantize;
* ``modelopt-mx``     -- Model-Optimizer's ``MXFP8QTensor`` / ``MXFP4QTensor`` quantize -> dequantize on CPU;
* ``modelopt-int4-block`` -- Model-Optimizer's INT4 block weight quantizer (``int4_per_block``), max-calibrated, on CPU;
* ``torchao``, ``torchao-ceil``, ``torchao-even``, ``torchao-rceil`` -- torchao's
  ``prototype.mx_formats`` MX quantize -> dequantize, one per ``ScaleCalculationMode`` (``torchao``:
  FLOOR, its default, and its NVFP4), on CPU.

``BACKENDS`` maps those names to ``module:object`` specs (the harness' ``--backend`` syntax).
Importing this package imports no third-party library; each backend probes its own import in
``available()`` and says why it cannot run.
"""

from __future__ import annotations

TORCHAO_BACKENDS = ("torchao", "torchao-ceil", "torchao-even", "torchao-rceil")
"""torchao's MX scale modes (FLOOR, its default and the one with NVFP4, then CEIL, EVEN, RCEIL): one backend each."""

FAMILIES: dict[str, tuple[str, ...]] = {"torchao": TORCHAO_BACKENDS}
"""A name ``variant_match --backend`` expands to several backends (every mode of one upstream)."""

BACKENDS: dict[str, str] = {
    "modelopt": "moe_fq_parity.harness.sections.external.modelopt_backend:modelopt",
    "modelopt-eager": "moe_fq_parity.harness.sections.external.modelopt_backend:modelopt_eager",
    "te": "moe_fq_parity.harness.sections.external.te_backend:te",
    "te-current": "moe_fq_parity.harness.sections.external.te_backend:te_current",
    "modelopt-mx": "moe_fq_parity.harness.sections.external.modelopt_mx_backend:modelopt_mx",
    "modelopt-int4-block": "moe_fq_parity.harness.sections.external.modelopt_int4_block:modelopt_int4_block",
    **{n: f"moe_fq_parity.harness.sections.external.torchao_backend:{n.replace('-', '_')}" for n in TORCHAO_BACKENDS},
}
"""External backend name -> ``module:object``, in report order."""

INSTALL_HINTS: dict[str, str] = {
    "modelopt": "pip install 'moe-fq-parity[modelopt]'",
    "modelopt-eager": "pip install 'moe-fq-parity[modelopt]'",
    "te": "pip install 'moe-fq-parity[te]' on a host with CUDA and cuDNN",
    "te-current": "pip install 'moe-fq-parity[te]' on a host with CUDA and cuDNN",
    "modelopt-mx": "pip install 'moe-fq-parity[modelopt]'",
    "modelopt-int4-block": "pip install 'moe-fq-parity[modelopt]'",
    **{n: "pip install 'moe-fq-parity[torchao]'" for n in TORCHAO_BACKENDS},
}
"""What makes each external backend available, shown next to its reason when it is not."""
