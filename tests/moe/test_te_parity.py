"""Real Transformer Engine ``GroupedLinear`` vs the twin, on a GPU machine (``pytest tests/moe -m gpu``).

Skipped with the reason when ``transformer_engine.pytorch`` cannot run here (always on CPU).
Checks the adapter's assumptions (``harness.sections.moe.te_adapter``): TE's parameter names, bitwise
equal outputs for the same weights and routing (empty experts included, bias on and off),
every calibrated model's amax and outputs equal between twin and real module, all checks of
the section passing on the real module, and -- where Model-Optimizer is installed -- its
quantizers on the real module against ours.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.sections.moe.bench import build_bench
from moe_fq_parity.harness.sections.moe.checks_input import input_rows
from moe_fq_parity.harness.sections.moe.checks_weight import weight_rows
from moe_fq_parity.harness.sections.moe.compare import RowSink
from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.layers import set_expert_params
from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe
from moe_fq_parity.harness.sections.moe.section import te_vs_twin_rows, run
from moe_fq_parity.harness.sections.moe.te_adapter import grouped_forward, is_real_te, make_grouped_linear, te_available
from moe_fq_parity.harness.core.bits import bits_equal

pytestmark = pytest.mark.gpu

SHAPE = ExpertShape(4, 512, 256, 40)
"""docs/measured.md §8: ``GroupedLinear(4, 256, 512, bias=False, params_dtype=bf16)``, routing ``[10, 0, 20, 10]``."""
SPECS = [
    (QuantSpec("fp8_e4m3", "per_tensor"), QuantSpec("fp8_e4m3", "per_tensor")),
    (QuantSpec("int8", "per_channel"), QuantSpec("int8", "per_tensor")),
    (QuantSpec("nvfp4", "per_tensor"), QuantSpec("nvfp4", "per_tensor")),
]


@pytest.fixture(scope="module", autouse=True)
def _need_te():
    ok, why = te_available()
    if not ok:
        pytest.skip(f"real transformer_engine GroupedLinear unavailable: {why}")


def _pair(bias: bool):
    data = make_expert_data(SHAPE, seed=8, device="cuda")
    layers = {}
    for backend in ("twin", "te"):
        layer = make_grouped_linear(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, bias=bias,
                                    params_dtype=SHAPE.dtype, device="cuda", backend=backend)
        set_expert_params(layer, data.weights, data.biases if bias else None)
        layers[backend] = layer
    assert is_real_te(layers["te"]) and not is_real_te(layers["twin"])
    return data, layers


@pytest.mark.parametrize("bias", [False, True])
def test_real_module_has_te_parameter_names(bias):
    _, layers = _pair(bias)
    names = {n for n, _ in layers["te"].named_parameters()}
    want = {f"weight{i}" for i in range(SHAPE.num_experts)} | ({f"bias{i}" for i in range(SHAPE.num_experts)} if bias else set())
    assert names == want == {n for n, _ in layers["twin"].named_parameters()}


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("routing", ["measured", "calib", "all_routed"])
def test_twin_and_real_outputs_are_bitwise_equal(bias, routing):
    data, layers = _pair(bias)
    if routing == "measured":
        splits = [10, 0, 20, 10]
        x = data.routings["all_routed"][0][:40]
    else:
        x, splits = data.routings[routing]
    with torch.no_grad():
        twin, real = (grouped_forward(layers[b], x, splits) for b in ("twin", "te"))
    assert real.shape == twin.shape and real.dtype == twin.dtype
    bad = int((~bits_equal(twin, real)).sum())
    assert bad == 0, f"{bad}/{twin.numel()} output elements differ (bias={bias}, splits={splits})"


@pytest.mark.parametrize("wspec,ispec", SPECS, ids=lambda s: s.id)
def test_calibrated_models_on_real_module_match_twin_and_pass_every_check(wspec, ispec):
    data = make_expert_data(SHAPE, seed=9, device="cuda")
    recipe = Recipe.uniform(["fc1"], wspec, ispec)
    benches = {b: build_bench(recipe, "fc1", SHAPE, data, backend=b, device="cuda") for b in ("twin", "te")}
    sink = RowSink("te", "gpu-test", 9, "cuda")
    te_vs_twin_rows(benches["twin"], benches["te"], sink)
    weight_rows(benches["te"], sink)
    input_rows(benches["te"], sink)
    failing = [(r.id, r.message) for r in sink.rows if r.verdict != "pass"]
    assert failing == []


def test_section_on_cuda_runs_real_module_rows():
    section = run("smoke", 0, "cuda")
    assert any(r.id.startswith("te/") and "/te_vs_twin/" in r.id for r in section.rows)
    assert [(r.id, r.message) for r in section.rows if r.verdict == "fail"] == []


def test_modelopt_quantizers_on_real_module():
    """docs/measured.md §8: weight_quantizer.{i} per expert (== ours), one shared input amax (== ours, shared)."""
    mtq = pytest.importorskip("modelopt.torch.quantization", reason="nvidia-modelopt not installed")
    data, layers = _pair(bias=False)
    te_layer = layers["te"]

    class Wrap(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = te_layer

        def forward(self, x, splits):
            return self.experts(x, splits)

    model = Wrap()
    mtq.quantize(model, mtq.FP8_DEFAULT_CFG, lambda m: [m(x, s) for x, s in data.calib])
    sd = {k: v for k, v in model.state_dict().items() if k.endswith("_amax")}
    spec = QuantSpec("fp8_e4m3", "per_tensor")
    bench = build_bench(Recipe.uniform(["fc1"], spec, spec), "fc1", SHAPE, data, backend="twin", device="cuda")
    ours_w = bench.weight_models["n_quantizer"].weight_amax()
    ours_in = bench.input_models["grouped_shared"].input_amax()[0]
    if "experts.weight_quantizer._amax" in sd:
        theirs_w = list(sd["experts.weight_quantizer._amax"].reshape(SHAPE.num_experts, -1)[:, 0])
    else:
        theirs_w = [sd[f"experts.weight_quantizer.{i}._amax"] for i in range(SHAPE.num_experts)]
    assert [float(t) for t in theirs_w] == [float(a) for a in ours_w], sorted(sd)
    assert float(sd["experts.input_quantizer._amax"]) == float(ours_in), sorted(sd)
