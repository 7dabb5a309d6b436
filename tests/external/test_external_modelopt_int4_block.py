"""Model-Optimizer's INT4 block weight quantizer (``modelopt-int4-block``): registration, contract,
the reference variant it matches on the ``int4_group`` match cases, and its refusals.

Model-Optimizer is an optional extra (``pip install 'moe-fq-parity[modelopt]'``): without it the
tests that run it skip with that command.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.backends import load
from moe_fq_parity.harness.checks.plan import not_applicable
from moe_fq_parity.harness.core.contract import declaration_problems
from moe_fq_parity.harness.backends.registry import BACKENDS, INSTALL_HINTS
from moe_fq_parity.harness.sections.external.int_group_cases import PARTIAL_WIDTHS, int_group_cases
from moe_fq_parity.harness.sections.external.section import EXPECTED
from moe_fq_parity.harness.sections.external.variant_match import main, match_variants

NAME = "modelopt-int4-block"


@pytest.fixture(scope="module")
def backend():
    """The backend as ``--backend`` loads it, or a skip naming what to install."""
    lb = load(NAME)
    return lb.obj if lb.available else pytest.skip(lb.why_not)


@pytest.fixture(scope="module")
def cases():
    """The ``int4_group`` match cases at CI size, by name."""
    return {c.name: c for c in int_group_cases("int4_group", shuffles=0, random_blocks=64)}


def test_registered_declared_and_expected():
    assert BACKENDS[NAME].endswith("modelopt_int4_block:modelopt_int4_block")
    assert INSTALL_HINTS[NAME] == "pip install 'moe-fq-parity[modelopt]'"
    assert EXPECTED[(NAME, "int4_group")] == "eager"
    obj = load(NAME).obj
    assert obj.formats == {"int4_group"} and obj.variants == {"int4_group": ("eager",)} and not declaration_problems(obj)
    for variant in reference.variants("int4_group"):
        why = not_applicable(obj, SimpleNamespace(fmt="int4_group", variant=variant, option_dict={}))
        assert (why is None) == (variant == "eager"), (variant, why)


def test_cases_hold_the_boundaries(cases):
    """Zero and tiny groups, the zero-amax boundary ``2**-24`` and its neighbours, exact ties, short groups;
    all finite (the format rejects NaN/Inf); over 10**6 elements at ``variant_match``'s default sizes."""
    amax = torch.cat([c.elem_amax for c in cases.values()])
    tiny = 2.0**-24
    for a in (0.0, tiny, float(torch.nextafter(torch.tensor(tiny), torch.tensor(1.0))), float(torch.nextafter(torch.tensor(tiny), torch.tensor(0.0)))):
        assert bool((amax == a).any()), a
    assert all(bool(torch.isfinite(w.float()).all()) for c in cases.values() for w in c.weights)
    widths = {w.shape[-1] for w in cases["groups/partial"].weights}
    assert widths == set(PARTIAL_WIDTHS) and all(k % 128 for k in widths)
    assert sum(c.numel for c in int_group_cases("int4_group")) >= 10**6


def test_matches_the_eager_and_modelopt_variants_only(backend, cases):
    """On the boundary, special and short-group cases Model-Optimizer's block path is ``eager`` bit for
    bit, and ``modelopt`` (the same on finite input; it models NaN and inf too); ``cuda`` differs in
    the sign of zero under the zero-amax rule (and at amax ``2**-24`` itself),
    ``reciprocal`` in fp32 ulps of the scale."""
    picked = [cases[n] for n in ("groups/boundaries_fp32", "groups/special", "groups/partial", "groups/partial_fp32")]
    m = match_variants(backend, "int4_group", cases=picked, cap=2)
    assert m.matched == ("eager", "modelopt"), {v: m.mismatches(v) for v in m.variant_names}
    by = {v.variant: v for v in m.cases[0].variants}
    assert by["cuda"].signed_zero > 0 and by["cuda"].max_ulp > 0 and by["reciprocal"].mismatches > 0


def test_short_group_gets_its_own_scale(backend):
    """In-features 129: the 129th element is a group of one (zero-padded), so it comes back exact at
    ``q = +-7``, whatever the first 128 hold."""
    w = torch.zeros(2, 129, dtype=torch.bfloat16)
    w[:, :128] = 1000.0
    w[0, 128], w[1, 128] = 0.3, -2.0**-20
    got = backend.fake_quant([w], None, "int4_group")[0]
    assert torch.equal(got.view(torch.int16), reference.fake_quant(w, None, "int4_group", "eager").view(torch.int16))
    assert got[0, 128] == w[0, 128] and got[1, 128] == w[1, 128]


@pytest.mark.parametrize("special", [float("nan"), float("inf"), -float("inf")])
def test_nonfinite_is_refused_as_upstream_refuses(backend, special):
    """Model-Optimizer's own max calibration asserts on a NaN/Inf group amax; the backend turns that
    into the ``ValueError`` the spec's rejection takes, and the reference rejects the input too."""
    from modelopt.torch.quantization.config import QuantizerAttributeConfig
    from modelopt.torch.quantization.nn import TensorQuantizer

    from moe_fq_parity.harness.backends.modelopt_int4_block import preset_weight_config

    import modelopt.torch.quantization as mtq

    w = torch.randn(2, 256).to(torch.bfloat16)
    w[1, 200] = special
    q = TensorQuantizer(QuantizerAttributeConfig(**preset_weight_config(mtq)))
    q.enable_calib()
    q.disable_quant()
    with pytest.raises(AssertionError, match="values in amax"):
        q(w)
    with pytest.raises(ValueError, match="Model-Optimizer's max calibration refuses"):
        backend.fake_quant([w], None, "int4_group")
    with pytest.raises(ValueError):
        reference.fake_quant(w, None, "int4_group", "eager")


def test_refuses_what_it_does_not_implement(backend):
    w = torch.ones(2, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="variant 'eager' only"):
        backend.fake_quant([w], None, "int4_group", variant="cuda")
    with pytest.raises(TypeError, match="tile_2d"):
        backend.fake_quant([w], None, "int4_group", tile_2d=True)
    with pytest.raises(ValueError, match="takes no amax"):
        backend.fake_quant([w], torch.tensor([1.0]), "int4_group")
    assert backend.fake_quant([torch.empty(0, 128, dtype=torch.bfloat16), w], None, "int4_group", variant="eager")[0].shape == (0, 128)


def test_variant_match_cli_reports_eager(backend, cases, capsys, monkeypatch):
    from moe_fq_parity.harness.sections.external import variant_match

    monkeypatch.setattr(variant_match, "build_cases", lambda fmt, **kw: [cases["groups/special"], cases["groups/partial"]])
    assert main(["--backend", NAME, "--show", "0"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith(f"{NAME} int4_group : matched ['eager', 'modelopt']") and "(upstream rules: modelopt = modelopt/int4_group/1x128)" in first
