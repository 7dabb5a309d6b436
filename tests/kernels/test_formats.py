"""The kernels take their format constants from the reference; the kernel-only ones are checked here."""

from __future__ import annotations

import numpy as np

from moe_fq_parity import reference
from moe_fq_parity.kernels import fwd_kernel
from moe_fq_parity.kernels import formats as K


def test_kernel_sixth_is_rn_fp32_of_one_sixth() -> None:
    assert fwd_kernel._SIXTH.value == float(np.float32(1) / np.float32(6)), "RN_fp32(1/6)"


def test_default_variants_equal_the_reference() -> None:
    from moe_fq_parity.kernels.formats import DECLINED, decline_reason

    assert K.DEFAULT_VARIANTS == {f: reference.default_variant(f) for f in reference.FORMATS if f not in DECLINED}
    assert set(K.DEFAULT_VARIANTS) | set(DECLINED) == set(reference.FORMATS) and not set(K.DEFAULT_VARIANTS) & set(DECLINED)
    assert all(decline_reason(f) for f in DECLINED) and decline_reason("int8") == "" and decline_reason("mxfp4") == ""


def test_block_formats_and_square_tiles_are_implemented() -> None:
    import pytest

    from moe_fq_parity.harness.backends.triton_backend import TritonBackend

    backend = TritonBackend()
    for fmt in ("mxfp8", "mxfp4", "fp8_block", "int4_group"):
        spec = K.parse_spec(fmt, None, {})
        assert spec.from_data and spec.block == reference.format_spec(fmt).tiles.size
        assert backend.format_available(fmt) == (True, "") and spec.tile_rows == 1
        if fmt != "int4_group":
            assert K.parse_spec(fmt, None, {"tile_2d": True}).tile_rows == spec.block
            assert backend.options[fmt]["tile_2d"] is None  # every value
        else:
            with pytest.raises(TypeError, match="tile_2d"):
                K.parse_spec(fmt, None, {"tile_2d": True})
    assert K.parse_spec("fp8_block", None, {"fp32_scale": True}).code == K.FMT_FP8B_FP32S
    assert K.parse_spec("nvfp4", None, {"tile_2d": True}).tile_rows == 16
    with pytest.raises(ValueError, match="block_size=16 only"):
        K.parse_spec("nvfp4", None, {"block_size": 32})
