"""The format registry: each spec's declarations match what the reference does, and the registry's
own rules (names, options, built-ins) hold."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference as R
from moe_fq_parity.reference import formats as F
from moe_fq_parity.reference.constants import NVFP4_GLOBAL_SCALE_NUM

G = torch.Generator().manual_seed(11)


def _w(*shape, dtype=torch.bfloat16):
    return torch.randn(*shape, generator=G).to(dtype)


def _a(spec, value=1.0):
    """An amax of ``value`` for a format that takes one, ``None`` for a format with scales from the data."""
    return torch.tensor(value) if spec.takes_amax else None


@pytest.fixture
def int6():
    spec = R.register_format(R.int_format("int6", 6))
    yield spec
    R.unregister_format("int6")


@pytest.mark.parametrize("fmt", list(R.FORMATS))
def test_declared_input_rules_are_what_the_reference_does(fmt):
    spec = R.format_spec(fmt)
    x = _w(4, 32)
    x[1, 3] = float("nan")
    for variant in spec.variant_names:
        if spec.rejects_nan_for(variant):
            with pytest.raises(ValueError, match="NaN"):
                R.fake_quant(x, _a(spec), fmt, variant)
        elif variant == spec.default_variant:
            assert torch.isnan(R.fake_quant(x, _a(spec), fmt, variant)[1, 3])
        else:  # takes it (its NaN element need not be NaN: MXFP4 modelopt writes -0 for a NaN block)
            assert R.fake_quant(x, _a(spec), fmt, variant).shape == x.shape
    for opt in spec.options_for():
        if opt.type is bool:
            neg = -_w(4, 32).abs()
            if opt.nonnegative_input:
                assert spec.rejects_negative({opt.name: True})
                with pytest.raises(ValueError, match="negative"):
                    R.fake_quant(neg, _a(spec), fmt, **{opt.name: True})
            else:
                R.fake_quant(neg, _a(spec), fmt, **{opt.name: True}, **({} if opt.applies_to(spec.default_variant) else
                                                                       {"variant": sorted(opt.variants)[0]}))
    assert not spec.rejects_negative({})


@pytest.mark.parametrize("fmt", list(R.FORMATS))
def test_declared_granularities_are_what_the_reference_takes(fmt):
    spec = R.format_spec(fmt)
    x = _w(3, 4, 32)
    amax = {"per_tensor": x.float().abs().amax(), "per_expert": x.float().abs().amax(dim=(1, 2)),
            "per_channel": x.float().abs().amax(dim=-1)}
    for gran, a in amax.items():
        if gran in spec.amax_granularities:
            assert R.fake_quant(x, a, fmt).shape == x.shape
        else:
            with pytest.raises(ValueError, match=gran.replace("_", "-")):
                R.fake_quant(x, a, fmt)
    if spec.takes_amax:
        with pytest.raises(TypeError, match="amax=None"):
            R.fake_quant(x, None, fmt)
    else:
        assert R.fake_quant(x, None, fmt).shape == x.shape
        with pytest.raises(ValueError, match="takes no amax"):
            R.fake_quant(x, amax["per_expert"], fmt)


@pytest.mark.parametrize("fmt", list(R.FORMATS))
def test_declared_options_and_types_are_enforced(fmt):
    spec = R.format_spec(fmt)
    x, a = _w(2, 32).abs(), _a(spec)
    with pytest.raises(TypeError, match="does not take"):
        R.fake_quant(x, a, fmt, no_such_option=True)
    for opt in spec.options:
        wrong = 1 if opt.type is bool else True if opt.type is int else 3.0
        variant = sorted(opt.variants)[0] if opt.variants else None
        with pytest.raises(TypeError, match=opt.name):
            R.fake_quant(x, a, fmt, variant, **{opt.name: wrong})
        for other in spec.variant_names:
            if not opt.applies_to(other):
                with pytest.raises(TypeError, match=f"variant {other!r} does not take"):
                    R.fake_quant(x, a, fmt, other, **{opt.name: wrong})


@pytest.mark.parametrize("fmt", list(R.FORMATS))
def test_scale_numerator_and_grid_are_the_reference_ones(fmt):
    """With ``amax = c`` the encode scale is exactly 1, so ``pre_round == x`` (single-level formats);
    the grid rounding of every variant lands on the declared grid."""
    spec = R.format_spec(fmt)
    x = _w(4, 64, dtype=torch.float32) * 3
    if not spec.takes_amax:  # the scale maps the tile's amax onto the grid's largest magnitude
        assert spec.scale_numerator() == (spec.grid.bounds()[1] if spec.is_int else spec.grid.max_value)
    elif spec.block is None:
        r = R.fake_quant_traced(x, torch.tensor(spec.scale_numerator()), fmt)
        assert torch.equal(r.pre_round, x)
    else:
        assert spec.scale_numerator() == NVFP4_GLOBAL_SCALE_NUM == spec.block.scale_grid.max_value * spec.grid.max_value
    v = torch.linspace(-1000, 1000, 20001)
    for var in spec.variant_names:
        got = R.fake_quant_traced(x, _a(spec, float(x.abs().amax())), fmt, var).grid_round(v)
        if spec.is_int:
            lo, qmax = spec.grid.bounds()
            assert torch.equal(got, torch.clamp(torch.round(v), lo, qmax))
        else:
            assert torch.equal(got, spec.grid.round(v))


def test_variants_and_default_come_from_the_registry():
    for fmt in R.FORMATS:
        spec = R.format_spec(fmt)
        assert R.variants(fmt) == spec.variant_names and R.variants(fmt)[0] == R.default_variant(fmt) == spec.default_variant
    assert R.format_spec("int8").grid.bits == 8 and R.format_spec("int4").grid.bits == 4
    with pytest.raises(ValueError, match="unknown format 'int3'"):
        R.format_spec("int3")


def test_toy_format_is_seen_everywhere_until_unregistered(int6):
    n = len(R.FORMATS)
    assert "int6" in R.FORMATS and R.FORMATS[-1] == "int6"
    x = _w(3, 4, 40)
    y = R.fake_quant(x, x.float().abs().amax(dim=(1, 2)), "int6", "step", narrow_range=True)
    q = (y.float() * (31 / x.float().abs().amax(dim=(1, 2))).reshape(3, 1, 1)).round()
    assert q.min() >= -31 and q.max() <= 31 and len(torch.unique(q)) > 20
    R.unregister_format("int6")
    assert "int6" not in R.FORMATS and len(R.FORMATS) == n - 1
    with pytest.raises(ValueError, match="unknown format 'int6'"):
        R.fake_quant(x, torch.ones(3), "int6")
    R.register_format(int6)  # for the fixture's unregister


def test_registry_rules(int6):
    with pytest.raises(ValueError, match="registered already"):
        R.register_format(R.int_format("int6", 6))
    with pytest.raises(ValueError, match="built-in"):
        R.unregister_format("int8")
    with pytest.raises(TypeError, match="FormatSpec"):
        R.register_format("int7")  # type: ignore[arg-type]
    clash = F.FormatSpec("toy", F.E4M3_GRID, {"a": R.format_spec("fp8_e4m3").variants["cuda"]}, "a",
                         options=(F.Option("unsigned", int, "clashes with INT's bool"),))
    with pytest.raises(ValueError, match="option 'unsigned'"):
        R.register_format(clash)
    code = F.FormatSpec("toy", F.E4M3_GRID, {"a": R.format_spec("fp8_e4m3").variants["cuda"]}, "a",
                        options=(F.Option("wide", bool, "reuses the narrow code", code="narrow"),))
    with pytest.raises(ValueError, match="option code 'narrow'"):
        R.register_format(code)
    assert "toy" not in R.FORMATS


@pytest.mark.parametrize("kw, needle", [
    (dict(default_variant="nope"), "default_variant"),
    (dict(amax_granularities=frozenset({"per_row"})), "amax_granularities"),
    (dict(name="Int-6"), "name"),
    (dict(options=(F.Option("x", bool, ""), F.Option("x", bool, ""))), "twice"),
    (dict(options=(F.Option("x", bool, "", variants=frozenset({"nope"})),)), "unknown variants"),
    (dict(block=F.BlockScaling(16, F.E4M3_GRID)), "global_scale_numerator"),
    (dict(amax_granularities=frozenset({"from_data"})), "needs tiles"),
    (dict(amax_granularities=frozenset({"from_data", "per_expert"}), tiles=F.TileScaling(32, 32, "e8m0")), "only granularity"),
])
def test_invalid_specs_name_the_problem(kw, needle):
    base = dict(name="toy", grid=F.IntGrid(6), variants={"cuda": R.format_spec("int8").variants["cuda"]}, default_variant="cuda")
    with pytest.raises(ValueError, match=needle):
        F.FormatSpec(**(base | kw))
    with pytest.raises(ValueError, match="num_bits"):
        F.IntGrid(17)
