"""Golden reference for MoE per-expert fake quantization: the numeric spec.

Each format lives in one module whose docstring is its numeric contract:
``int_quant`` (INT8/INT4), ``fp8_e4m3``, ``nvfp4``, ``mx`` (MXFP8/MXFP4), ``fp8_block`` (FP8
block-wise), ``int_group`` (INT4 group-wise); ``ste`` is the backward, ``calibration``
the max calibration, ``rounding`` the shared device-independent rounding primitives.
``formats`` is the registry: one ``FormatSpec`` per format (variants, options, granularities,
grid, input rules); everything else asks it (``format_spec(fmt)``, ``FORMATS``).
"""

from .api import (
    default_variant,
    fake_quant,
    fake_quant_experts,
    fake_quant_traced,
    split_expert_amax,
    ste_backward_experts,
    variants,
)
from .calibration import max_calibrate, max_calibrate_experts, update_running_amax
from .formats import FORMATS, FormatSpec, format_spec, int_format, register_format, unregister_format
from .result import FakeQuantResult
from .ste import CLIP_RULES, DEFAULT_CLIP_RULE, STE_MODES, ste_backward

__all__ = [
    "CLIP_RULES",
    "DEFAULT_CLIP_RULE",
    "FORMATS",
    "STE_MODES",
    "FakeQuantResult",
    "FormatSpec",
    "default_variant",
    "fake_quant",
    "fake_quant_experts",
    "fake_quant_traced",
    "format_spec",
    "int_format",
    "max_calibrate",
    "max_calibrate_experts",
    "register_format",
    "split_expert_amax",
    "ste_backward",
    "ste_backward_experts",
    "unregister_format",
    "update_running_amax",
    "variants",
]
