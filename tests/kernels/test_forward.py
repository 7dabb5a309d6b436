"""Forward kernel versus the reference default variants, bit for bit (0 ULP, NaN bits included).

Every format x input dtype x layout (list of ragged experts incl. empty ones / stacked) x amax
granularity, with data holding NaN, ±inf, ±0, subnormals and outliers, and amax values that clip,
sit exactly at max|w|, are not bf16-representable, tiny (< 2**-24), exactly 2**-24 and zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity.kernels import env as kernel_env
from moe_fq_parity import reference

from .bitcheck import AMAX_MODES, amax_stack, assert_same_bits, expert_weights

LIST_SHAPES = [(5, 40), (3, 16), (0, 24), (7, 33), (1, 1), (2, 0), (9, 130)]
CHANNEL_SHAPES = [(6, 40), (6, 16), (6, 0), (6, 33), (6, 7)]
STACKED_SHAPE = (5, 6, 40)  # 40 = 2 full NVFP4 blocks + a short one of 8


@dataclass(frozen=True)
class FwdCase:
    fmt: str
    dtype: torch.dtype
    layout: str  # "list" | "stacked"
    per_channel: bool = False
    unsigned: bool = False
    narrow_range: bool = False

    @property
    def id(self) -> str:
        gran = "per_channel" if self.per_channel else "per_expert"
        opts = "".join(("-unsigned" if self.unsigned else "", "-narrow" if self.narrow_range else ""))
        return f"{self.fmt}{opts}/{gran}/{self.layout}/{str(self.dtype).replace('torch.', '')}"

    @property
    def options(self) -> dict:
        if self.fmt in ("int8", "int4"):
            return {"unsigned": self.unsigned, "narrow_range": self.narrow_range}
        return {}


CASES = [
    FwdCase(fmt, dtype, layout, per_channel)
    for fmt in ("int8", "int4", "fp8_e4m3", "nvfp4")
    for dtype in (torch.bfloat16, torch.float16, torch.float32)
    for layout in ("list", "stacked")
    for per_channel in (False, True)
    if not (per_channel and fmt == "nvfp4")
] + [
    FwdCase(fmt, torch.bfloat16, "list", per_channel, unsigned, narrow)
    for fmt in ("int8", "int4")
    for per_channel in (False, True)
    for unsigned, narrow in ((True, False), (False, True))
]


def _data(case: FwdCase, gen: torch.Generator):
    shapes = CHANNEL_SHAPES if case.per_channel else LIST_SHAPES
    if case.layout == "stacked":
        shapes = [STACKED_SHAPE[1:]] * STACKED_SHAPE[0]
    ws = expert_weights(gen, shapes, case.dtype, nonneg=case.unsigned)
    if case.fmt == "nvfp4":  # the reference rejects NaN input to NVFP4
        ws = [torch.where(torch.isnan(w), torch.zeros((), dtype=w.dtype), w) for w in ws]
    modes = [AMAX_MODES[i % len(AMAX_MODES)] for i in range(len(ws))]
    return ws, amax_stack(ws, modes, per_channel=case.per_channel)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_forward_matches_reference(case: FwdCase, gen: torch.Generator, device: str) -> None:
    ws, amax = _data(case, gen)
    ws = [w.to(device) for w in ws]
    amax = amax.to(device)
    if case.layout == "list":
        got = kernels.fake_quant_experts(ws, amax, case.fmt, **case.options)
        want = reference.fake_quant_experts(ws, amax, case.fmt, **case.options)
        assert_same_bits(got, want, ws, case=case.id)
    else:
        x = torch.stack(ws)
        got = kernels.fake_quant(x, amax, case.fmt, **case.options)
        want = reference.fake_quant(x, amax, case.fmt, **case.options)
        assert_same_bits([got], [want], [x], case=case.id)


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "nvfp4"])
def test_per_tensor_amax_on_stacked(fmt: str, gen: torch.Generator, device: str) -> None:
    x = torch.stack(expert_weights(gen, [(4, 48)] * 3, torch.bfloat16, specials=False)).to(device)
    amax = x.float().abs().amax() * 0.8
    assert_same_bits([kernels.fake_quant(x, amax, fmt)], [reference.fake_quant(x, amax, fmt)], [x], case=f"{fmt}/per_tensor")


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3", "nvfp4"])
def test_every_bf16_pattern(fmt: str, device: str) -> None:
    """All 65,536 bf16 bit patterns (NaN excluded for NVFP4) for amax values across the range."""
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)
    if fmt == "nvfp4":
        x = torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype), x)
    # 127 and 254 make the INT8 scale 1 and 0.5 (many exact .5 ties); 448 makes the FP8 scale 1
    amax = torch.tensor([1.0, 0.7, 127.0, 254.0, 448.0, 3.0e38, 2.0**-24, 1.5 * 2.0**-24, 1e-3, 65504.0, 0.0], dtype=torch.float32)
    xs = x.expand(len(amax), 256, 256).contiguous().to(device)
    got = kernels.fake_quant(xs, amax.to(device), fmt)
    want = reference.fake_quant(xs, amax.to(device), fmt)
    assert_same_bits([got], [want], [xs], case=f"{fmt}/all_bf16")


@pytest.mark.parametrize("fmt", ["int8", "int4"])
def test_int_fp64_dequant_path_on_zero_and_tiny_amax(fmt: str, device: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The INT dequantization taken where ``tl.fma`` rounds twice (Triton's interpreter before 3.7:
    an fp64 quotient that never reads ``RN(1/s2)``) gives the reference bits too, amax = 0 and
    amax < 2**-24 (output +0) included.  Forced here on any back end."""
    monkeypatch.setattr(kernel_env, "exact_fma", lambda device_type: False)
    x = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(64, 1024)
    amax = torch.tensor([0.0, 2.0**-25, 2.0**-24, 1.0, 127.0, 3.0e38], dtype=torch.float32)
    xs = x.expand(len(amax), 64, 1024).contiguous().to(device)
    got = kernels.fake_quant(xs, amax.to(device), fmt)
    want = reference.fake_quant(xs, amax.to(device), fmt)
    assert_same_bits([got], [want], [xs], case=f"{fmt}/fp64_dequant_path")


def test_nvfp4_short_blocks_and_narrow_rows(gen: torch.Generator, device: str) -> None:
    """Rows of 1..17 elements: every last-block length, blocks shorter than 16, a single element."""
    ws = [w.to(device) for w in expert_weights(gen, [(3, c) for c in range(1, 18)], torch.bfloat16, specials=False)]
    amax = torch.stack([w.float().abs().amax() for w in ws])
    assert_same_bits(kernels.fake_quant_experts(ws, amax, "nvfp4"), reference.fake_quant_experts(ws, amax, "nvfp4"), ws, case="nvfp4/short")


NAMED_EDGES = {
    # name: (fmt, amax, input bf16 bits, expected output bf16 bits) -- values from the numeric contracts
    "int8 NaN -> canonical NaN": ("int8", 1.0, 0xFFC1, 0x7FFF),
    "int8 -0 stays -0": ("int8", 1.0, 0x8000, 0x8000),
    "int8 small negative rounds to -0": ("int8", 1.0, 0xBB80, 0x8000),  # -2**-8 * 127 = -0.496 -> -0
    "int8 tiny amax gives +0 even for NaN": ("int8", 2.0**-25, 0x7FC0, 0x0000),
    "int8 tie 2.5 -> 2 (half to even)": ("int8", 127.0, 0x4020, 0x4000),  # s = 1
    "int8 tie 3.5 -> 4 (half to even)": ("int8", 127.0, 0x4060, 0x4080),
    "int8 tie -0.5 -> -0 (half to even)": ("int8", 127.0, 0xBF00, 0x8000),
    "int8 +inf saturates to qmax/s": ("int8", 1.0, 0x7F80, 0x3F80),  # 127/127 = 1.0
    "int8 -inf to lo/s (wide range)": ("int8", 1.0, 0xFF80, 0xBF81),  # -128/127 = -1.0079 -> 0xBF81
    "fp8 NaN -> canonical NaN": ("fp8_e4m3", 1.0, 0x7FC1, 0x7FFF),
    "fp8 +inf saturates to 448*inv": ("fp8_e4m3", 448.0, 0x7F80, 0x43E0),  # 448
    "fp8 -0 stays -0": ("fp8_e4m3", 1.0, 0x8000, 0x8000),
    "fp8 amax <= 2**-24 treated as 1": ("fp8_e4m3", 2.0**-24, 0x3F80, 0x3F80),
    "nvfp4 zero amax, zero input": ("nvfp4", 0.0, 0x0000, 0x0000),
}


@pytest.mark.parametrize("name", list(NAMED_EDGES))
def test_named_edges(name: str, device: str) -> None:
    fmt, amax, xin, want = NAMED_EDGES[name]
    x = torch.tensor([[xin]], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).to(device)
    a = torch.tensor([amax], dtype=torch.float32, device=device)
    got = kernels.fake_quant_experts([x], a, fmt)[0]
    ref = reference.fake_quant_experts([x], a, fmt)[0]
    got_bits = int(got.view(torch.int16).item()) & 0xFFFF
    assert got_bits == want, f"{name}: got 0x{got_bits:04X}, want 0x{want:04X}"
    assert_same_bits([got], [ref], [x], case=name)


def test_empty_expert_list_and_all_empty(device: str) -> None:
    assert kernels.fake_quant_experts([], torch.zeros(0, device=device), "int8") == []
    ws = [torch.empty(0, 5, dtype=torch.bfloat16, device=device), torch.empty(3, 0, dtype=torch.bfloat16, device=device)]
    out = kernels.fake_quant_experts(ws, torch.ones(2, device=device), "fp8_e4m3")
    assert [tuple(o.shape) for o in out] == [(0, 5), (3, 0)] and all(o.dtype == torch.bfloat16 for o in out)
    x = torch.empty(0, 4, 8, dtype=torch.bfloat16, device=device)
    assert kernels.fake_quant(x, torch.ones(0, device=device), "int8").shape == (0, 4, 8)


def test_outputs_are_aligned_views_of_one_buffer(gen: torch.Generator, device: str) -> None:
    ws = [w.to(device) for w in expert_weights(gen, [(3, 5), (2, 7), (1, 3)], torch.bfloat16, specials=False)]
    out = kernels.fake_quant_experts(ws, torch.ones(3, device=device), "int8")
    base = out[0].untyped_storage().data_ptr()
    assert all(o.untyped_storage().data_ptr() == base for o in out), "one allocation"
    assert all((o.data_ptr() - base) % 128 == 0 and o.is_contiguous() for o in out)


@pytest.mark.parametrize("fmt", ["int8", "nvfp4"])
def test_many_small_tiles(fmt: str, gen: torch.Generator, device: str) -> None:
    """A 4x16 tile forces several row and column tiles per expert, partial tiles at both edges and
    programs looping over 3 tiles (the interpreter's default tile covers a whole small expert)."""
    from moe_fq_parity.kernels import launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import parse_spec

    ws = [w.to(device) for w in expert_weights(gen, [(9, 50), (5, 16), (0, 3), (3, 33)], torch.bfloat16, specials=fmt != "nvfp4")]
    amax = amax_stack(ws, ["below", "max", "zero", "odd"], per_channel=False).to(device)
    table = tables.expert_table(ws)
    flat, outs = tables.alloc_outputs(table, torch.bfloat16, ws[0].device)
    view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=fmt == "nvfp4")
    small = launch.KernelConfig(64, 1, max_bc=16, tiles_per_program=3)  # several tiles per program, last one partial
    launch.fwd_list(table, ws, flat, view, parse_spec(fmt, None, {}), check=True, config=small)
    assert_same_bits(outs, reference.fake_quant_experts(ws, amax, fmt), ws, case=f"{fmt}/small_tiles")


@pytest.mark.parametrize("int_recip", [True, False], ids=["int_recip", "div_rn"])
def test_nvfp4_subnormal_block_scale_product(int_recip: bool, gen: torch.Generator, device: str) -> None:
    """Global amax 1e-33 and data near 1e-38: ``ds8 * gd`` is an fp32 subnormal, where a
    flush-to-zero division would give FP32_MAX instead of ``RN(1/d)``; both reciprocal paths."""
    from moe_fq_parity.kernels import launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import parse_spec

    x = (torch.randn(4, 48, generator=gen) * 1e-38).to(torch.bfloat16).to(device)
    amax = torch.tensor([1e-33], device=device)
    table = tables.expert_table([x])
    flat, outs = tables.alloc_outputs(table, torch.bfloat16, x.device)
    cfg = launch.KernelConfig(4096, 4, nvfp4_int_recip=int_recip) if device == "cuda" else launch.KernelConfig(
        65536, 4, max_waste=float("inf"), max_bc=65536, nvfp4_int_recip=int_recip)  # fmt: skip
    launch.fwd_list(table, [x], flat, amax_for_list(amax, [4], x.device, nvfp4=True), parse_spec("nvfp4", None, {}), check=True, config=cfg)
    want = reference.fake_quant(x, amax[0], "nvfp4")
    assert bool((want != 0).any()), "the case must produce non-zero outputs to mean anything"
    assert_same_bits(outs, [want], [x], case="nvfp4/subnormal_d")


@pytest.mark.parametrize("int_div", [False, True], ids=["div_rn", "integer"])
@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "nvfp4"])
def test_both_division_paths(fmt: str, gen: torch.Generator, device: str, int_div: bool) -> None:
    """Scales through ``tl.math.div_rn`` (``scalar_int_div=False``, ``nvfp4_int_recip=False``; the
    GPU default for the scales) and through the integer division (``True``, ``True``): same bits."""
    from moe_fq_parity.kernels import launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import parse_spec

    ws = [w.to(device) for w in expert_weights(gen, LIST_SHAPES, torch.bfloat16, specials=fmt != "nvfp4")]
    amax = amax_stack(ws, [AMAX_MODES[i % len(AMAX_MODES)] for i in range(len(ws))], per_channel=False).to(device)
    table = tables.expert_table(ws)
    flat, outs = tables.alloc_outputs(table, torch.bfloat16, ws[0].device)
    base = launch.INTERPRETER_CONFIG if device == "cpu" else launch.FWD_CONFIG[parse_spec(fmt, None, {}).code]
    cfg = launch.KernelConfig(base.block, base.num_warps, base.max_waste, base.max_bc, nvfp4_int_recip=int_div, scalar_int_div=int_div)
    view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=fmt == "nvfp4")
    launch.fwd_list(table, ws, flat, view, parse_spec(fmt, None, {}), check=True, config=cfg)
    assert_same_bits(outs, reference.fake_quant_experts(ws, amax, fmt), ws, case=f"{fmt}/int_div={int_div}")


def test_one_dimensional_input(gen: torch.Generator, device: str) -> None:
    """A 1-D tensor is one expert with one row (per-tensor amax), in both layouts."""
    x = expert_weights(gen, [(37,)], torch.bfloat16, specials=False)[0].to(device)
    a = x.float().abs().amax() * 0.5
    for fmt in ("int8", "nvfp4"):
        assert_same_bits([kernels.fake_quant(x, a, fmt)], [reference.fake_quant(x, a, fmt)], [x], case=f"{fmt}/1d")
        assert_same_bits(kernels.fake_quant_experts([x], a.reshape(1), fmt), [reference.fake_quant(x, a, fmt)], [x], case=f"{fmt}/1d_list")


def test_equal_shapes_with_padding(gen: torch.Generator, device: str) -> None:
    """Equal expert shapes whose size is not a multiple of the 64-element output padding must not
    take the single-allocation path (its views would not be where the kernel writes)."""
    ws = [w.to(device) for w in expert_weights(gen, [(3, 5)] * 3, torch.bfloat16, specials=False)]
    amax = torch.stack([w.float().abs().amax() for w in ws])
    assert_same_bits(kernels.fake_quant_experts(ws, amax, "int8"), reference.fake_quant_experts(ws, amax, "int8"), ws, case="equal_odd")


FLAT_SHAPES = [(64, 112), (32, 48), (0, 8), (16, 80)]
"""Narrow rows whose element counts share a large power of two (flat view 256 wide; NVFP4 blocks
stay whole: every row is a multiple of 16)."""


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "nvfp4"])
def test_flat_view_of_narrow_rows(fmt: str, gen: torch.Generator, device: str) -> None:
    """Per-expert amax: experts with narrow rows are tiled as their flat view ``[rows * cols / W,
    W]`` (``launch.tiling``), forward and clipped backward, with the reference's bits.  Per-channel
    amax, and NVFP4 rows that are not whole 16-element blocks, keep their rows."""
    from moe_fq_parity.kernels import launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import parse_spec

    spec = parse_spec(fmt, None, {})
    cases = [(FLAT_SHAPES, False, True)]
    if fmt == "nvfp4":
        cases.append(([(64, 40), (32, 24)], False, False))  # 40 and 24 are not whole blocks
    else:
        cases.append(([(64, 112), (64, 48), (64, 80)], True, False))  # per channel: one amax per row
    for shapes, per_channel, flat in cases:
        ws = [w.to(device) for w in expert_weights(gen, shapes, torch.bfloat16, specials=fmt != "nvfp4")]
        amax = amax_stack(ws, ["below", "max", "odd", "above"][: len(ws)], per_channel=per_channel).to(device)
        table = tables.expert_table(ws)
        view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=fmt == "nvfp4")
        assert view.per_channel is per_channel, (shapes, per_channel)
        assert launch._fwd_plan(table, spec, torch.bfloat16, view.per_channel, True, None)[1]["FLAT"] is flat, (shapes, per_channel)
        got = kernels.fake_quant_experts(ws, amax, fmt)
        kernels.raise_pending_errors()
        assert_same_bits(got, reference.fake_quant_experts(ws, amax, fmt), ws, case=f"{fmt}/flat={flat}/per_channel={per_channel}")
        grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16).to(device) for w in ws]
        got = kernels.ste_backward_experts(ws, amax, grads, "clipped")
        assert_same_bits(got, reference.ste_backward_experts(ws, amax, grads, "clipped"), case=f"{fmt}/flat/bwd")
        x = torch.stack(ws[:1] * 3)  # stacked layout: [3, 64, 112] or [3, 64, 40]
        a = amax[:1].repeat(3, *([1] * (amax.dim() - 1)))
        assert_same_bits([kernels.fake_quant(x, a, fmt)], [reference.fake_quant(x, a, fmt)], [x], case=f"{fmt}/flat/stacked")
