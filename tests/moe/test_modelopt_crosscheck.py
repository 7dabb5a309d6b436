"""Cross-check against Model-Optimizer's own quantizers on plain ``nn.Linear`` experts (CPU).

Model-Optimizer is production code nobody here wrote: its max-calibrated weight and input amax
of per-expert ``nn.Linear`` modules must equal our sequential per-expert amax bit for bit.  It
also pins the one documented difference: an expert that saw no calibration tokens has *no*
``_amax`` in Model-Optimizer (it quantizes dynamically later), while ours holds ``+0``.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.layers import SequentialExperts, set_expert_params
from moe_fq_parity.harness.sections.moe.quantized import QuantSequentialExperts, calibrate
from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe

pytestmark = [
    pytest.mark.slow,  # importing Model-Optimizer alone takes ~5 s of CPU; deselect with -m "not slow"
    pytest.mark.filterwarnings("ignore:Cannot find transformers package:UserWarning"),
]

SHAPE = ExpertShape(4, 16, 32, 40)


class PlainExperts(nn.Module):
    """``local_experts.{i}`` plain ``nn.Linear`` (the module type Model-Optimizer converts)."""

    def __init__(self, weights, biases):
        super().__init__()
        out, inp = weights[0].shape
        self.local_experts = nn.ModuleList(nn.Linear(inp, out, dtype=weights[0].dtype) for _ in weights)
        with torch.no_grad():
            for e, w, b in zip(self.local_experts, weights, biases):
                e.weight.copy_(w)
                e.bias.copy_(b)

    def forward(self, x, splits):
        return torch.cat([e(xi) for e, xi in zip(self.local_experts, x.split(splits))])


def test_modelopt_fp8_amax_equals_ours_and_empty_expert_differs_as_documented():
    mtq = pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt not installed")
    data = make_expert_data(SHAPE, seed=21)
    theirs = PlainExperts(data.weights, data.biases)

    def loop(model):
        for x, splits in data.calib:
            model(x, splits)

    mtq.quantize(theirs, mtq.FP8_DEFAULT_CFG, loop)
    spec = QuantSpec("fp8_e4m3", "per_tensor")
    seq = SequentialExperts(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, params_dtype=SHAPE.dtype)
    set_expert_params(seq, data.weights, data.biases)
    ours = QuantSequentialExperts(seq, Recipe.uniform(["fc1"], spec, spec), "fc1", input_layout="per_expert")
    calibrate(ours, data.calib)
    for i, (e, w_amax, x_amax) in enumerate(zip(theirs.local_experts, ours.weight_amax(), ours.input_amax())):
        assert e.weight_quantizer.amax.float().item() == w_amax.item(), f"weight amax of expert {i}"
        if i in SHAPE.empty:
            assert e.input_quantizer.amax is None, "Model-Optimizer leaves an uncalibrated quantizer unset"
            assert x_amax.item() == 0.0 and not torch.signbit(x_amax)
        else:
            assert e.input_quantizer.amax.float().item() == x_amax.item(), f"input amax of expert {i}"
