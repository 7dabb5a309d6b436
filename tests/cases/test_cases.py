"""Cases: ids, validation, seeding, distributions that really build what they promise, suites."""

from __future__ import annotations

import math
import zlib

import pytest
import torch
from hypothesis import given
from hypothesis.errors import InvalidArgument

from moe_fq_parity import reference
from moe_fq_parity.cases import Case, case_seed, make_case, make_inputs, marks, select, suite
from moe_fq_parity.cases.shapes import NEMOTRON
from moe_fq_parity.cases.strategies import cases as case_strategy
from moe_fq_parity.harness.core.ulp import near_tie


def _case(**kw) -> Case:
    base = dict(fmt="int8", variant="cuda", granularity="per_expert", layout="stacked", n=4, shape=(8, 40), dist="normal")
    return make_case(**(base | kw))


def test_id_is_readable_and_stable():
    c = _case(fmt="fp8_e4m3", n=32, shape=(5120, 8192), dist="outliers")
    assert c.id == "fp8_e4m3.cuda/per_expert/stacked/N32/5120x8192/outliers/s0"
    c2 = _case(layout="ragged", dtype="fp16", empty=1, dist="ties", amax="design", seed=3, options=(("narrow_range", True),))
    assert c2.id == "int8.cuda+narrow/per_expert/ragged/N4/8x40.fp16+e1/ties@design/s3"


@given(c=case_strategy())
def test_id_round_trips(c):
    assert Case.from_id(c.id) == c


@pytest.mark.parametrize("kw, needle", [
    (dict(fmt="int9"), "fmt="), (dict(variant="nope"), "variant="), (dict(fmt="nvfp4", variant="te", granularity="per_channel"), "nvfp4"),
    (dict(empty=1), "stacked"), (dict(dist="ties"), "design"), (dict(dist="nan"), "nvfp4"), (dict(n=0), "n=0"),
    (dict(options=(("block_size", 32),)), "block_size"), (dict(granularity="per_channel", layout="ragged"), "per_channel"),
])
def test_invalid_cases_name_the_problem(kw, needle):
    with pytest.raises(ValueError, match=needle):
        _case(**kw)


def test_from_id_rejects_garbage():
    with pytest.raises(ValueError, match="not a case id"):
        Case.from_id("int8/whatever")


def test_seed_is_global_plus_crc32_and_data_is_deterministic():
    c = _case(dist="outliers")
    assert case_seed(c, 7) == 7 + zlib.crc32(c.id.encode())
    a, b = make_inputs(c, 7), make_inputs(c, 7)
    other = make_inputs(c, 8)
    assert all(torch.equal(x, y) for x, y in zip(a.weights, b.weights))
    assert not all(torch.equal(x, y) for x, y in zip(a.weights, other.weights))


def test_layouts_shapes_and_empty_experts():
    st = make_inputs(_case())
    assert st.stacked is not None and st.weights[1].data_ptr() == st.stacked[1].data_ptr()
    rag = make_inputs(_case(layout="ragged", n=8, shape=(33, 47), empty=2))
    shapes = [tuple(w.shape) for w in rag.weights]
    assert len(set(shapes)) > 2 and sum(s[0] == 0 for s in shapes) == 2
    assert rag.amax.shape == (8,) and all(float(rag.amax[i]) == 0 for i, s in enumerate(shapes) if s[0] == 0)
    pc = make_inputs(_case(granularity="per_channel"))
    assert pc.amax.shape == (4, 8)


@pytest.mark.parametrize("fmt", [f for f in reference.FORMATS if reference.format_spec(f).takes_amax])
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_ties_land_on_or_next_to_rounding_boundaries(fmt, dtype):
    """At least 5% of the elements sit within one fp32 ulp of a tie of the element grid."""
    c = _case(fmt=fmt, variant=reference.default_variant(fmt), dist="ties", amax="design", dtype=dtype, shape=(16, 64))
    inp = make_inputs(c)
    hits = 0
    for w, a in zip(inp.weights, inp.amax):
        r = reference.fake_quant_traced(w, a, fmt)
        hits += int(near_tie(r.pre_round, r.grid_round, window=1).sum())
    assert hits / c.numel > 0.05


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3"])
def test_outties_land_on_output_cast_ties(fmt):
    c = _case(fmt=fmt, dist="outties", amax="design", shape=(16, 64))
    inp = make_inputs(c)
    hits = sum(int(near_tie(reference.fake_quant(w.float(), a, fmt), lambda t: t.to(torch.bfloat16).float(), window=1).sum())
               for w, a in zip(inp.weights, inp.amax))
    assert hits / c.numel > 0.2


def test_neartie_separates_op_orders():
    """The INT ``step`` variant disagrees with ``cuda`` on some neartie elements (docs/measured.md §5)."""
    inp = make_inputs(_case(n=16, shape=(16, 64), dist="neartie", amax="design"))
    diffs = sum(int((reference.fake_quant(w, a, "int8") != reference.fake_quant(w, a, "int8", "step")).sum())
                for w, a in zip(inp.weights, inp.amax))
    assert diffs > 0


def test_edges_put_values_at_and_beyond_amax():
    inp = make_inputs(_case(dist="edges", amax="design"))
    for w, a in zip(inp.weights, inp.amax):
        mag = w.float().abs()
        assert bool((mag == a).any()) and bool((mag > a).any())


@pytest.mark.parametrize("fmt, variant, has_nonfinite", [("int8", "cuda", True), ("fp8_e4m3", "cuda", True), ("nvfp4", "te", True),
                                                          ("nvfp4", "modelopt_static", False)])
def test_special_values(fmt, variant, has_nonfinite):
    """NaN and inf where the case's variant takes NaN input."""
    c = _case(fmt=fmt, variant=variant, dist="special", amax="design")
    w = torch.cat([x.float().reshape(-1) for x in make_inputs(c).weights])
    assert bool(torch.isnan(w).any()) == has_nonfinite and bool(torch.isinf(w).any()) == has_nonfinite
    assert bool(((w == 0) & torch.signbit(w)).any()) and bool(((w != 0) & (w.abs() < torch.finfo(torch.bfloat16).tiny)).any())


def test_amax_policies():
    tiny = make_inputs(_case(dist="spread", amax="tiny")).amax
    assert float(tiny.min()) < 2.0**-24 < float(tiny.max())
    zero = make_inputs(_case(amax="zero")).amax
    assert float(zero[0]) == 0 and float(zero[1]) > 0
    clip = make_inputs(_case(amax="clip"))
    for w, a in zip(clip.weights, clip.amax):
        assert bool((w.float().abs() == a).any()) and bool((w.float().abs() > a).any())
    assert float(make_inputs(_case(dist="zeros")).amax.abs().max()) == 0


def test_suites_cover_the_catalogue():
    ci, nightly, ultra = suite("ci"), suite("nightly"), suite("ultra")
    assert {c.id for c in ci} <= {c.id for c in nightly} and {c.id for c in ultra} <= {c.id for c in nightly}
    ids = {c.id for c in nightly}
    gran = {f: ("per_expert", "") if reference.format_spec(f).takes_amax else ("from_data", "@none") for f in reference.FORMATS}
    assert {f"{f}.{reference.default_variant(f)}/{gran[f][0]}/stacked/N32/5120x8192/outliers{gran[f][1]}/s0" for f in reference.FORMATS} <= ids
    assert {c.n for c in nightly} >= {4, 8, 16, 32, 64, 128}
    shapes = {c.shape for c in nightly}
    assert all(s in shapes for m in NEMOTRON.values() for s in m.values())
    assert {c.dist for c in ci} >= {"ties", "neartie", "outties", "edges", "special", "nan", "zeros", "spread", "outliers"}
    # the CI element budget: 2.0M elements, grown to 2.1M with the fp32_scale rules of every FP8 block-wise variant
    assert all("slow" not in marks(c) for c in ci) and sum(c.numel for c in ci) < 2_100_000
    assert all("slow" in marks(c) and "gpu" in marks(c) for c in ultra)


def test_select_by_glob_and_format():
    got = select(suite("ci"), patterns=["*ties@design*"], formats=["nvfp4"])
    assert got and all(c.fmt == "nvfp4" and "ties@design" in c.id for c in got)


@pytest.mark.parametrize("kw, name", [(dict(formats=("int9",)), "formats"), (dict(max_n=0), "max_n"), (dict(dists="ties"), "dists"),
                                      (dict(all_variants="yes"), "all_variants"), (dict(dtypes=()), "dtypes")])
def test_strategy_arguments_are_validated(kw, name):
    with pytest.raises(InvalidArgument, match=name):
        case_strategy(**kw)


def test_strategy_is_keyword_only():
    with pytest.raises(TypeError):
        case_strategy(("int8",))  # type: ignore[misc]


def test_tiny_amax_cycle_has_both_sides_of_threshold():
    t = make_inputs(_case(granularity="per_channel", dist="normal", amax="tiny")).amax.reshape(-1)
    assert {float(x) for x in t} >= {2.0**-25, 2.0**-24, 2.0**-23} and any(2.0**-24 < float(x) < 2.0**-23 for x in t)
    assert not any(math.isnan(float(x)) for x in t)


def test_strategies_draw_formats_without_amax_as_from_data():
    from hypothesis import find

    c = find(case_strategy(formats=("mxfp8", "fp8_block", "int4_group")), lambda c: c.dist == "tile_edges" and ("tile_2d", True) in c.options)
    assert c.granularity == "from_data" and c.amax == "none" and make_inputs(c).amax is None
    d = find(case_strategy(formats=("mxfp4",)), lambda c: c.dist == "tile_specials")
    assert d.granularity == "from_data" and d.amax == "none"


@pytest.mark.parametrize("granularity", ["per_expert", "per_channel"])
def test_limits_policy_gives_every_limit_amax(granularity):
    """Every ``LIMIT_AMAX`` value, ``-0.0`` with its sign, to some expert (row) of a ``limits`` case."""
    from moe_fq_parity.cases.amax import LIMIT_AMAX

    a = make_inputs(_case(granularity=granularity, n=len(LIMIT_AMAX), dist="outliers", amax="limits")).amax.reshape(-1)
    got = {(float(v), bool(torch.signbit(v))) for v in a}
    assert got == {(v, math.copysign(1.0, v) < 0) for v in LIMIT_AMAX}


def test_suites_run_every_format_at_the_limit_amax():
    """ci (and so nightly) holds a ``limits`` case giving every value to an expert, for every
    format and amax granularity it takes."""
    from moe_fq_parity.cases.amax import LIMIT_AMAX
    from moe_fq_parity.reference.formats import format_spec

    for name in ("ci", "nightly"):
        have = {(c.fmt, c.granularity) for c in suite(name) if c.amax == "limits" and c.variant == reference.default_variant(c.fmt)
                and (c.granularity == "per_channel" or c.n >= len(LIMIT_AMAX))}  # fmt: skip
        want = {(f, g) for f in reference.FORMATS for g in ("per_expert", "per_channel") if g in format_spec(f).amax_granularities}
        assert have == want, (name, want - have)


def _kernel_tiles(shapes, fmt: str, per_channel: bool):
    """Per GPU configuration of the kernel (forward of ``fmt``, backward): ``(row tiles, column
    tiles)`` of each expert and the grid, as ``kernels/launch.py`` tiles them (flat view included)."""
    from moe_fq_parity.kernels import launch
    from moe_fq_parity.kernels.formats import FMT_NVFP4, parse_spec
    from moe_fq_parity.kernels.geometry import flat_width, grid_for, with_tpp

    code = parse_spec(fmt, None, {}).code
    out = {}
    for name, cfg in (("forward", launch.FWD_CONFIG[code]), ("backward", launch.BWD_CONFIG)):
        whole_blocks = name == "backward" or code != FMT_NVFP4 or all(c % 16 == 0 for _, c in shapes)
        flat = 0 if per_channel or not whole_blocks else flat_width(shapes, launch.FLAT_CAP)
        _, used, tile = launch.tiling(shapes, flat, cfg, torch.device("cpu"))
        tile = with_tpp(tile, cfg.tiles_per_program)
        out[name] = ([(-(-r // tile.br), -(-c // tile.bc)) for r, c in used], grid_for(used, tile), tile)
    return out


def test_ci_reaches_every_multi_tile_path():
    """For every kernel format and amax granularity, ci holds a case with several experts and one
    expert of more elements than the largest tile that spans >= 2 tiles in rows and in columns
    under every GPU configuration of the kernel (forward and backward), with >= 2 programs in both
    grid dimensions; and per format a ragged case whose experts have different tile counts (the
    programs past a small expert's tiles idle)."""
    from moe_fq_parity import kernels
    from moe_fq_parity.kernels import launch

    largest_tile = max(c.block for c in (*launch.FWD_CONFIG.values(), launch.BWD_CONFIG))
    ci = suite("ci")
    for fmt in kernels.FORMATS:
        grans = [g for g in ("per_expert", "per_channel") if g in reference.format_spec(fmt).amax_granularities]
        for gran in grans:
            def spans(c):
                if c.fmt != fmt or c.granularity != gran or c.variant != reference.default_variant(fmt) or c.n < 2:
                    return False
                shapes = [s for s in c.expert_shapes if s[0] and s[1]]
                if max(r * k for r, k in shapes) <= largest_tile:
                    return False
                geo = _kernel_tiles(shapes, fmt, gran == "per_channel").values()
                return all(max(rt for rt, _ in t) >= 2 and max(ct for _, ct in t) >= 2 and grid[0] >= 2 and grid[1] >= 2 for t, grid, _ in geo)
            assert any(spans(c) for c in ci), f"ci has no case of {fmt} {gran} past the kernel's tiles"
        ragged = [c for c in ci if c.fmt == fmt and c.layout == "ragged"
                  and any(len({rt * ct for rt, ct in t}) > 1 for t, _, _ in _kernel_tiles([s for s in c.expert_shapes if s[0]], fmt, False).values())]
        assert ragged, f"ci has no ragged {fmt} case whose experts take different numbers of tiles"


def _flip(options: dict, name: str) -> dict:
    """``options`` with ``name`` flipped: a bool negated, any other value back to the format's default."""
    value = options[name]
    rest = {k: v for k, v in options.items() if k != name}
    return rest | {name: not value} if isinstance(value, bool) else rest


def test_every_smoke_option_changes_the_bits():
    """Each smoke case that sets a format option (any option the registry lets a case carry:
    ``tile_2d``, ``fp32_scale``, ...) gives other reference bits with that option flipped, so a
    backend that ignores the option fails smoke (1D blocks for a 2D case: 128x128 tiles whose 1x128
    rows share one scale used to give identical bits)."""
    from moe_fq_parity.harness.core.bits import bits_equal

    same, checked = [], set()
    for c in suite("smoke"):
        inp = make_inputs(c)
        for name in c.option_dict:
            want = reference.fake_quant_experts(inp.weights, inp.amax, c.fmt, c.variant, **c.option_dict)
            other = reference.fake_quant_experts(inp.weights, inp.amax, c.fmt, c.variant, **_flip(c.option_dict, name))
            if all(bool(bits_equal(a, b).all()) for a, b in zip(want, other)):
                same.append(f"{c.id}: {name}")
            checked.add((c.fmt, name))
    assert not same, f"smoke cases whose bits do not depend on the option: {same}"
    two_d = {f for f in reference.FORMATS if reference.format_spec(f).option("tile_2d") is not None}
    assert {(f, "tile_2d") for f in two_d} <= checked, "a format with 2D tiles has no 2D smoke case"
