"""The kernels take their format constants from the reference; the kernel-only ones are checked here."""

from __future__ import annotations

import numpy as np

from moe_fq_parity import reference
from moe_fq_parity.kernels import fwd_kernel
from moe_fq_parity.kernels import formats as K


def test_kernel_sixth_is_rn_fp32_of_one_sixth() -> None:
    assert fwd_kernel._SIXTH.value == float(np.float32(1) / np.float32(6)), "RN_fp32(1/6)"


def test_default_variants_equal_the_reference() -> None:
    assert K.DEFAULT_VARIANTS == {f: reference.default_variant(f) for f in reference.FORMATS}
