"""kernels/formats.py restates a few reference constants: they must stay equal (defined once, checked)."""

from __future__ import annotations

import numpy as np
import pytest

import reference
from kernels import fwd_kernel
from kernels import formats as K
from reference import constants as R


def test_constants_equal_the_reference() -> None:
    assert K.FORMATS == R.FORMATS
    assert K.FORMAT_BITS == R.FORMAT_BITS
    assert K.FLOAT_DTYPES == R.FLOAT_DTYPES
    for name in ("E4M3_MAX", "E2M1_MAX", "NVFP4_BLOCK", "NVFP4_GLOBAL_SCALE_NUM", "TINY_AMAX", "FP32_MAX"):
        assert getattr(K, name) == getattr(R, name), name
    assert fwd_kernel._SIXTH.value == float(np.float32(1) / np.float32(6)), "RN_fp32(1/6)"


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("unsigned,narrow", [(False, False), (False, True), (True, False)])
def test_int_bounds_equal_the_reference(bits: int, unsigned: bool, narrow: bool) -> None:
    assert K.int_bounds(bits, unsigned=unsigned, narrow_range=narrow) == R.int_bounds(bits, unsigned=unsigned, narrow_range=narrow)


def test_default_variants_equal_the_reference() -> None:
    assert K.DEFAULT_VARIANTS == {f: reference.default_variant(f) for f in R.FORMATS}
