"""torchao (``prototype.mx_formats``) as external backends: availability, contract, and the verdicts
``variant_match`` gives for its NVFP4 and its four MX scale modes.

torchao is an optional extra (``pip install 'moe-fq-parity[torchao]'``): without it these tests skip
with that command.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.backends import torchao_backend
from moe_fq_parity.harness.backends.registry import BACKENDS, FAMILIES, INSTALL_HINTS
from moe_fq_parity.harness.sections.external.match_cases import build_cases
from moe_fq_parity.harness.sections.external.variant_match import main, match_variants


@pytest.fixture(scope="module")
def ao():
    ok, why = torchao_backend.torchao.available()
    if not ok:
        pytest.skip(why)
    return torchao_backend


@pytest.fixture(scope="module")
def mx_cases():
    """``build_cases(fmt)`` of the MX formats, built once per module."""
    memo: dict[str, list] = {}

    def get(fmt: str) -> list:
        if fmt not in memo:
            memo[fmt] = build_cases(fmt)
        return memo[fmt]

    return get


def test_registered_with_its_install_hint():
    assert FAMILIES["torchao"] == ("torchao", "torchao-ceil", "torchao-even", "torchao-rceil")
    for name in FAMILIES["torchao"]:
        assert BACKENDS[name].endswith(name.replace("-", "_"))
        assert INSTALL_HINTS[name] == "pip install 'moe-fq-parity[torchao]'"


def test_unavailable_says_what_to_install(monkeypatch):
    monkeypatch.setattr(torchao_backend, "_torchao", lambda: ({}, f"import torchao failed: absent ({torchao_backend.INSTALL})"))
    ok, why = torchao_backend.TorchaoBackend("ceil").available()
    assert not ok and "pip install 'moe-fq-parity[torchao]'" in why


@pytest.fixture(scope="module")
def nvfp4_cases():
    return {c.name: c for c in build_cases("nvfp4") if c.name in ("scale_pairs", "e2m1_ties", "calibrated_tiny")}


def test_nvfp4_matches_the_torchao_variant_only(ao, nvfp4_cases):
    """Block scales around E4M3 boundaries and exact E2M1 ties: torchao's NVFP4 is the ``torchao``
    variant bit for bit and no other variant.  (``variant_match --backend torchao --format nvfp4``
    runs all 821,472 NVFP4 match elements.)"""
    m = match_variants(ao.torchao, "nvfp4", cases=[nvfp4_cases["scale_pairs"], nvfp4_cases["e2m1_ties"]], cap=2)
    assert m.errors == () and m.matched == ("torchao",), {v: m.mismatches(v) for v in m.variant_names}


def test_nvfp4_matches_where_the_global_reciprocal_overflows(ao, nvfp4_cases):
    """At ``g < 2688 / FP32_MAX`` the zero elements have ``v = 0 * inf = NaN``; torchao's E2M1
    converter turns that NaN into a code from its bits (``reference.nvfp4.round_to_e2m1_torchao``) and
    the variant ``torchao`` does the same: equal on every element (NaN payloads aside)."""
    c = nvfp4_cases["calibrated_tiny"]
    limit = 2688 / torch.finfo(torch.float32).max
    exercised = 0
    for w, g in zip(c.weights, c.amax):
        got = ao.torchao.fake_quant([w], g.reshape(1), "nvfp4")[0].to(torch.float32)
        tr = reference.fake_quant_traced(w, g, "nvfp4", "torchao")
        want = tr.out.to(torch.float32)
        differ = ~((got == want) & (torch.signbit(got) == torch.signbit(want)) | (torch.isnan(got) & torch.isnan(want)))
        assert not differ.any(), (float(g), int(differ.sum()))
        if 0 < float(g) < limit:
            nan_v = torch.isnan(tr.pre_round.reshape(w.shape))
            exercised += int((nan_v & torch.isfinite(got)).sum())
    assert exercised > 0  # the case holds NaN pre-round values that torchao turns into finite outputs


def test_nvfp4_declines_what_torchao_refuses(ao):
    w = torch.ones(2, 24, dtype=torch.bfloat16)
    with pytest.raises(NotImplementedError, match="multiple of 16"):
        ao.torchao.fake_quant([w], torch.tensor([1.0]), "nvfp4")
    with pytest.raises(NotImplementedError, match="bf16 or fp32"):
        ao.torchao.fake_quant([torch.ones(2, 16, dtype=torch.float16)], torch.tensor([1.0]), "nvfp4")
    with pytest.raises(TypeError, match="does not take"):
        ao.torchao.fake_quant([torch.ones(2, 16)], torch.tensor([1.0]), "nvfp4", narrow_range=True)


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_rceil_parts_from_te_only_where_te_says(ao, fmt, mx_cases):
    """torchao RCEIL's CPU path (division, ``ceil(log2)``, Inf -> 254, NaN -> 255, reciprocal 1 at code 0) is
    not Transformer Engine's rule: on the bf16 block cases they part exactly on the blocks holding a
    NaN (TE's amax skips it; MXFP4 ``te`` is TE's pure-torch reference, whose NaN block is NaN) and on
    code-0 blocks (TE quantizes them with ``2**127``, torchao with 1)."""
    cases = [c for c in mx_cases(fmt) if c.weights[0].dtype == torch.bfloat16 and c.name != "blocks/all_bf16"]
    m = match_variants(ao.torchao_rceil, fmt, cases=cases, cap=2)
    assert "torchao_rceil" in m.matched and "te" not in m.matched, {v: m.mismatches(v) for v in m.variant_names}
    special = next(c for c in m.cases if c.case == "blocks/special")
    te = next(v for v in special.variants if v.variant == "te")
    assert te.mismatches > 0


@pytest.mark.parametrize("mode", ["floor", "ceil"])
def test_floor_and_ceil_differ_from_the_ocp_rule_only_on_inf_and_code0_blocks(ao, mode):
    """FLOOR/CEIL = the ``floor``/``ceil`` variants except (a) a block holding +-Inf: torchao takes the
    Inf's exponent field (code 247 for E4M3, not NaN), (b) a block whose code is 0: torchao divides
    by 2**-126 (its fp32 scale clamped to the smallest normal) and multiplies back by 2**-127."""
    backend = ao.TorchaoBackend(mode)
    normal = torch.tensor([[1.0, -3.5, 448.0] + [0.25] * 29], dtype=torch.bfloat16)
    inf_block = normal.clone()
    inf_block[0, 1] = float("inf")
    tiny = (normal.to(torch.float32) * 2.0**-130).to(torch.bfloat16)  # amax 448 * 2**-130: code 0 under both rules
    for w, differs in ((normal, False), (inf_block, True), (tiny, True)):
        got = backend.fake_quant([w], None, "mxfp8")[0]
        want = reference.fake_quant(w, None, "mxfp8", mode)
        same = torch.equal(got.view(torch.int16), want.view(torch.int16))
        assert same != differs, (mode, w, got, want)
    got = backend.fake_quant([inf_block], None, "mxfp8")[0]
    assert got[0, 1] == float("inf") and not torch.isnan(got).any()  # the variant: a NaN block
    for w in (normal, inf_block, tiny):  # ... and the torchao_<mode> variant is torchao on all three
        got = backend.fake_quant([w], None, "mxfp8")[0]
        assert torch.equal(got.view(torch.int16), reference.fake_quant(w, None, "mxfp8", f"torchao_{mode}").view(torch.int16))


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
@pytest.mark.parametrize("mode", ["floor", "ceil", "even", "rceil"])
def test_each_mode_matches_its_torchao_variant(ao, mode, fmt, mx_cases):
    """Every torchao mode is ``torchao_<mode>`` bit for bit on the boundary and special-block cases
    (bf16 and fp32: E8M0 boundaries and one ulp around, Inf/NaN/zero/denormal blocks, the fp32
    subnormal edge); the section and ``variant_match`` run the full 10**6-element set."""
    cases = [c for c in mx_cases(fmt) if c.name in ("blocks/boundaries", "blocks/boundaries_fp32", "blocks/special")]
    m = match_variants(ao.TorchaoBackend(mode), fmt, cases=cases, cap=2)
    assert f"torchao_{mode}" in m.matched, {v: m.mismatches(v) for v in m.variant_names}


@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4"])
def test_modelopt_mx_is_the_modelopt_rule(fmt, mx_cases):
    """Model-Optimizer's ``MXFP8QTensor`` and ``MXFP4QTensor`` are the ``modelopt`` variant bit for bit
    (MXFP4: E2M1 ties toward zero, ``+0`` written as ``-0``, an Inf/NaN block all ``-0``); for MXFP4
    the round-to-even variants with the same scale code differ on exact ties and zeros."""
    from moe_fq_parity.harness.backends.modelopt_mx_backend import modelopt_mx

    ok, why = modelopt_mx.available()
    if not ok:
        pytest.skip(why)
    case = next(c for c in mx_cases(fmt) if c.name == "blocks/boundaries")
    special = next(c for c in mx_cases(fmt) if c.name == "blocks/special")
    m = match_variants(modelopt_mx, fmt, cases=[case, special], cap=2)
    assert "modelopt" in m.matched, {v: m.mismatches(v) for v in m.variant_names}
    if fmt == "mxfp4":  # torchao_rceil: the same ceil(log2(A / 6)) code, RNE elements, +0 kept
        r = next(v for v in m.cases[0].variants if v.variant == "torchao_rceil")
        assert r.signed_zero > 0 and r.tie_flips > 0


def test_mx_declines_what_torchao_refuses(ao):
    with pytest.raises(NotImplementedError, match="multiple of 32"):
        ao.torchao.fake_quant([torch.ones(2, 48, dtype=torch.bfloat16)], None, "mxfp8")
    with pytest.raises(NotImplementedError, match="32x32"):
        ao.torchao.fake_quant([torch.ones(32, 32, dtype=torch.bfloat16)], None, "mxfp8", tile_2d=True)
    with pytest.raises(ValueError, match="takes no amax"):
        ao.torchao.fake_quant([torch.ones(2, 32, dtype=torch.bfloat16)], torch.tensor([1.0]), "mxfp8")


def test_variant_match_cli_runs_the_family(ao, capsys, monkeypatch, nvfp4_cases):
    """``--backend torchao --format nvfp4`` runs every member on one set of cases (here the exact-tie
    case alone); the MX-only members say they have no NVFP4."""
    from moe_fq_parity.harness.sections.external import variant_match

    built = []
    monkeypatch.setattr(variant_match, "build_cases", lambda fmt, **kw: built.append(fmt) or [nvfp4_cases["e2m1_ties"]])
    assert main(["--backend", "torchao", "--format", "nvfp4", "--show", "0"]) == 0
    out = capsys.readouterr().out
    assert "torchao nvfp4 : matched ['torchao']" in out and built == ["nvfp4"]
    for name in ("torchao-ceil", "torchao-even", "torchao-rceil"):
        assert f"{name} nvfp4: not run: {name} has no nvfp4 path" in out
