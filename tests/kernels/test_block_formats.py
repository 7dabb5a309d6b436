"""Block-scaled formats whose scales come from the data (``int4_group``, ``fp8_block``, ``mxfp8``,
``mxfp4``): the kernel against the reference default variant, bit for bit (0 ULP, NaN bits included).

Every block's amax is chosen from the scale boundaries of its format: every exponent field of the
input dtype at a power of two, one ulp below and one above it, and the same around ``1.75 * 2**k``
(``448 / A`` a power of two for FP8 block-wise); the dtype's largest value, smallest normal and
subnormals; ``2**-24`` and its neighbours (INT4's zero-block rule).  Blocks also hold ±0, dtype
subnormals, all-zero blocks (``+0``/``-0``), and (where the format allows them) ±inf and NaN:
alone, together and beside finite values.  Rows are a full block plus a short one (in-features not
a multiple of the block), N in {1, 4, 7} experts, list (ragged, empty experts) and stacked layouts,
bf16/fp16/fp32, forward and both straight-through backwards; the square tiles of ``tile_2d`` (FP8
block-wise 128x128, MX 32x32, NVFP4 16x16) with partial tiles in both dims.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import kernels, reference
from moe_fq_parity.kernels.formats import parse_spec

from .bitcheck import AMAX_MODES, INT_VIEW, amax_stack, assert_same_bits, expert_weights

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


def block_grid(gen: torch.Generator, amaxes: torch.Tensor, cols: int, block: int, specials: bool, group_rows: int = 1, keep: int = 0
               ) -> torch.Tensor:
    """``block_rows`` with one amax to each block instead of one to each row: rows in groups of
    ``group_rows``, ``cols`` wide, ``amaxes`` given to the blocks of a group in turn, the full ones
    and the short last one alike (the last group's spare blocks take the first amaxes again), every
    row of a block holding its amax; then the extra rows of ``block_rows``, ``cols`` wide.  ``keep``:
    the short block also holds its amax in its first ``short - keep`` columns, so it stays the
    block's max when up to ``keep`` columns are cut off the rows.

    A row of ``k`` blocks tests ``k`` amaxes, so every amax lands in a ``k``-th of the elements
    (and of the interpreter's programs) that ``block_rows`` needs."""
    full, short = divmod(cols, block)
    slots = full + (short > 0)
    groups = -(-amaxes.numel() // slots)
    a = amaxes[torch.arange(groups * slots) % amaxes.numel()].view(groups, slots)
    parts = []
    if full:  # one block a row, [groups * full * group_rows, block], to [groups * group_rows, full * block]
        x = block_rows(gen, a[:, :full].reshape(-1).repeat_interleave(group_rows), block, block, False)[: groups * full * group_rows]
        parts.append(x.view(groups, full, group_rows, block).transpose(1, 2).reshape(groups * group_rows, full * block))
    for width in (short - keep, keep) if keep else (short,):
        if width:
            parts.append(block_rows(gen, a[:, full].repeat_interleave(group_rows), width, block, False)[: groups * group_rows])
    return torch.cat([torch.cat(parts, dim=1), block_rows(gen, amaxes[:0], cols, block, specials)])


def _experts(gen: torch.Generator, fmt: str, dtype: torch.dtype, n: int) -> list[torch.Tensor]:
    """``n`` experts cut from the boundary rows: ragged rows (a full block plus a short one, of 7 or
    14 columns fewer for some experts), and an empty expert among them when ``n > 1``; one boundary
    amax to each block, the short ones' within the columns every expert keeps (``block_grid``)."""
    block = BLOCK[fmt]
    rows = block_grid(gen, boundary_amaxes(dtype), block + block // 2 + 3, block, fmt != "int4_group", keep=14)
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
    """Rows of two blocks and a short one of 5, one boundary amax each (``block_grid``): every
    boundary of the dtype in a third of the rows of one a row."""
    block = BLOCK[fmt]
    rows = block_grid(gen, boundary_amaxes(dtype), 2 * block + 5, block, fmt != "int4_group")
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
        assert_same_bits([leaf.grad if leaf.grad is not None else torch.zeros_like(leaf) for leaf in leaves], want, case=f"{fmt}/ste/{mode}/grad")
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


FORMATS_2D = [("fp8_block", {}), ("fp8_block", {"fp32_scale": True}), ("mxfp8", {}), ("mxfp4", {})]
FORMAT_2D_IDS = ["fp8_block", "fp8_block-fp32_scale", "mxfp8", "mxfp4"]


def square_tiles(gen: torch.Generator, dtype: torch.dtype, block: int, cols: int, tiles: int, keep: int = 0) -> torch.Tensor:
    """``tiles`` of ``boundary_amaxes`` (evenly spread, the smallest and largest included), one to
    each square block (``block_grid`` in groups of ``block`` rows: every row of a block holds its
    amax; ``keep`` as there), then the special rows of ``block_rows`` (all-zero, inf, NaN)."""
    amaxes = boundary_amaxes(dtype)
    pick = amaxes[torch.linspace(0, amaxes.numel() - 1, tiles).round().long().unique()]
    return block_grid(gen, pick, cols, block, True, block, keep)


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("fmt,options", FORMATS_2D, ids=FORMAT_2D_IDS)
def test_tile_2d_matches_reference(fmt: str, options: dict, dtype: torch.dtype, n: int, gen: torch.Generator, device: str) -> None:
    """Square tiles (``tile_2d=True``: FP8 block-wise 128x128, MX 32x32): partial tiles in both dims
    (rows and in-features not multiples of the tile), list (ragged, an empty expert) and stacked.
    At N=4 a spread of 160 (FP8 block-wise 24) scale-boundary magnitudes; at N=1 and N=7 (the same
    code, other splits) 24 (8), the smallest and largest included: the interpreter's time is the tile count.
    Rows of 4 MX blocks and a short one (FP8 block-wise: 1 and a short one), one amax a block
    (``square_tiles``): 160 magnitudes in 32 row groups, not 160, each tile 32 x 256 (FP8 128 x 256)
    under the interpreter's configuration, its last block and last row group short; the short
    block's amax within the columns every list expert keeps."""
    block = BLOCK[fmt]
    opts = dict(options, tile_2d=True)
    tiles = (24 if block == 128 else 160) if n == 4 else (8 if block == 128 else 24)
    rows = square_tiles(gen, dtype, block, (1 if block == 128 else 4) * block + block // 2 + 3, tiles, keep=14)  # list experts cut 7 or 14 columns
    cut = [0, *sorted(torch.randperm(rows.shape[0] - 1, generator=gen)[: n - 1].add(1).tolist()), rows.shape[0]]
    ws = [rows[a:b, : rows.shape[1] - (i % 3) * 7].contiguous().to(device) for i, (a, b) in enumerate(zip(cut, cut[1:]))]
    if n > 1:
        ws[1] = ws[1][:0].contiguous()
    got = kernels.fake_quant_experts(ws, None, fmt, **opts)
    assert_same_bits(got, reference.fake_quant_experts(ws, None, fmt, **opts), ws, case=f"{fmt}{opts}/list/{dtype}/N={n}")
    r = rows.shape[0] // n
    x = rows[: n * r].reshape(n, r, -1).contiguous().to(device)
    got = kernels.fake_quant(x, None, fmt, **opts)
    assert_same_bits([got], [reference.fake_quant(x, None, fmt, **opts)], [x], case=f"{fmt}{opts}/stacked/{dtype}/N={n}")


@pytest.mark.parametrize("n", [1, 4, 7])
@pytest.mark.parametrize("dtype", DTYPES, ids=["bf16", "fp16", "fp32"])
def test_nvfp4_tile_2d_matches_reference(dtype: torch.dtype, n: int, gen: torch.Generator, device: str) -> None:
    """NVFP4 16x16 tiles under a per-expert global amax (the amax modes of the 1D tests): list
    (ragged, partial tiles, an empty expert) and stacked."""
    shapes = [(37, 40), (0, 24), (16, 33), (5, 130), (64, 16), (1, 1), (20, 100)][:n]
    ws = [w.to(device) for w in expert_weights(gen, shapes, dtype, specials=False)]
    amax = amax_stack(ws, [AMAX_MODES[i % len(AMAX_MODES)] for i in range(n)], per_channel=False).to(device)
    got = kernels.fake_quant_experts(ws, amax, "nvfp4", tile_2d=True)
    assert_same_bits(got, reference.fake_quant_experts(ws, amax, "nvfp4", tile_2d=True), ws, case=f"nvfp4/2d/list/{dtype}/N={n}")
    x = torch.stack(expert_weights(gen, [(40, 72)] * n, dtype, specials=False)).to(device)
    a = amax_stack(list(x), ["max", "below", "odd", "above", "zero", "tiny", "edge"][:n], per_channel=False).to(device)
    got1 = kernels.fake_quant(x, a, "nvfp4", tile_2d=True)
    assert_same_bits([got1], [reference.fake_quant(x, a, "nvfp4", tile_2d=True)], [x], case=f"nvfp4/2d/stacked/{dtype}/N={n}")


def test_tile_2d_list_experts_of_more_dims(device: str) -> None:
    """Over a list, an expert of more than two dims takes square tiles only when its out-features are
    a multiple of the tile (its rows are then the reference's tiles); otherwise ``ValueError``."""
    x = torch.randn(2, 64, 40).to(torch.bfloat16).to(device)
    got = kernels.fake_quant_experts([x], None, "mxfp8", tile_2d=True)
    assert_same_bits(got, reference.fake_quant_experts([x], None, "mxfp8", tile_2d=True), [x], case="3-D expert")
    with pytest.raises(ValueError, match="out-features a multiple of 32"):
        kernels.fake_quant_experts([torch.ones(2, 5, 40, dtype=torch.bfloat16, device=device)], None, "mxfp8", tile_2d=True)
    y = torch.randn(2, 5, 40).to(torch.bfloat16).to(device)
    assert_same_bits([kernels.fake_quant(y, None, "mxfp8", tile_2d=True)], [reference.fake_quant(y, None, "mxfp8", tile_2d=True)], case="stacked")


@pytest.mark.parametrize("fmt,options", [("mxfp4", {}), ("fp8_block", {"tile_2d": True})], ids=["mxfp4", "fp8_block-2d"])
def test_backend_timed_entries_without_amax(fmt: str, options: dict, gen: torch.Generator, device: str) -> None:
    """The perf check's timed closures of the harness's Triton backend take ``amax=None``."""
    from moe_fq_parity.harness.backends.triton_backend import TritonBackend

    (w,) = _experts(gen, "int4_group", torch.bfloat16, 1)
    ws = [c.to(device) for c in torch.cat([w, w[: -w.shape[0] % 3]]).chunk(3)]  # the boundary rows in thirds, one shape (stacked)
    want = reference.fake_quant_experts(ws, None, fmt, **options)
    entries = TritonBackend().timed_entries(ws, None, fmt, **options)
    for name in ("default", "unchecked"):
        assert_same_bits(entries[name](), want, ws, case=f"{fmt}/{name}")
    entries["kernel"]()
    entries = TritonBackend().timed_entries(ws, None, fmt, stacked=torch.stack(ws), **options)
    assert_same_bits([entries["default"]()], [torch.stack(want)], case=f"{fmt}/stacked")
    entries["kernel"]()
