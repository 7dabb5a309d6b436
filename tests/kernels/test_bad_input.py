"""Bad input: a clear error (matched by message) or a correct result, never wrong numbers."""

from __future__ import annotations

import re

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity import reference
from moe_fq_parity.kernels.geometry import MAX_EXPERTS, choose_tile, grid_for, tiles_per_program, with_tpp

from .bitcheck import assert_same_bits

BF = torch.bfloat16


def _w(*shape, dtype=BF, device="cpu"):
    return torch.randn(*shape).to(dtype).to(device)


@pytest.mark.parametrize(
    "make,exc,match",
    [
        (lambda d: ([_w(2, 4, device=d), _w(2, 4, dtype=torch.float16, device=d)], torch.ones(2, device=d)), ValueError, "dtype"),
        (lambda d: ([_w(2, 4, device=d), _w(2, 4, device="meta")], torch.ones(2, device=d)), ValueError, "is on meta"),
        (lambda d: ([_w(2, 4, device=d)], torch.ones(1, device="meta")), ValueError, "amax is on meta"),
        (lambda d: ([_w(4, 2, device=d).t()], torch.ones(1, device=d)), ValueError, "not contiguous"),
        (lambda d: ([_w(2, 4, device=d)] * 2, torch.ones(3, device=d)), ValueError, "one entry per expert"),
        (lambda d: ([_w(2, 4, device=d), _w(3, 4, device=d)], torch.ones(2, 2, device=d)), ValueError, "does not fit expert 1"),
        (lambda d: ([_w(2, 4, device=d)], torch.ones(1, 2, 2, device=d)), ValueError, r"\[N\] or \[N, out\]"),
        (lambda d: ([_w(2, 4, device=d)], torch.ones(1, dtype=torch.int32, device=d)), TypeError, "float tensor"),
        (lambda d: ([_w(2, 4, dtype=torch.int8, device=d)], torch.ones(1, device=d)), TypeError, "dtype must be one of"),
        (lambda d: (_w(2, 4, device=d), torch.ones(2, device=d)), TypeError, "sequence of tensors"),
        (lambda d: ([torch.ones((), dtype=BF, device=d)], torch.ones(1, device=d)), ValueError, "at least 1 dimension"),
    ],
    ids=["mixed_dtypes", "mixed_devices", "amax_wrong_device", "non_contiguous", "amax_count", "per_channel_rows", "amax_3d",
         "int_amax", "int_weights", "tensor_not_list", "zero_dim"],
)  # fmt: skip
def test_list_errors(make, exc, match: str, device: str) -> None:
    ws, amax = make(device)
    with pytest.raises(exc, match=match):
        kernels.fake_quant_experts(ws, amax, "int8")


CHECKS = [True, "sync"]


def _call_and_collect(fn, check):
    """Run a checked call; with the asynchronous default, also collect what it left pending (on
    CPU tensors the call raises itself; on a GPU the error comes from ``raise_pending_errors``)."""
    out = fn(check)
    kernels.raise_pending_errors()
    return out


@pytest.mark.parametrize("check", CHECKS, ids=["async", "sync"])
@pytest.mark.parametrize("value,what", [(float("nan"), "NaN"), (float("inf"), "infinite"), (-1.0, "negative")])
def test_bad_amax_values_raise_like_the_reference(value: float, what: str, check, device: str) -> None:
    ws = [_w(2, 16, device=device), _w(0, 16, device=device)]
    for amax in (torch.tensor([value, 1.0], device=device), torch.tensor([1.0, value], device=device)):
        with pytest.raises(ValueError, match=f"amax is {what}"):
            reference.fake_quant_experts(ws, amax, "fp8_e4m3")
        for fmt in ("fp8_e4m3", "int8", "nvfp4"):
            with pytest.raises(ValueError, match=f"amax is {what}"):
                _call_and_collect(lambda c: kernels.fake_quant_experts(ws, amax, fmt, check_values=c), check)
    chan = torch.ones(2, 2, device=device)
    chan[1, 1] = value  # per channel: the last row of the last expert
    with pytest.raises(ValueError, match=f"amax is {what}"):
        _call_and_collect(lambda c: kernels.fake_quant_experts([_w(2, 16, device=device)] * 2, chan, "int8", check_values=c), check)
    good = kernels.fake_quant_experts(ws, torch.ones(2, device=device), "int8")  # nothing left pending
    kernels.raise_pending_errors()
    assert good[0].isfinite().all()


F64_AMAX = [
    (-1e-50, r"amax is negative at index \({i}\) \(value -1e-50\)"),  # fp32: -0.0, which passes
    (1e300, r"amax is 1e\+300 at index \({i}\) \(torch.float64\), beyond the largest fp32"),  # fp32: inf
]


@pytest.mark.parametrize("check", CHECKS, ids=["async", "sync"])
def test_an_amax_is_checked_in_its_own_dtype_like_the_reference(check, device: str) -> None:
    """fp64 amax values are checked before they are rounded to fp32, by the kernel (list and
    stacked calls, per expert and per tensor) with the reference's own messages; a valid fp64 amax
    (``1e-50`` rounds to +0, the zero-amax rule) gives the reference's bits."""
    x = _w(2, 4, 16, device=device)
    for fmt in ("nvfp4", "int8", "fp8_e4m3"):
        for value, match in F64_AMAX:
            for amax in (torch.tensor([value, 1.0], dtype=torch.float64, device=device), torch.tensor([1.0, value], dtype=torch.float64, device=device)):
                match_i = match.format(i="0," if amax[0] == value else "1,")
                for call in (lambda m, **k: m.fake_quant_experts(list(x.unbind(0)), amax, fmt, **k), lambda m, **k: m.fake_quant(x, amax, fmt, **k)):
                    with pytest.raises(ValueError, match=match_i) as want:
                        call(reference)
                    with pytest.raises(ValueError, match=match_i) as got:
                        _call_and_collect(lambda c: call(kernels, check_values=c), check)
                    assert str(got.value) == str(want.value)
                with pytest.raises(ValueError, match=match_i):  # the autograd entry point (QuantGroupedLinear's)
                    _call_and_collect(lambda c: kernels.fake_quant_experts_ste(list(x.unbind(0)), amax, fmt, check_values=c), check)
            with pytest.raises(ValueError, match=match.format(i="")):
                _call_and_collect(lambda c: kernels.fake_quant(x, torch.tensor(value, dtype=torch.float64, device=device), fmt, check_values=c), check)
        ok = torch.tensor([1e-50, 3.0], dtype=torch.float64, device=device)
        assert_same_bits(kernels.fake_quant(x, ok, fmt, check_values=check), reference.fake_quant(x, ok, fmt))


def test_unchecked_an_fp64_amax_is_read_rounded_to_fp32(device: str) -> None:
    """``check_values=False`` checks nothing: an fp64 ``-1e-50`` is read as the fp32 ``-0.0`` it rounds
    to (amax 0), as the documented unchecked results are."""
    x = _w(2, 4, 16, device=device)
    got = kernels.fake_quant(x, torch.tensor([-1e-50, 1.0], dtype=torch.float64, device=device), "int8", check_values=False)
    assert_same_bits(got, reference.fake_quant(x, torch.tensor([0.0, 1.0], device=device), "int8"))


def _outcome(fn) -> tuple:
    """``("ok",)`` or ``(exception type, message)`` of ``fn()``."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - the outcome is what is compared
        return type(exc), str(exc)
    return ("ok",)


@pytest.mark.parametrize("fmt", reference.FORMATS)
def test_misuse_gets_one_error_type_from_the_reference_and_the_kernel(fmt: str, device: str) -> None:
    """Meta-device weights (no values to quantize) are a ``ValueError`` naming them, for every format,
    stacked and as a list, forward, autograd and both backwards; gradients on another device than
    the weights a ``ValueError``; a non-tensor amax a ``TypeError`` (a format without amax: "pass
    amax=None").  The reference and the kernel raise the same type, and here the same message."""
    takes = reference.format_spec(fmt).takes_amax
    meta = torch.empty(2, 8, 32, dtype=BF, device="meta")
    real = _w(2, 8, 32, device=device)
    amax_meta = torch.ones(2, device="meta") if takes else None
    amax_real = torch.ones(2, device=device) if takes else None
    calls = {
        "stacked meta": (lambda m: m.fake_quant(meta, amax_meta, fmt), ValueError, "input is on the meta device"),
        "list meta": (lambda m: m.fake_quant_experts(list(meta.unbind(0)), amax_meta, fmt), ValueError, r"weights\[0\] is on the meta device"),
        "clipped meta": (lambda m: m.ste_backward_experts(list(meta.unbind(0)), amax_meta, list(meta.unbind(0)), "clipped", **_fmt(m, fmt)),
                         ValueError, r"weights\[0\] is on the meta device"),
        "pass-through meta": (lambda m: m.ste_backward_experts(list(meta.unbind(0)), amax_meta, list(meta.unbind(0)), "pass_through", **_fmt(m, fmt)),
                              ValueError, r"weights\[0\] is on the meta device"),
        "stacked clipped meta": (lambda m: m.ste_backward(meta, amax_meta, meta, "clipped"), ValueError, "input is on the meta device"),
        "meta grads": (lambda m: m.ste_backward_experts(list(real.unbind(0)), amax_real, list(meta.unbind(0)), "clipped", **_fmt(m, fmt)),
                       ValueError, "on meta but weights"),
        "float amax, list": (lambda m: m.fake_quant_experts(list(real.unbind(0)), 1.0, fmt), TypeError, "pass amax=None" if not takes else "torch.Tensor"),
        "float amax, stacked": (lambda m: m.fake_quant(real, 1.0, fmt), TypeError, "pass amax=None" if not takes else "torch.Tensor"),
    }
    for what, (call, exc, match) in calls.items():
        want, got = _outcome(lambda: call(reference)), _outcome(lambda: call(kernels))
        assert want[0] is exc and got[0] is exc and re.search(match, got[1]), (what, want, got)
        if what != "meta grads":  # the reference names the expert (grads[0]), the kernel the list
            assert got == want, (what, want, got)
    with pytest.raises(ValueError, match="is on the meta device"):
        kernels.fake_quant_experts_ste(list(meta.unbind(0)), amax_meta, fmt)


def _fmt(module, fmt: str) -> dict:
    """The reference's expert-list STE needs ``fmt`` for ``amax=None``; the kernel's takes none."""
    return {"fmt": fmt} if module is reference else {}


@pytest.mark.parametrize("check", CHECKS, ids=["async", "sync"])
def test_value_errors_from_the_kernel_flags(check, device: str) -> None:
    w = torch.tensor([[0.5, -0.25, 1.0]], dtype=BF, device=device)
    a = torch.ones(1, device=device)
    with pytest.raises(ValueError, match="negative input"):
        _call_and_collect(lambda c: kernels.fake_quant_experts([w], a, "int8", unsigned=True, check_values=c), check)
    nan = torch.tensor([[0.5, float("nan")] + [0.1] * 126], dtype=BF, device=device)
    with pytest.raises(ValueError, match="NaN or inf input"):
        _call_and_collect(lambda c: kernels.fake_quant_experts([nan], None, "int4_group", check_values=c), check)
    with pytest.raises(ValueError, match="NaN or inf input"):
        _call_and_collect(lambda c: kernels.fake_quant(nan.unsqueeze(0), None, "int4_group", check_values=c), check)
    # NVFP4 te takes NaN input as Transformer Engine does: no error, the NaN's block is NaN, as the reference's
    y = kernels.fake_quant_experts([nan], a, "nvfp4", check_values=check)[0]
    kernels.raise_pending_errors()
    want = reference.fake_quant(nan.cpu(), a.cpu(), "nvfp4")
    assert torch.equal(y.cpu().isnan(), want.isnan()) and bool(y[0, :16].isnan().all()) and not bool(y[0, 16:].isnan().any())


def test_checked_outputs_are_nan_where_the_input_is_bad(device: str) -> None:
    """Never a silent wrong result: besides the error, a checked launch writes NaN wherever a bad
    value acts (whole expert for a bad amax, the element for unsigned negative input)."""
    from moe_fq_parity.kernels import launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import parse_spec

    ws = [_w(3, 32, device=device), _w(3, 32, device=device).abs()]
    ws[1][0, 5] = -0.5
    for fmt, opts, amax, bad in (("fp8_e4m3", {}, [float("nan"), 1.0], (0, None)), ("int8", {"unsigned": True}, [1.0, 1.0], (1, (0, 5))),
                                 ("int8", {}, [float("inf"), 1.0], (0, None)), ("int4", {}, [1.0, -1.0], (1, None)),
                                 ("fp8_e4m3", {}, [1.0, -3.0], (1, None)), ("int8", {}, [[1.0] * 3, [1.0, 1.0, -1.0]], (1, 2)),
                                 ("fp8_e4m3", {}, [[1.0, float("inf"), 1.0], [1.0] * 3], (0, 1)),  # per channel: one row
                                 ("nvfp4", {}, [1.0, -2.0], (1, None))):  # fmt: skip
        if fmt == "nvfp4":
            ws[1] = ws[1].abs()
        a = torch.tensor(amax, device=device)
        table = tables.expert_table(ws)
        flat, outs = tables.alloc_outputs(table, BF, ws[0].device)
        with pytest.raises(ValueError):
            launch.fwd_list(table, ws, flat, amax_for_list(a, [3, 3], ws[0].device, nvfp4=fmt == "nvfp4"), parse_spec(fmt, None, opts), check="sync")
        e, elem = bad
        got = outs[e] if elem is None else outs[e][elem]
        assert got.isnan().all(), f"{fmt}: bad input must give NaN outputs"
        assert outs[1 - e].isfinite().all() if elem is None else True


def test_unchecked_bad_values_give_the_documented_results(device: str) -> None:
    """check_values=False: no sync, no error; results as documented in kernels/fwd_kernel.py."""
    w = torch.tensor([[0.5, -0.25, 1.0]], dtype=BF, device=device)
    a = torch.ones(1, device=device)
    got = kernels.fake_quant_experts([w], a, "int8", unsigned=True, check_values=False)[0]
    assert int(got.view(torch.int16)[0, 1]) == -32768, "negative input to unsigned INT (unchecked) gives -0"
    want = reference.fake_quant_experts([w[:, ::2].contiguous()], a, "int8", unsigned=True)[0]
    assert_same_bits([got[:, ::2].contiguous()], [want], case="unsigned_unchecked_valid_part")
    nan = torch.tensor([[0.5, float("nan")] + [0.1] * 30], dtype=BF, device=device)
    nan.view(torch.int16)[0, 1] = 0x7F81  # the NaN closest to +inf
    out = kernels.fake_quant_experts([nan], a, "nvfp4", check_values=False)[0].view(torch.int16)
    assert (out[0, :16] == 0x7FFF).all(), "a block holding a NaN is the canonical NaN throughout"
    assert_same_bits([out[:, 16:].view(BF)], [reference.fake_quant(nan[:, 16:], a[0], "nvfp4")], case="nvfp4_clean_block")


@pytest.mark.parametrize(
    "fmt,variant,options,exc,match",
    [
        ("int7", None, {}, ValueError, "unknown format"),
        ("int8", "step", {}, ValueError, "default variant"),
        ("fp8_e4m3", None, {"unsigned": True}, TypeError, "does not take"),
        ("nvfp4", None, {"block_size": 32}, ValueError, "block_size=16 only"),
        ("nvfp4", None, {"block_amax": torch.ones(1)}, TypeError, "does not take"),
    ],
)
def test_format_errors(fmt, variant, options, exc, match: str, device: str) -> None:
    with pytest.raises(exc, match=match):
        kernels.fake_quant_experts([_w(2, 16, device=device)], torch.ones(1, device=device), fmt, variant, **options)


def test_nvfp4_rejects_per_channel_amax(device: str) -> None:
    with pytest.raises(ValueError, match="not a per-channel"):
        kernels.fake_quant_experts([_w(2, 16, device=device)], torch.ones(1, 2, device=device), "nvfp4")
    with pytest.raises(ValueError, match="not a per-channel"):
        kernels.fake_quant(_w(1, 2, 16, device=device), torch.ones(1, 2, device=device), "nvfp4")


def test_stacked_amax_shape_errors(device: str) -> None:
    x = _w(3, 2, 16, device=device)
    with pytest.raises(ValueError, match="does not fit input shape"):
        kernels.fake_quant(x, torch.ones(2, device=device), "int8")
    with pytest.raises(ValueError, match="not contiguous"):
        kernels.fake_quant(x.transpose(1, 2), torch.ones(3, device=device), "int8")


def test_default_variant_names_are_accepted(device: str) -> None:
    ws, a = [_w(2, 16, device=device)], torch.ones(1, device=device)
    for fmt in kernels.FORMATS:
        (variant,) = kernels.variants(fmt)
        assert variant == reference.default_variant(fmt)
        amax = a if reference.format_spec(fmt).takes_amax else None
        assert_same_bits(kernels.fake_quant_experts(ws, amax, fmt, variant), reference.fake_quant_experts(ws, amax, fmt), case=fmt)


def test_launch_limits_are_clear_errors() -> None:
    """Geometry only (no allocation): too many experts, rows too long for int32 in-tile offsets.
    More than 2**31 elements in one expert is supported (int64 offsets); test_gpu.py runs one."""
    tile = choose_tile([(4, 16)], 8192, 8, min_bc=16)
    with pytest.raises(ValueError, match="at most"):
        grid_for([(4, 16)] * (MAX_EXPERTS + 1), tile)
    with pytest.raises(ValueError, match="too long"):
        choose_tile([(2, 2**31)], 8192, 8, min_bc=16)
    big = choose_tile([(70000, 32768)], 8192, 8, min_bc=16)  # 2.29e9 elements: allowed
    assert grid_for([(70000, 32768)], big)[0] * big.br * big.bc >= 70000 * 32768


def test_tiles_per_program_keeps_small_problems_parallel() -> None:
    """Tiles per program shrink (powers of two) until 16 programs per SM remain; the grid shrinks
    accordingly and still covers every tile."""
    tile = choose_tile([(5120, 8192)], 4096, 4, min_bc=16)
    assert tiles_per_program([(5120, 8192)] * 32, tile, 4, 132) == 4
    assert tiles_per_program([(2688, 1024)] * 4, choose_tile([(2688, 1024)], 4096, 4, min_bc=16), 4, 132) == 1
    assert tiles_per_program([(2688, 1024)] * 4, tile, 4, None) == 4  # interpreter: no SM count
    t4 = with_tpp(tile, 4)
    assert grid_for([(5120, 8192)], t4)[0] * 4 >= 5120 * 8192 // (tile.br * tile.bc)
