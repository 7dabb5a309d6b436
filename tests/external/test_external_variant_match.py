"""The matcher on known answers: each reference variant as a backend, and planted differences."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.external.match_cases import make_case
from moe_fq_parity.harness.sections.external.section import variants_row
from moe_fq_parity.harness.sections.external.variant_match import match_variants

from .conftest import ReferenceVariant


@pytest.mark.parametrize("fmt,skip", [("fp8_e4m3", ()), ("int4", ())], ids=["fp8_e4m3", "int4"])
def test_every_variant_is_matched_by_itself_only(fmt, skip, small_cases):
    """The cases separate every pair of variants: otherwise a 'match' would say nothing.
    (INT ``cuda`` and ``eager`` differ only at tiny amax and NaN/inf input: the all-patterns case
    is what separates them.)"""
    cases = [c for c in small_cases(fmt) if c.name not in skip]
    for v in reference.variants(fmt):
        m = match_variants(ReferenceVariant(v), fmt, cases=cases, cap=2)
        assert m.matched == (v,), (v, {w: m.mismatches(w) for w in m.variant_names})
        for other in m.variant_names:
            if other != v:
                assert m.mismatches(other) > 0


class Planted(ReferenceVariant):
    """``cuda`` variant with one element of one expert changed (value or zero sign)."""

    def __init__(self, expert: int, index: int, bits: int):
        super().__init__("cuda")
        self.expert, self.index, self.bits = expert, index, bits

    def fake_quant(self, weights, amax, fmt, **options):
        out = super().fake_quant(weights, amax, fmt, **options)
        flat = out[self.expert].reshape(-1).view(torch.int16)
        flat[self.index] = self.bits
        return out


def test_a_planted_one_ulp_change_is_counted_and_listed(small_cases):
    cases = small_cases("int8")[1:2]  # near_tie/per_tensor: one [1, 6] expert per amax
    ref = reference.fake_quant(cases[0].weights[7], cases[0].amax[7], "int8")
    bits = int(ref.reshape(-1).view(torch.int16)[2]) + 1
    m = match_variants(Planted(7, 2, bits), "int8", cases=cases, cap=8)
    cuda = next(v for v in m.cases[0].variants if v.variant == "cuda")
    assert cuda.mismatches == 1 and m.matched == ()
    (o,) = cuda.offenders
    assert (o.expert, o.row, o.col) == (7, 0, 2) and o.got_bits == f"0x{bits & 0xFFFF:04X}" and o.cls == "ulp1" and o.ulp == 1
    assert o.amax == float(cases[0].amax[7]) and o.amax_bits == f"0x{int(cases[0].amax[7:8].float().view(torch.int32)) & 0xFFFFFFFF:08X}"
    assert o.input == float(cases[0].weights[7].reshape(-1)[2]) and o.expected_bits == f"0x{(bits - 1) & 0xFFFF:04X}"
    row = variants_row(m, "cuda", "repro")
    assert row.verdict == "fail" and o.input_bits in row.message


def test_a_zero_sign_difference_is_a_mismatch():
    x = torch.tensor([[0.0, -0.0, 0.001, 1.0]], dtype=torch.bfloat16)
    case = make_case("zeros", [x], torch.tensor([1.0]), x[None], torch.tensor([1.0]))
    ref = reference.fake_quant(x, torch.tensor(1.0), "int8").reshape(-1)
    assert float(ref[2]) == 0.0  # 0.001 * 127 rounds to 0
    flipped = int(ref.view(torch.int16)[2]) ^ -0x8000
    m = match_variants(Planted(0, 2, flipped), "int8", cases=[case], cap=4)
    cuda = next(v for v in m.cases[0].variants if v.variant == "cuda")
    assert cuda.mismatches == 1 and cuda.signed_zero == 1
    assert cuda.offenders[0].cls == "signed_zero" and (cuda.offenders[0].expert, cuda.offenders[0].col) == (0, 2)


class Raises(ReferenceVariant):
    def fake_quant(self, weights, amax, fmt, **options):
        raise RuntimeError("kernel exploded")


def test_a_backend_that_raises_fails_its_row_with_the_message(small_cases):
    m = match_variants(Raises("cuda"), "fp8_e4m3", cases=small_cases("fp8_e4m3")[1:2])
    assert m.errors and m.matched == () and m.mismatches("cuda") is None
    row = variants_row(m, "cuda", "repro")
    assert row.verdict == "fail" and "kernel exploded" in row.message


def test_a_missing_expected_variant_fails_the_row(small_cases):
    m = match_variants(ReferenceVariant("reciprocal"), "fp8_e4m3", cases=small_cases("fp8_e4m3")[1:2])
    row = variants_row(m, "no-such-variant", "repro")
    assert row.verdict == "fail" and "has no variant 'no-such-variant'" in row.message
    assert variants_row(m, "reciprocal", "repro").verdict == "pass"


class PerTensorOnly(ReferenceVariant):
    """Declines per-channel amax the contract's way (``NotImplementedError``), like TE's recipes."""

    def fake_quant(self, weights, amax, fmt, **options):
        if amax.dim() == 2:
            raise NotImplementedError("per tensor only")
        return super().fake_quant(weights, amax, fmt, **options)


class PerChannelRaises(ReferenceVariant):
    def fake_quant(self, weights, amax, fmt, **options):
        if amax.dim() == 2:
            raise ValueError("kernel exploded on per-channel amax")
        return super().fake_quant(weights, amax, fmt, **options)


def test_declined_cases_are_listed_not_failed_but_errors_fail(small_cases):
    cases = small_cases("fp8_e4m3")
    m = match_variants(PerTensorOnly("cuda"), "fp8_e4m3", cases=cases, cap=2)
    assert m.declined and not m.errors and "cuda" in m.matched
    row = variants_row(m, "cuda", "repro")
    assert row.verdict == "pass" and "per tensor only" in row.fields["declined"]
    bad = match_variants(PerChannelRaises("cuda"), "fp8_e4m3", cases=cases, cap=2)
    assert bad.errors and variants_row(bad, "cuda", "repro").verdict == "fail"


class UlpUpQuotient(ReferenceVariant):
    """``modelopt_static`` with ``|x| / scale`` one fp32 ulp too large: a stand-in for an
    approximate division, which turns exact E2M1 ties .25, 1.25, 2.5 and 5 upwards."""

    def __init__(self):
        super().__init__("modelopt_static", formats={"nvfp4"})

    def quotient(self, q: torch.Tensor) -> torch.Tensor:
        return torch.nextafter(q, torch.full_like(q, float("inf")))

    def fake_quant(self, weights, amax, fmt, **options):
        from moe_fq_parity.reference.nvfp4 import block_amax, static_block_scales, to_blocks
        from moe_fq_parity.reference.rounding import round_to_e2m1

        out = []
        for w, g in zip(weights, reference.split_expert_amax(weights, amax)):
            xb = to_blocks(w.float(), 16)
            sc = static_block_scales(block_amax(w), g)[..., None]
            safe = torch.where(sc == 0, torch.ones(()), sc)
            m = round_to_e2m1(self.quotient(xb.abs() / safe)) * safe
            y = torch.where(sc == 0, torch.zeros(()), torch.where(xb >= 0, m, 0.0 - m))
            out.append(y.reshape(w.shape).to(w.dtype))
        return out


def test_exact_tie_flips_are_counted_listed_and_pass_only_when_declared():
    from moe_fq_parity.harness.sections.external.match_cases import nvfp4_ties_case
    from moe_fq_parity.harness.sections.external.variant_match import summary_lines, tie_probe

    case = nvfp4_ties_case()
    m = match_variants(UlpUpQuotient(), "nvfp4", cases=[case])
    st = next(v for v in m.cases[0].variants if v.variant == "modelopt_static")
    # 7 experts x 126 blocks x 2 signs x the ties {.25, 1.25, 2.5, 5} that flip upwards, and nothing else
    assert st.mismatches == st.tie_flips == 7 * 126 * 2 * 4 and len(st.tie_offenders) == st.tie_flips
    assert {abs(o.pre_round) for o in st.tie_offenders} <= {0.25, 1.25, 2.5, 5.0}
    # te's quantize gives the same codes and zero signs on this case (its ties are exact too): it differs by the same flips
    assert m.matched == () and m.matched_up_to_ties == ("te", "modelopt_static")
    lines = summary_lines(m)
    assert "up to exact-tie flips: te (" in lines[0] and f"modelopt_static ({st.tie_flips} flips)" in lines[0]
    start = lines.index(next(line for line in lines if line.startswith("  exact-tie flips vs modelopt_static")))
    listed = [line for line in lines[start + 1:] if line.startswith("    ")]
    assert sum("|x|/scale = 5.0" in line for line in listed) == st.tie_flips // 4
    declared = variants_row(m, "modelopt_static", "repro", approximate_division=True)
    assert declared.verdict == "pass" and f"{st.tie_flips} exact E2M1 ties" in declared.message
    assert variants_row(m, "modelopt_static", "repro").verdict == "fail"
    p = tie_probe(UlpUpQuotient())
    assert p["y_backend"] == 5.625 and p["rounded"] == "away from even"
    assert tie_probe(ReferenceVariant("modelopt_static", formats={"nvfp4"}))["rounded"] == "to even (IEEE)"


def test_a_non_tie_difference_is_not_excused():
    from moe_fq_parity.harness.sections.external.match_cases import nvfp4_ties_case

    case = nvfp4_ties_case()

    class OffByOne(UlpUpQuotient):
        def fake_quant(self, weights, amax, fmt, **options):
            out = super().fake_quant(weights, amax, fmt, **options)
            out[0].view(-1)[0] = out[0].view(-1)[0] * 2  # 6*E at an exact grid point, not a tie
            return out

    m = match_variants(OffByOne(), "nvfp4", cases=[case])
    assert m.matched_up_to_ties == () and m.mismatches("modelopt_static") == m.tie_flips("modelopt_static") + 1
    assert variants_row(m, "modelopt_static", "repro", approximate_division=True).verdict == "fail"


@pytest.mark.parametrize("argv", [["--mx-random-blocks", "12"], ["--mx-random-blocks", "-8"], ["--mx-shuffles", "-1"]])
def test_bad_mx_sizes_are_a_usage_error(argv, capsys):
    from moe_fq_parity.harness.sections.external.variant_match import main

    with pytest.raises(SystemExit) as e:
        main(["--backend", "reference", "--format", "mxfp4", *argv])
    assert e.value.code == 2 and "--mx-random-blocks" in capsys.readouterr().err


def test_mx_cases_are_sized_by_the_suite():
    """smoke < ci < nightly in MX match elements; the boundary and special cases are whole in each."""
    from moe_fq_parity.harness.sections.external.match_cases import build_cases
    from moe_fq_parity.harness.sections.external.section import SUITE_SIZES

    built = {s: {c.name: c.numel for c in build_cases("mxfp4", **SUITE_SIZES[s])} for s in ("smoke", "ci", "nightly")}
    totals = [sum(built[s].values()) for s in ("smoke", "ci", "nightly")]
    assert totals[0] < totals[1] < totals[2] and totals[2] >= 10**6, totals
    for name in ("blocks/boundaries", "blocks/boundaries_fp32", "blocks/special"):
        assert built["smoke"][name] == built["nightly"][name]


def _nudge(a: torch.Tensor, ulps: torch.Tensor) -> torch.Tensor:
    """``a`` moved ``ulps`` (per element, signed) fp32 ulps."""
    for step in range(int(ulps.abs().max()) if ulps.numel() else 0):
        up = torch.nextafter(a, torch.full_like(a, float("inf")))
        down = torch.nextafter(a, torch.full_like(a, -float("inf")))
        a = torch.where(ulps > step, up, torch.where(-ulps > step, down, a))
    return a


class ApproxQuotient(UlpUpQuotient):
    """``modelopt_static`` whose ``|x| / scale`` is off by up to ``bound`` fp32 ulps, each element by a
    fixed pseudo-random amount in ``[-bound, bound]``: a stand-in for ``div.full.f32`` (bound 2), or for
    a division worse than it claims (bound > 2)."""

    def __init__(self, bound: int):
        super().__init__()
        self.bound = bound

    def quotient(self, q: torch.Tensor) -> torch.Tensor:
        ulps = torch.randint(-self.bound, self.bound + 1, q.shape, generator=torch.Generator().manual_seed(q.numel()))
        return _nudge(q, torch.where(q == 0, 0, ulps))  # a zero quotient is exact in any division


def test_near_tie_flips_within_the_division_bound_pass_only_when_declared():
    """The te_dequant case (random bf16 blocks plus exact-tie blocks) through a quotient off by up to
    2 ulps: near-tie flips beside the exact ones, every one listed; the row passes only for a
    backend that declares an approximate division, and fails when the quotient is worse than that."""
    from moe_fq_parity.harness.sections.external.match_cases import nvfp4_te_dequant_case, nvfp4_ties_case
    from moe_fq_parity.harness.sections.external.variant_match import summary_lines

    cases = [nvfp4_te_dequant_case(), nvfp4_ties_case()]
    m = match_variants(ApproxQuotient(2), "nvfp4", cases=cases)
    n_exact, n_near = m.tie_flips("modelopt_static"), m.division_flips("modelopt_static")
    assert n_exact > 0 and n_near > 0 and m.mismatches("modelopt_static") == n_exact + n_near
    assert m.matched_up_to_division == ("modelopt_static",) and m.matched_up_to_ties == ()
    listed = [o for c in m.cases for v in c.variants if v.variant == "modelopt_static" for o in v.division_offenders]
    assert len(listed) == n_near and {o.cls for o in listed} == {"division_flip"}
    assert any("approximate-division flips: modelopt_static" in line for line in summary_lines(m))
    row = variants_row(m, "modelopt_static", "repro", approximate_division=True)
    assert row.verdict == "pass" and f"{n_exact} exact and {n_near} near E2M1 ties" in row.message
    assert row.fields["matched"] == "up to approximate-division flips: modelopt_static"
    assert variants_row(m, "modelopt_static", "repro").verdict == "fail"

    worse = match_variants(ApproxQuotient(8), "nvfp4", cases=cases)
    assert worse.mismatches("modelopt_static") > worse.tie_flips("modelopt_static") + worse.division_flips("modelopt_static")
    assert "modelopt_static" not in worse.matched_up_to_division
    assert variants_row(worse, "modelopt_static", "repro", approximate_division=True).verdict == "fail"


def test_a_wrong_value_beside_division_flips_is_not_excused():
    """An element near a rounding boundary that lands two grid steps off (not on the other side's
    grid value) is an error, not a division flip."""
    from moe_fq_parity.harness.sections.external.match_cases import nvfp4_te_dequant_case

    case = nvfp4_te_dequant_case()
    clean = match_variants(ApproxQuotient(2), "nvfp4", cases=[case])
    flip = next(o for c in clean.cases for v in c.variants if v.variant == "modelopt_static" for o in v.division_offenders if o.got != 0)

    class TwoSteps(ApproxQuotient):
        def fake_quant(self, weights, amax, fmt, **options):
            out = super().fake_quant(weights, amax, fmt, **options)
            out[flip.expert][flip.row, flip.col] = out[flip.expert][flip.row, flip.col] * 3  # the flip, pushed further
            return out

    m = match_variants(TwoSteps(2), "nvfp4", cases=[case])
    assert m.mismatches("modelopt_static") == clean.mismatches("modelopt_static")
    assert m.division_flips("modelopt_static") == clean.division_flips("modelopt_static") - 1
    assert m.mismatches("modelopt_static") == m.tie_flips("modelopt_static") + m.division_flips("modelopt_static") + 1
    assert variants_row(m, "modelopt_static", "repro", approximate_division=True).verdict == "fail"
