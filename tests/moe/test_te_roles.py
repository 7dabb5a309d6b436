"""Transformer Engine's quantizer roles and role-addressed factories against TE's documented
behaviour (its ``QuantizerRole`` change and ``custom_recipes/quantizer_factories.py``).

Transformer Engine does not import without CUDA and cuDNN, so on CPU these tests hold our model
to the documented tables; on a GPU with TE, the last test compares with the real modules.
"""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.sections.moe import checks_te_roles as ct
from moe_fq_parity.harness.sections.moe import te_roles as tr
from moe_fq_parity.harness.sections.moe.roles import Role
from moe_fq_parity.harness.sections.moe.te_roles import QuantizerRole as R

N = 3


def test_linear_roles_in_order():
    assert tr.quantizer_roles("linear", "proj", fwd=True, num_quantizers=tr.num_quantizers("linear", True)) == [
        R("linear", "input", "proj"), R("linear", "weight", "proj"), None]
    assert tr.quantizer_roles("linear", "proj", fwd=False, num_quantizers=tr.num_quantizers("linear", False)) == [R("linear", "grad_output", "proj"), None]


def test_grouped_linear_repeats_the_pattern_per_gemm():
    fwd = tr.quantizer_roles("grouped_linear", "fc1", fwd=True, num_quantizers=tr.num_quantizers("grouped_linear", True, N))
    bwd = tr.quantizer_roles("grouped_linear", "fc1", fwd=False, num_quantizers=tr.num_quantizers("grouped_linear", False, N))
    assert len(fwd) == 3 * N and len(bwd) == 2 * N
    assert fwd == [R("grouped_linear", "input", "fc1"), R("grouped_linear", "weight", "fc1"), None] * N
    assert bwd == [R("grouped_linear", "grad_output", "fc1"), None] * N


def test_layernorm_mlp_labels_internal_tensors_by_their_consumer():
    fwd = tr.quantizer_roles("layernorm_mlp", "mlp", fwd=True, num_quantizers=tr.num_quantizers("layernorm_mlp", True))
    bwd = tr.quantizer_roles("layernorm_mlp", "mlp", fwd=False, num_quantizers=tr.num_quantizers("layernorm_mlp", False))
    fc1, fc2 = "mlp.fc1", "mlp.fc2"
    assert fwd == [R("linear", "input", fc1), R("linear", "weight", fc1), R("linear", "input", fc2), R("linear", "input", fc2),
                   R("linear", "weight", fc2), None]
    assert bwd == [R("linear", "grad_output", fc1), None, R("linear", "grad_output", fc2), R("linear", "grad_output", fc1)]
    assert tr.quantizer_roles("layernorm_mlp", "", fwd=True, num_quantizers=2)[0].name == "fc1"


def test_role_fields_default_empty_and_print_known_fields():
    assert str(R()) == "QuantizerRole()" and str(R("linear", "weight")) == "module_type=linear|tensor_type=weight"
    with pytest.raises(ValueError, match="module kind"):
        tr.quantizer_roles("conv", fwd=True, num_quantizers=3)


@pytest.mark.parametrize("role,dtype", [
    (R("linear", "input", "x"), "e4m3"), (R("linear", "weight", "x"), "e4m3"), (R("grouped_linear", "weight", "fc1"), "e4m3"),
    (R("linear", "grad_output", "x"), "e5m2"), (R("grouped_linear", "grad_output", "fc1"), "e5m2"), (R("dpa", "grad_output"), "e5m2"),
    (None, "e4m3"), (R(), "e4m3"),
])
def test_current_scaling_factory_e5m2_for_grads_e4m3_otherwise(role, dtype):
    spec = tr.current_scaling_factory(role)
    assert spec.dtype == dtype and spec.tile is None
    assert (spec.reference == ("fp8_e4m3", "te_current")) == (dtype == "e4m3")


@pytest.mark.parametrize("role,tile,rht,sr", [
    (R("linear", "weight", "x"), (16, 16), False, False), (R("grouped_linear", "weight", "fc1"), (16, 16), False, False),
    (R("linear", "input", "x"), (1, 16), True, False), (R("grouped_linear", "grad_output", "fc1"), (1, 16), True, True),
    (R("dpa", "weight"), (1, 16), True, False), (None, (1, 16), True, False),
])
def test_nvfp4_factory_16x16_tiles_for_gemm_weights_1x16_otherwise(role, tile, rht, sr):
    spec = tr.nvfp4_factory(role)
    assert (spec.dtype, spec.tile, spec.rht, spec.stochastic_rounding) == ("e2m1", tile, rht, sr)


def test_recipe_state_create_makes_one_quantizer_per_role_in_order():
    roles = tr.quantizer_roles("grouped_linear", "fc1", fwd=True, num_quantizers=tr.num_quantizers("grouped_linear", True, N))
    specs = tr.recipe_state_create(tr.nvfp4_factory, roles)
    assert [s.tile for s in specs] == [(1, 16), (16, 16), (1, 16)] * N
    bwd = tr.recipe_state_create(tr.current_scaling_factory, tr.quantizer_roles("linear", "x", fwd=False, num_quantizers=2))
    assert [s.dtype for s in bwd] == ["e5m2", "e4m3"]
    with pytest.raises(ValueError, match="empty"):
        tr.recipe_state_create(tr.nvfp4_factory, [])


def test_harness_roles_map_to_te_roles():
    assert Role("grouped_linear", "weight", "fc1").quantizer_role() == R("grouped_linear", "weight", "fc1")
    assert Role("sequential_linear", "input", "fc2").quantizer_role() == R("linear", "input", "fc2")


def test_against_real_transformer_engine():
    te, why = tr.real_te()
    if te is None:
        pytest.skip(why)
    real = te.quantization.QuantizerRole
    lin = te.Linear(16, 16, device="cuda")
    lin.name = "proj"
    got = lin.get_quantizer_roles(fwd=True, num_quantizers=3)
    ours = tr.quantizer_roles("linear", "proj", fwd=True, num_quantizers=3)
    assert [(r.module_type, r.tensor_type, r.name) if r else None for r in got] == [
        (r.module_type, r.tensor_type, r.name) if r else None for r in ours]
    assert real("linear", "weight", "x") is not None


def test_report_row_passes_and_fails_when_a_gemm_loses_its_weight_quantizer(monkeypatch):
    from moe_fq_parity.harness.sections.moe.bench import build_bench
    from moe_fq_parity.harness.sections.moe.compare import RowSink
    from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
    from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe

    shape = ExpertShape(4, 16, 32, 24)
    fp8 = QuantSpec("fp8_e4m3", "per_tensor")
    bench = build_bench(Recipe.uniform(["fc1"], fp8, fp8), "fc1", shape, make_expert_data(shape, seed=5), backend="twin", device="cpu")

    def verdicts():
        sink = RowSink("t", "smoke", 0, "cpu")
        ct.te_role_rows(bench, sink)
        return [(r.fields["check"], r.verdict) for r in sink.rows]

    assert verdicts() == [("te_roles/grouped_linear_weight_per_gemm", "pass")]
    monkeypatch.setattr(ct, "num_quantizers", lambda kind, fwd, n=1: 3 * (n - 1))
    assert verdicts() == [("te_roles/grouped_linear_weight_per_gemm", "fail")]
    monkeypatch.undo()
    monkeypatch.setattr(ct, "current_scaling_factory", lambda role: tr.QuantizerSpec("current_scaling", "e4m3", reference=("fp8_e4m3", "eager")))
    assert verdicts() == [("te_roles/grouped_linear_weight_per_gemm", "fail")]
