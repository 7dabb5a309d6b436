"""Golden vectors: the output bits of Model-Optimizer 0.47.0's CUDA fake-quant extension, shipped
with the package (``reference/data/modelopt_cuda_vectors.npz``; provenance in ``data/README.md``).

Every bf16 bit pattern (``x_bits``: the 65,536 int16 values -32768..32767 viewed as bf16, NaN and
Inf included) for 8 fp32 amax values (``amax``), on an NVIDIA H200.  Each other array is
``[8, 65536]`` int16 = the bf16 bits of the output for ``amax[i]``:

* ``int8_wide``  ``fake_tensor_quant(x, amax, None, 8, False, False)`` (signed, wide range);
* ``int8_narrow`` the same with ``narrow_range=True``; ``int4_wide``: 4 bits, wide range;
* ``fp8_e4m3``   ``scaled_e4m3(x, amax, None, 4, 3)``;
* ``int8_wide_clipgrad``, ``fp8_e4m3_clipgrad``: the input gradient for an all-ones output
  gradient with ``pass_through_bwd=False``; ``int8_wide_passgrad`` with ``pass_through_bwd=True``.

They are evidence that the reference's default variants equal a production implementation nobody
here wrote; they are test data, not the spec (the spec is the modules' numeric contracts).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

GOLDEN_PATH = Path(__file__).with_name("data") / "modelopt_cuda_vectors.npz"
GOLDEN_SHA256 = "cd2201fd23913937473a3b78a78c8efbce1fb192c836b84f0c54c471e043b68c"
"""SHA-256 of the file as produced (checked by the tests)."""
FORWARD_KEYS = ("int8_wide", "int8_narrow", "int4_wide", "fp8_e4m3")
GRADIENT_KEYS = ("int8_wide_clipgrad", "fp8_e4m3_clipgrad", "int8_wide_passgrad")


def load_golden() -> dict[str, np.ndarray]:
    """Every array of the golden file by name (``amax``, ``x_bits`` and the keys above).

    ``FileNotFoundError`` naming the path when the package was installed without its data.
    """
    if not GOLDEN_PATH.exists():
        raise FileNotFoundError(f"golden vectors missing: {GOLDEN_PATH} (package data of moe_fq_parity.reference; reinstall the package)")
    with np.load(GOLDEN_PATH) as npz:
        return {k: npz[k] for k in npz.files}
