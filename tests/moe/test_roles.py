"""Roles and recipes: only consumed tensor types, grouped/sequential counterparts agree."""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe, Role


@pytest.mark.parametrize("tensor_type", ["output", "grad_input", "grad_output", "bias"])
def test_role_rejects_tensor_types_that_are_not_quantized(tensor_type):
    with pytest.raises(ValueError, match="tensor_type"):
        Role("grouped_linear", tensor_type, "fc1")


def test_role_id_and_counterpart():
    r = Role("grouped_linear", "weight", "fc1")
    assert r.id == "grouped_linear/weight/fc1"
    assert r.counterpart() == Role("sequential_linear", "weight", "fc1")
    with pytest.raises(ValueError, match="module_type"):
        Role("linear", "weight", "fc1")
    with pytest.raises(ValueError, match="name"):
        Role("grouped_linear", "weight", "a/b")


def test_spec_validation():
    assert QuantSpec("int8", "per_channel", "clipped").id == "int8/per_channel"
    assert QuantSpec("nvfp4", "per_tensor", variant="modelopt_static").id == "nvfp4-modelopt_static/per_tensor"
    with pytest.raises(ValueError, match="nvfp4"):
        QuantSpec("nvfp4", "per_channel")
    with pytest.raises(ValueError, match="ste_mode"):
        QuantSpec("int8", "per_tensor", "round")
    with pytest.raises(ValueError, match="variant"):
        QuantSpec("int8", "per_tensor", variant="nope")
    with pytest.raises(ValueError, match="fmt"):
        QuantSpec("int3", "per_tensor")


def test_recipe_lookup_and_consistency():
    w, i = QuantSpec("fp8_e4m3", "per_tensor"), QuantSpec("fp8_e4m3", "per_tensor")
    recipe = Recipe.uniform(["fc1", "fc2"], w, i)
    assert recipe.spec_for(Role("grouped_linear", "weight", "fc2")) == w
    assert len(recipe.roles()) == 8
    with pytest.raises(KeyError, match="grouped_linear/weight/fc3"):
        recipe.spec_for(Role("grouped_linear", "weight", "fc3"))
    g, s = Role("grouped_linear", "weight", "fc1"), Role("sequential_linear", "weight", "fc1")
    with pytest.raises(ValueError, match="no counterpart"):
        Recipe.from_mapping({g: w})
    with pytest.raises(ValueError, match="differ"):
        Recipe.from_mapping({g: w, s: QuantSpec("int8", "per_tensor")})
    gi, si = Role("grouped_linear", "input", "fc1"), Role("sequential_linear", "input", "fc1")
    pc = QuantSpec("int8", "per_channel")
    with pytest.raises(ValueError, match="input quantizers are per_tensor"):
        Recipe.from_mapping({gi: pc, si: pc})
