"""Block-scaled formats whose scales come from the data (``int4_group``, ``fp8_block``, ``mxfp8``,
``mxfp4``): the kernel against the reference default variant, bit for bit (0 ULP, NaN bits included).

Every block's amax is chosen from the scale boundaries of its format: every exponent field of the
input dtype at a power of two, one ulp below and one above it, and the same around ``1.75 * 2**k``
(``448 / A`` a power of two for FP8 block-wise); the dtype's largest value, smallest normal and
subnormals; ``2**-24`` and its neighbours (INT4's zero-block rule).  Blocks also hold ±0, dtype
subnormals, all-zero blocks (``+0``/``-0``), and (where the format allows them) ±inf and NaN:
alone, together and beside finite values.  Rows are a full block plus a short one (in-features not
a multiple of the block), N in {1, 4, 7} experts, list (ragged, empty experts) and stacked layouts,
bf16/fp16/fp32, forward and both straight-through backwards.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels, reference
from moe_fq_parity.kernels.formats import TILE_2D_DECLINED, parse_spec

from .bitcheck import INT_VIEW, assert_same_bits

FORMATS = [("int4_group", {}), ("fp8_block", {}), ("fp8_block", {"fp32_scale": True}), ("mxfp8", {}), ("mxfp4", {})]
FORMAT_IDS = ["int4_group", "fp8_block", "fp8_block-fp32_scale", "mxfp8", "mxfp4"]
BLOCK = {"int4_group": 128, "fp8_block": 128, "mxfp8": 32, "mxfp4": 32}
DTYPES = [torch.bfloat16, torch.float16, torch.float32]
MANTISSA_BITS = {torch.bfloat16: 7, torch.float16: 10, torch.float32: 23}


def boundary_amaxes(dtype: torch.dtype) -> torch.Tensor:
    """Positive finite magnitudes of ``dtype`` at every scale boundary (see the module docstring)."""
    m = MANTISSA_BITS[dtype]
    ebits = torch.finfo(dtype).bits - 1 - m
    emax_field = (1 << ebits) - 1  # all ones: inf/NaN
    codes: list[int] = []
    for e in range(emax_field):
        base = e << m
        for mant in (0, 1, 3 << (m - 2), (3 << (m - 2)) + 1, (1 << m) - 1):
            codes += [base + mant, base + mant - 1]
    codes += [1, 2, 3, (1 << m) - 1, (emax_field << m) - 1]  # subnormals, the largest finite
    tiny = torch.tensor([2.0**-24, 2.0**-24 * (1 + 2.0**-10), 2.0**-24 * (1 - 2.0**-11), 448.0 / torch.finfo(torch.float32).max, 2.0**-126])
    bits = torch.tensor(sorted({c for c in codes if 0 < c < (emax_field << m)}), dtype=torch.int64).to(INT_VIEW[dtype])
    vals = bits.view(dtype)
    return torch.cat([vals, tiny.to(dtype)]).float().unique().to(dtype)


def block_rows(gen: torch.Generator, amaxes: torch.Tensor, cols: int, block: int, specials: bool) -> torch.Tensor:
    """One row per amax value: every block of the row holds that amax (at a random place, random
    sign) and random fractions of it, ±0 and dtype subnormals; extra rows: all-zero blocks and, with
    ``specials``, blocks holding ±inf, NaN, both, or one of them beside finite values."""
    dtype = amaxes.dtype
    n = amaxes.numel()
    a = amaxes.float()[:, None]
    u = torch.rand(n, cols, generator=gen) * 2 - 1
    u = torch.where(torch.rand(n, cols, generator=gen) < 0.2, u * 2.0 ** torch.randint(-30, 0, (n, cols), generator=gen).float(), u)
    x = (a * u).to(dtype)
    tiny = torch.finfo(dtype).tiny
    x[torch.rand(n, cols, generator=gen) < 0.05] = 0.0
    x[torch.rand(n, cols, generator=gen) < 0.05] = -0.0
    x = torch.where((torch.rand(n, cols, generator=gen) < 0.03) & (a >= tiny / 4), torch.full((), tiny / 4, dtype=dtype), x)
    for b0 in range(0, cols, block):
        width = min(block, cols - b0)
        where = b0 + torch.randint(0, width, (n,), generator=gen)
        sign = torch.where(torch.rand(n, generator=gen) < 0.5, -1.0, 1.0)
        x[torch.arange(n), where] = (amaxes.float() * sign).to(dtype)
    extra = [torch.zeros(cols), -torch.zeros(cols), torch.where(torch.arange(cols) % 2 == 0, 0.0, -0.0)]
    if specials:
        inf, nan = float("inf"), float("nan")
        for vals in ([inf], [-inf], [nan], [nan, inf], [-inf, inf], [nan, 3.0, -1e-3], [inf, 0.5, -2.0], [-nan, -inf, 7.0]):
            r = torch.randn(cols, generator=gen)
            pos = torch.randperm(cols, generator=gen)[: len(vals)]
            r[pos] = torch.tensor(vals)
            extra.append(r)
        extra.append(torch.full((cols,), float("inf")))
        extra.append(torch.full((cols,), float("nan")))
    return torch.cat([x, torch.stack(extra).to(dtype)])


def _experts(gen: torch.Generator, fmt: str, dtype: torch.dtype, n: int) -> list[torch.Tensor]:
    """``n`` experts cut from the boundary rows: ragged rows (a full block plus a short one), and an
    empty expert among them when ``n > 1``."""
    block = BLOCK[fmt]
    rows = block_rows(gen, boundary_amaxes(dtype), block + block // 2 + 3, block, fmt != "int4_group")
    rows = rows[torch.randperm(rows.shape[0], generator=gen)]
    chunks = list(rows.chunk(n)) if n > 1 else [rows]
    out = []
    for i, c in enumerate(chunks):
        cols = c.shape[1] - (i % 3) * 7  # 1.5 blocks + 3, + 3 - 7, + 3 - 14: each a short last block
        out.append(c[:, :cols].contiguous())
    if n > 1:
        out[1] = out[1][:0].contiguous()
    return out


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fmt,options", FORMATS, ids=FORMAT_IDS)
def test_list_matches_reference(fmt: str, options: dict, dtype: torch.dtype, n: int, gen: torch.Generator, device: str) -> None:
    ws = [w.to(device) for w in _experts(gen, fmt, dtype, n)]
    got = kernels.fake_quant_experts(ws, None, fmt, **options)
    assert_same_bits(got, reference.fake_quant_experts(ws, None, fmt, **options), ws, case=f"{fmt}{options}/list/{dtype}/N={n}")


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fmt,options", FORMATS, ids=FORMAT_IDS)
def test_stacked_matches_reference(fmt: str, options: dict, dtype: torch.dtype, n: int, gen: torch.Generator, device: str) -> None:
    block = BLOCK[fmt]
    rows = block_rows(gen, boundary_amaxes(dtype), 2 * block + 5, block, fmt != "int4_group")
    rows = rows[torch.randperm(rows.shape[0], generator=gen)]
    r = rows.shape[0] // n
    x = rows[: n * r].reshape(n, r, -1).contiguous().to(device)
    got = kernels.fake_quant(x, None, fmt, **options)
    assert_same_bits([got], [reference.fake_quant(x, None, fmt, **options)], [x], case=f"{fmt}{options}/stacked/{dtype}/N={n}")
    if n == 4:  # whole blocks only: the flat view of the rows (wider tiles) keeps every block whole
        x = rows[: 4 * 16, : 2 * block].reshape(4, 16, 2 * block).contiguous().to(device)
        got = kernels.fake_quant(x, None, fmt, **options)
        assert_same_bits([got], [reference.fake_quant(x, None, fmt, **options)], [x], case=f"{fmt}{options}/stacked-whole/{dtype}")


@pytest.mark.parametrize("fmt,options", FORMATS, ids=FORMAT_IDS)
def test_flat_view_keeps_whole_blocks(fmt: str, options: dict, gen: torch.Generator, device: str) -> None:
    """Narrow rows that are whole blocks are tiled as their flat view; rows with a short block keep
    their rows (a block never spans two rows)."""
    from moe_fq_parity.kernels import launch, tables

    block = BLOCK[fmt]
    spec = parse_spec(fmt, None, options)
    for cols, flat in ((block, True), (block + 16, False)):
        rows = block_rows(gen, boundary_amaxes(torch.bfloat16), cols, block, fmt != "int4_group")
        ws = [rows[:64].contiguous().to(device), rows[64:192].contiguous().to(device)]
        table = tables.expert_table(ws)
        cfg = launch.KernelConfig(2048, 1)  # rows of one block get tiles one block wide; the flat view 2048-wide ones
        assert launch._fwd_plan(table, spec, torch.bfloat16, False, True, cfg)[1]["FLAT"] is flat, (fmt, cols)
        flat_out, outs = tables.alloc_outputs(table, torch.bfloat16, ws[0].device)
        launch.fwd_list(table, ws, flat_out, kernels.api.no_amax(ws[0].device), spec, check="sync", config=cfg)
        assert_same_bits(outs, reference.fake_quant_experts(ws, None, fmt, **options), ws, case=f"{fmt}/cols={cols}/flat={flat}")


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("mode", ["pass_through", "clipped"])
@pytest.mark.parametrize("fmt", ["int4_group", "fp8_block", "mxfp8", "mxfp4"])
def test_backward_matches_reference(fmt: str, mode: str, n: int, gen: torch.Generator, device: str) -> None:
    """No amax: ``clipped`` keeps every gradient but that of NaN ``x`` (±inf included), ``pass_through``
    returns the gradients themselves; list and stacked."""
    ws = [w.to(device) for w in _experts(gen, "mxfp8", torch.bfloat16, n)]  # NaN and inf in the data
    grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16).to(device) for w in ws]
    got = kernels.ste_backward_experts(ws, None, grads, mode)
    assert_same_bits(got, reference.ste_backward_experts(ws, None, grads, mode, fmt=fmt), ws, case=f"{fmt}/{mode}/list/N={n}")
    if mode == "pass_through":
        assert all(o is g for o, g in zip(got, grads))
    x = torch.stack([ws[0]] * n)
    g = torch.randn(x.shape, generator=gen).to(torch.float32).to(device)
    got1 = kernels.ste_backward(x, None, g, mode)
    assert_same_bits([got1], [reference.ste_backward(x, None, g, mode)], [x], case=f"{fmt}/{mode}/stacked/N={n}")


@pytest.mark.parametrize("fmt", ["int4_group", "fp8_block", "mxfp8", "mxfp4"])
def test_autograd_without_amax(fmt: str, gen: torch.Generator, device: str) -> None:
    """The differentiable wrappers take ``amax=None``: forward bits and both backwards as the reference."""
    ws = [w.to(device) for w in _experts(gen, "int4_group", torch.bfloat16, 4)]  # finite data
    for mode in ("pass_through", "clipped"):
        leaves = [w.clone().requires_grad_(True) for w in ws]
        outs = kernels.fake_quant_experts_ste(leaves, None, fmt, ste_mode=mode)
        assert_same_bits([o.detach() for o in outs], reference.fake_quant_experts(ws, None, fmt), ws, case=f"{fmt}/ste/{mode}")
        grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16).to(device) for w in ws]
        torch.autograd.backward([o for o in outs if o.numel()], [g for o, g in zip(outs, grads) if o.numel()])
        want = reference.ste_backward_experts(ws, None, grads, mode, fmt=fmt)
        assert_same_bits([l.grad if l.grad is not None else torch.zeros_like(l) for l in leaves], want, case=f"{fmt}/ste/{mode}/grad")
        x = torch.stack([ws[0]] * 3).requires_grad_(True)
        y = kernels.fake_quant_stacked_ste(x, None, fmt, ste_mode=mode)
        assert_same_bits([y.detach()], [reference.fake_quant(x.detach(), None, fmt)], case=f"{fmt}/stacked-ste/{mode}")
        g = torch.randn(x.shape, generator=gen).to(torch.bfloat16).to(device)
        y.backward(g)
        assert_same_bits([x.grad], [reference.ste_backward(x.detach(), None, g, mode)], case=f"{fmt}/stacked-ste/{mode}/grad")


@pytest.mark.parametrize("check", [True, "sync"], ids=["async", "sync"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
def test_int4_group_rejects_non_finite_input_like_the_reference(bad: float, check, device: str) -> None:
    """The reference raises for NaN or ±inf input to INT4 group-wise; the kernel raises the same
    ``ValueError`` (asynchronous checks: by ``raise_pending_errors``) and writes the canonical NaN
    over the 128-element group that holds it; unchecked, the same NaN group, the other groups exact."""
    x = torch.randn(3, 300).to(torch.bfloat16).to(device)
    x[1, 140] = bad
    with pytest.raises(ValueError, match="NaN or inf input"):
        reference.fake_quant(x, None, "int4_group")
    for call in (lambda c: kernels.fake_quant_experts([x], None, "int4_group", check_values=c)[0],
                 lambda c: kernels.fake_quant(x, None, "int4_group", check_values=c)):  # fmt: skip
        with pytest.raises(ValueError, match="int4_group fake quant got NaN or inf input"):
            call(check)
            kernels.raise_pending_errors()
        out = call(False)
        nan_group = torch.zeros_like(x, dtype=torch.bool)
        nan_group[1, 128:256] = True
        assert bool((out.view(torch.int16)[nan_group] == 0x7FFF).all())
        clean = torch.where(nan_group, torch.zeros((), dtype=x.dtype, device=device), x)
        want = reference.fake_quant(clean, None, "int4_group")
        assert torch.equal(out.view(torch.int16)[~nan_group], want.view(torch.int16)[~nan_group])


@pytest.mark.parametrize("fmt", ["int4_group", "fp8_block", "mxfp8", "mxfp4"])
def test_amax_is_refused_like_the_reference(fmt: str, device: str) -> None:
    x = torch.ones(2, 4, 64, dtype=torch.bfloat16, device=device)
    for amax in (torch.ones(2, device=device), torch.ones(2, 4, device=device), torch.ones((), device=device)):
        with pytest.raises(ValueError, match="takes no amax"):
            reference.fake_quant(x, amax, fmt)
        with pytest.raises(ValueError, match="takes no amax"):
            kernels.fake_quant(x, amax, fmt)
    with pytest.raises(ValueError, match="takes no amax"):
        kernels.fake_quant_experts(list(x), torch.ones(2, device=device), fmt)
    with pytest.raises(TypeError, match="takes no amax"):
        kernels.fake_quant(x, 1.0, fmt)
    assert kernels.fake_quant_experts([], None, fmt) == []


@pytest.mark.parametrize("fmt", ["fp8_block", "mxfp8", "mxfp4"])
def test_tile_2d_is_declined_with_the_reason(fmt: str) -> None:
    with pytest.raises(ValueError, match="not tile_2d=True"):
        parse_spec(fmt, None, {"tile_2d": True})
    assert "reduce across rows" in TILE_2D_DECLINED
    parse_spec(fmt, None, {"tile_2d": False})
