"""Golden reference for MoE per-expert fake quantization: the numeric spec.

Each format lives in one module whose docstring is its numeric contract:
``int_quant`` (INT8/INT4), ``fp8_e4m3``, ``nvfp4``; ``ste`` is the backward, ``calibration``
the max calibration, ``rounding`` the shared device-independent rounding primitives.
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
from .constants import FORMATS
from .result import FakeQuantResult
from .ste import STE_MODES, ste_backward

__all__ = [
    "FORMATS",
    "STE_MODES",
    "FakeQuantResult",
    "default_variant",
    "fake_quant",
    "fake_quant_experts",
    "fake_quant_traced",
    "max_calibrate",
    "max_calibrate_experts",
    "split_expert_amax",
    "ste_backward",
    "ste_backward_experts",
    "update_running_amax",
    "variants",
]
