"""State-dict layout normalization: round trips bit for bit, early returns, clear split errors."""

from __future__ import annotations

import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data
from moe_fq_parity.harness.sections.moe.layers import GroupedLinearTwin, set_expert_params
from moe_fq_parity.harness.sections.moe.quantized import QuantGroupedExperts, calibrate, set_quant_mode
from moe_fq_parity.harness.sections.moe.roles import QuantSpec, Recipe
from moe_fq_parity.harness.sections.moe.state_dict import (
    grouped_to_indexed, indexed_to_grouped, load_checkpoint, n_quantizer_keys, n_to_vector, save_checkpoint,
    split_grouped_tensor, to_internal_keys, to_upstream_keys, vector_to_n,
)
from moe_fq_parity.harness.core.bits import bits_equal

DTYPES = [torch.bfloat16, torch.float16, torch.float32]


def _same(x: torch.Tensor, y: torch.Tensor) -> bool:
    if x.shape != y.shape or x.dtype != y.dtype:
        return False
    return bool(bits_equal(x, y).all()) if x.is_floating_point() else torch.equal(x, y)


def _bits_same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)


def _random_bits(shape, dtype, g):
    """Arbitrary bit patterns (NaNs, infs, -0 included): the round trip must not touch any of them."""
    width = torch.finfo(dtype).bits
    ints = torch.randint(-(2 ** (width - 1)), 2 ** (width - 1), shape, generator=g, dtype=torch.int64)
    return ints.to({16: torch.int16, 32: torch.int32}[width]).view(dtype)


@settings(max_examples=40, deadline=None, derandomize=True)
@given(n=st.integers(1, 6), out=st.integers(2, 5), inp=st.integers(1, 5), dtype=st.sampled_from(DTYPES),
       packed=st.booleans(), prefix=st.sampled_from(["", "decoder.layers.0.mlp.experts.linear_fc1."]))
def test_indexed_grouped_indexed_roundtrip_is_bit_exact(n, out, inp, dtype, packed, prefix):
    g = torch.Generator().manual_seed(n * 100 + out * 10 + inp)
    sd = {f"{prefix}weight{i}": _random_bits((out, inp), dtype, g) for i in range(n)}
    sd.update({f"{prefix}bias{i}": _random_bits((out,), dtype, g) for i in range(n)})
    sd["other.key"] = torch.arange(3)
    work = dict(sd)
    assert indexed_to_grouped(work, prefix, "weight", n, packed=packed) == "converted"
    assert indexed_to_grouped(work, prefix, "bias", n, packed=packed) == "converted"
    assert work[prefix + "weight"].shape == ((n * out, inp) if packed else (n, out, inp))
    assert work[prefix + "bias"].shape == ((n * out,) if packed else (n, out))
    assert grouped_to_indexed(work, prefix, "weight", n) == "converted"
    assert grouped_to_indexed(work, prefix, "bias", n) == "converted"
    assert _bits_same(sd, work)


def test_packed_with_one_row_per_expert_is_ambiguous_and_unbinds():
    """Megatron's split rule checks ``shape[0] == N`` first: packed ``[N*1, in]`` unbinds to ``[in]``."""
    pieces = split_grouped_tensor("w", torch.arange(12.0).reshape(3, 4), 3)
    assert [p.shape for p in pieces] == [torch.Size([4])] * 3


def test_early_returns_leave_the_dict_untouched():
    w = {f"weight{i}": torch.full((2, 3), float(i)) for i in range(3)}
    both = dict(w, weight=torch.zeros(3, 2, 3))
    snap = dict(both)
    assert indexed_to_grouped(both, "", "weight", 3) == "target_present"
    assert grouped_to_indexed(both, "", "weight", 3) == "target_present"
    assert both.keys() == snap.keys() and all(both[k] is snap[k] for k in both)
    part = {"weight0": w["weight0"], "weight2": w["weight2"]}
    assert indexed_to_grouped(part, "", "weight", 3) == "incomplete" and set(part) == {"weight0", "weight2"}
    assert indexed_to_grouped(dict(w), "", "bias", 3) == "absent"
    assert grouped_to_indexed(dict(w), "", "bias", 3) == "absent"


@pytest.mark.parametrize("shape", [(7, 3), (5,), ()])
def test_split_error_names_key_and_shape(shape):
    sd = {"mlp.linear_fc1.weight": torch.zeros(shape)}
    with pytest.raises(ValueError, match=r"mlp\.linear_fc1\.weight") as info:
        grouped_to_indexed(sd, "mlp.linear_fc1.", "weight", 2 if shape != (5,) else 3)
    assert "Cannot split" in str(info.value)
    if shape:
        assert str(tuple(shape)) in str(info.value)


def test_stacking_mismatched_experts_is_an_error():
    sd = {"weight0": torch.zeros(2, 3), "weight1": torch.zeros(3, 3)}
    with pytest.raises(ValueError, match="weight1"):
        indexed_to_grouped(sd, "", "weight", 2)


@pytest.mark.parametrize("piece", [(), (4,)])
@pytest.mark.parametrize("naming", ["list", "suffix"])
@pytest.mark.parametrize("form", ["flat", "broadcast"])
def test_quantizer_n_vector_roundtrip(piece, naming, form):
    n = 3
    keys = n_quantizer_keys("m.", n, naming=naming)
    assert keys[1] == ("m.weight_quantizer.1._amax" if naming == "list" else "m.weight_quantizer_1._amax")
    sd = {k: torch.rand(piece) + i for i, k in enumerate(keys)}
    work = dict(sd)
    assert n_to_vector(work, "m.", n, piece_ndim=len(piece), naming=naming, form=form) == "converted"
    want = (n,) + piece
    assert work["m.weight_quantizer._amax"].shape == (want + (1,) * (3 - len(want)) if form == "broadcast" else want)
    other = "flat" if form == "broadcast" else "broadcast"
    assert n_to_vector(work, "m.", n, piece_ndim=len(piece), naming=naming, form=other) == "reshaped"
    assert n_to_vector(work, "m.", n, piece_ndim=len(piece), naming=naming, form=other) == "target_present"
    assert vector_to_n(work, "m.", n, piece_ndim=len(piece), naming=naming) == "converted"
    assert _bits_same(sd, work)


def test_quantizer_vector_errors_and_early_returns():
    with pytest.raises(ValueError, match="pre-0.47"):
        vector_to_n({"weight_quantizer._amax": torch.tensor(2.0)}, "", 4)
    with pytest.raises(ValueError, match=r"weight_quantizer\._amax.*\(5,\)"):
        vector_to_n({"weight_quantizer._amax": torch.ones(5)}, "", 4)
    sd = {"weight_quantizer_0._amax": torch.tensor(1.0)}
    assert n_to_vector(sd, "", 2) == "incomplete"
    assert n_to_vector({}, "", 2) == "absent" and vector_to_n({}, "", 2) == "absent"
    both = {"weight_quantizer_0._amax": torch.tensor(1.0), "weight_quantizer._amax": torch.ones(2)}
    assert vector_to_n(dict(both), "", 2) == "target_present"


def test_upstream_and_internal_keys_are_one_mapping():
    """``weight_quantizer_{i}.{buf}`` <-> ``weight_quantizer.{i}.{buf}``, every buffer, only i < n,
    other keys untouched; both namings at once is an error, not a silent overwrite."""
    a, g = torch.tensor(1.5), torch.tensor(3.0)
    sd = {"m.weight_quantizer_0._amax": a, "m.weight_quantizer_0._global_amax": g, "m.weight_quantizer_7._amax": a,
          "m.weight0": torch.ones(2), "m.input_quantizer_0._amax": a}
    assert to_internal_keys(sd, "m.", 2) == 2
    assert set(sd) == {"m.weight_quantizer.0._amax", "m.weight_quantizer.0._global_amax", "m.weight_quantizer_7._amax",
                       "m.weight0", "m.input_quantizer_0._amax"}
    assert sd["m.weight_quantizer.0._global_amax"] is g
    assert to_upstream_keys(sd, "m.", 2) == 2 and "m.weight_quantizer_0._global_amax" in sd
    with pytest.raises(ValueError, match="already present"):
        to_internal_keys({"weight_quantizer_0._amax": a, "weight_quantizer.0._amax": a}, "", 1)


class _NotATensor:
    """Any user class: only a full (code-executing) unpickler can rebuild it."""


def test_load_checkpoint_is_weights_only(tmp_path):
    path = tmp_path / "evil.pt"
    torch.save({"weight0": torch.ones(1), "payload": _NotATensor()}, path)  # needs full unpickling
    with pytest.raises(pickle.UnpicklingError):
        load_checkpoint(path)
    save_checkpoint({"weight0": torch.ones(2)}, tmp_path / "ok.pt")
    assert load_checkpoint(tmp_path / "ok.pt")["weight0"].tolist() == [1.0, 1.0]


SHAPE = ExpertShape(3, 8, 16, 12)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("src_single", [False, True])
def test_twin_loads_either_layout_from_file(tmp_path, bias, src_single):
    data = make_expert_data(SHAPE, seed=11)
    args = (SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features)
    src = GroupedLinearTwin(*args, bias=bias, params_dtype=SHAPE.dtype, single_grouped_weight=src_single)
    set_expert_params(src, data.weights, data.biases if bias else None)
    dst = GroupedLinearTwin(*args, bias=bias, params_dtype=SHAPE.dtype, single_grouped_weight=not src_single)
    save_checkpoint(src.state_dict(), tmp_path / "ckpt.pt")
    dst.load_state_dict(load_checkpoint(tmp_path / "ckpt.pt"), strict=True)
    x, splits = data.routings["all_routed"]
    assert bool(bits_equal(src(x, splits), dst(x, splits)).all())


@pytest.mark.parametrize("src_layout,dst_layout", [
    (("n_quantizer", "flat"), ("one_vector", "broadcast")),
    (("one_vector", "flat"), ("n_quantizer", "flat")),
    (("one_vector", "broadcast"), ("one_vector", "flat")),
])
def test_quantized_layer_loads_other_quantizer_layout(tmp_path, src_layout, dst_layout):
    data = make_expert_data(SHAPE, seed=12)
    recipe = Recipe.uniform(["fc1"], QuantSpec("int8", "per_channel"), QuantSpec("int8", "per_tensor"))

    def build(layout, form):
        twin = GroupedLinearTwin(SHAPE.num_experts, SHAPE.in_features, SHAPE.out_features, params_dtype=SHAPE.dtype)
        set_expert_params(twin, data.weights, data.biases)
        return QuantGroupedExperts(twin, recipe, "fc1", per_expert=True, weight_layout=layout, vector_form=form, input_layout="per_expert")

    src, dst = build(*src_layout), build(*dst_layout)
    calibrate(src, data.calib)
    set_quant_mode(dst, "quantize")
    save_checkpoint(src.state_dict(), tmp_path / "q.pt")
    dst.load_state_dict(load_checkpoint(tmp_path / "q.pt"), strict=True)
    assert all(bool(bits_equal(a, b).all()) for a, b in zip(src.weight_amax(), dst.weight_amax()))
    x, splits = data.routings["all_routed"]
    assert bool(bits_equal(src(x, splits), dst(x, splits)).all())
