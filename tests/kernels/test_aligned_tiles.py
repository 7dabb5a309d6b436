"""One-row tiles over rows that are whole multiples of the tile (``ALIGNED``: the production
launch at the model shapes): tile ``t`` starts at element ``t * BC`` and is loaded and stored
without a mask.  Every format, ragged and empty experts, one and three tiles per program (bf16;
fp32 input, whose elements are 32-bit, with three), and tiles whose threads hold several vectors
of one block (``SPLIT``), bit for bit against the reference; the plan must say ``ALIGNED`` (else
the test checks nothing new), and a row that is not a multiple of the tile must not."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.kernels import api, env, launch, tables
from moe_fq_parity.kernels.amax import amax_for_list
from moe_fq_parity.kernels.formats import FMT_NVFP4, QuantSpec, parse_spec

from .bitcheck import AMAX_MODES, amax_stack, assert_same_bits, expert_weights
from .test_block_formats import BLOCK, block_rows, boundary_amaxes, square_tiles

SHAPES = [(16, 256), (0, 256), (7, 256), (5, 512)]
"""Ragged experts (16, 7 and 5 rows), an empty one, rows of one and of two tiles; 16, 7 and 10 tiles:
each expert's last program short of tiles at 3 tiles a program."""
AMAX_FORMATS = [("int8", {}), ("int4", {}), ("fp8_e4m3", {}), ("nvfp4", {})]
DATA_FORMATS = [("int4_group", {}), ("fp8_block", {}), ("fp8_block", {"fp32_scale": True}), ("mxfp8", {}), ("mxfp4", {})]


def _experts(gen: torch.Generator, fmt: str, dtype: torch.dtype, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    """The block formats: blocks of ``block_rows`` one a row (its own scale boundary in each, zero
    blocks, inf/NaN blocks where allowed), shuffled and laid 256 to a row, so a 256-wide row holds
    256 / block boundaries (33 rows of MX: 264 of them); the experts are consecutive rows of them."""
    if fmt in BLOCK:
        blocks = block_rows(gen, boundary_amaxes(dtype), BLOCK[fmt], BLOCK[fmt], fmt != "int4_group")
        blocks = blocks[torch.randperm(blocks.shape[0], generator=gen)].reshape(-1)
        rows = blocks[: blocks.numel() // 256 * 256].view(-1, 256)
        out, i = [], 0
        for r, c in shapes:
            out.append(rows[i: i + r * c // 256].reshape(r, c).contiguous())
            i = (i + r * c // 256) % max(1, rows.shape[0] - 64)
        return out
    return expert_weights(gen, shapes, dtype, specials=fmt != "nvfp4")


WIDE = [(5, 1024), (0, 1024), (3, 2048)]
"""5 and 6 tiles: a short last program at 2 tiles a program."""
LAYOUTS = {  # (dtype, tiles per program, tile width, shapes): a one-warp tile of 256 holds 8 elements a thread, of 1024 32
    "bf16-tpp1": (torch.bfloat16, 1, 256, SHAPES),
    "bf16-tpp3": (torch.bfloat16, 3, 256, SHAPES),
    "fp32-tpp3": (torch.float32, 3, 256, SHAPES),
    "bf16-split": (torch.bfloat16, 1, 1024, WIDE),
    "fp32-split": (torch.float32, 2, 1024, WIDE),
    "bf16-split-ties": (torch.bfloat16, 1, 1024, WIDE),  # the other Triton tie rule's arrangement (tiles.tile_aligned)
    "bf16-split-int16": (torch.bfloat16, 2, 1024, WIDE),  # bf16 blocks loaded as int16, not as int32 pairs
}


def layout_config(layout: str, bc: int, tpp: int) -> launch.KernelConfig:
    """The test's configuration of ``layout``: the ``-ties`` layouts take the arrangement the
    installed Triton does not need (both must give the reference's bits)."""
    return launch.KernelConfig(bc, 1, tiles_per_program=tpp, bf16_pairs=not layout.endswith("-int16"),
                               ties_low=(not env.layout_ties_low()) if layout.endswith("-ties") else None)


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt,options", AMAX_FORMATS + DATA_FORMATS, ids=lambda v: v if isinstance(v, str) else "-".join(v) or "")
def test_aligned_tiles_match_reference(fmt: str, options: dict, layout: str, gen: torch.Generator, device: str) -> None:
    """The ``-split`` layouts give each thread several vectors of one block (``SPLIT`` 2 to 8): the
    plan must say so for the block formats."""
    dtype, tpp, bc, shapes = LAYOUTS[layout]
    spec = parse_spec(fmt, None, options)
    ws = [w.to(device) for w in _experts(gen, fmt, dtype, shapes)]
    cfg = layout_config(layout, bc, tpp)
    table = tables.expert_table(ws)
    kw = launch._fwd_plan(table, spec, dtype, False, False, cfg)[1]
    assert kw["ALIGNED"], f"{fmt}: the plan must tile aligned rows"
    assert kw["BC"] == bc, f"{fmt}: the plan's tile is {kw['BC']} wide, not {bc}"
    if spec.block and "-split" in layout:
        assert kw["SPLIT"] > 1, f"{fmt}: the plan must give a thread more than one vector of a block"
    assert kw["PAIRS"] == (bool(spec.block) and dtype == torch.bfloat16 and not layout.endswith("-int16")), (fmt, layout, kw["PAIRS"])
    assert kw["TIES_LOW"] == (cfg.ties_low if cfg.ties_low is not None else env.layout_ties_low())
    flat, outs = tables.alloc_outputs(table, dtype, ws[0].device)
    if fmt in BLOCK:
        amax, view = None, api.no_amax(ws[0].device)
    else:
        amax = amax_stack(ws, [AMAX_MODES[i % len(AMAX_MODES)] for i in range(len(ws))], per_channel=False).to(device)
        view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=spec.code == FMT_NVFP4)
    launch.fwd_list(table, ws, flat, view, spec, check=False, config=cfg)
    want = reference.fake_quant_experts(ws, amax, fmt, **options)
    assert_same_bits(outs, want, ws, case=f"{fmt}{options}/{layout}/aligned/SPLIT={kw['SPLIT']}/PAIRS={kw['PAIRS']}/TIES_LOW={kw['TIES_LOW']}")


def test_block_split() -> None:
    """``SPLIT``: the thread's 16-byte vectors per tile, at most the block's, 1 off the aligned path."""
    tile = launch.TileShape(1, 2048, 4)  # 16 elements a thread
    assert launch.block_split(tile, 16, torch.bfloat16, True) == 2  # NVFP4: the whole block in one thread
    assert launch.block_split(tile, 32, torch.bfloat16, True) == 2
    assert launch.block_split(tile, 128, torch.float32, True) == 4
    assert launch.block_split(tile, 16, torch.float32, True) == 4
    assert launch.block_split(launch.TileShape(1, 2048, 2), 128, torch.bfloat16, True) == 4
    assert launch.block_split(launch.TileShape(1, 256, 4), 32, torch.bfloat16, True) == 1  # 2 elements a thread
    assert launch.block_split(tile, 16, torch.bfloat16, False) == 1
    assert launch.block_split(tile, 0, torch.bfloat16, True) == 1


def test_unaligned_rows_are_not_aligned() -> None:
    """A row that is not a multiple of the tile, square blocks, multi-row tiles or per-channel amax
    keep the masked tiles."""
    spec = parse_spec("int8", None, {})
    one_row = launch.TileShape(1, 256, 1)
    assert launch.row_aligned([(4, 256), (0, 8), (3, 512)], one_row, spec, False)
    assert not launch.row_aligned([(4, 256), (3, 320)], one_row, spec, False)
    assert not launch.row_aligned([(4, 256)], launch.TileShape(2, 256, 1), spec, False)
    assert not launch.row_aligned([(4, 256)], one_row, spec, True)
    sq, sq_tile = parse_spec("fp8_block", None, {"tile_2d": True}), launch.TileShape(128, 128, 8)
    assert launch.row_aligned([(128, 256), (0, 8), (256, 128)], sq_tile, sq, False)  # square tiles: whole in both dims
    assert not launch.row_aligned([(128, 256), (130, 256)], sq_tile, sq, False)
    assert not launch.row_aligned([(128, 200)], sq_tile, sq, False)


def test_square_blocks_take_their_own_configuration_where_one_is_set(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    """``launch.fwd_config``: square-block launches with ``FWD_CONFIG_SQUARE`` (NVFP4 16x16: 4 tiles
    a program, loads pipelined 3 stages deep, 96 registers; MX 32x32: 32 x 128 tiles in 4 warps; FP8
    128x128: 8 warps, bf16 in two passes over 32-row chunks), 1-D ones
    with ``FWD_CONFIG``; a square-block format without an entry falls back to ``FWD_CONFIG``; the
    plan a list launch builds uses the chosen tile and register cap."""
    shapes = [(4096, 4096)] * 64  # enough tiles that no program count caps the tiles per program
    want = {"nvfp4": (16, 128, 2, 4, 96), "mxfp8": (32, 128, 4, 1, 72), "mxfp4": (32, 128, 4, 1, 64), "fp8_block": (128, 128, 8, 1, 128)}
    for fmt, (br, bc, warps, tpp, regs) in want.items():
        flat, square = parse_spec(fmt, None, {}), parse_spec(fmt, None, {"tile_2d": True})
        assert launch.fwd_config(flat) is launch.FWD_CONFIG[flat.code]
        assert launch.fwd_config(square) is launch.FWD_CONFIG_SQUARE[square.code]
        tile = launch.tile_for(shapes, launch.fwd_config(square), torch.device("cpu"), square.block, square.tile_rows)
        assert (tile.br, tile.bc, tile.num_warps, tile.tpp) == (br, bc, warps, tpp), (fmt, tile)
        table = tables.expert_table([torch.zeros(256, 256, dtype=torch.bfloat16, device=device)])  # a plan probes its device
        kw = launch._fwd_plan(table, square, torch.bfloat16, False, False, launch.fwd_config(square))[1]
        assert kw.get("maxnreg") == regs and kw["PAIRS"], (fmt, kw)
        assert kw["CHUNK_R"] == (32 if fmt == "fp8_block" else 0), (fmt, kw)
        assert kw["STAGES"] == (3 if fmt == "nvfp4" else 0), (fmt, kw)
    mx_2d = parse_spec("mxfp8", None, {"tile_2d": True})
    monkeypatch.delitem(launch.FWD_CONFIG_SQUARE, mx_2d.code)
    assert launch.fwd_config(mx_2d) is launch.FWD_CONFIG[mx_2d.code]


def _launch_square(table: tables.ExpertTable, ws: list[torch.Tensor], amax: torch.Tensor | None, spec: QuantSpec, dtype: torch.dtype,
                   cfg: launch.KernelConfig) -> list[torch.Tensor]:
    """The forward of square-block ``spec`` over ``ws`` with ``cfg`` (NVFP4 with the per-expert
    ``amax``; the other formats take their scales from the data): the outputs."""
    flat, outs = tables.alloc_outputs(table, dtype, ws[0].device)
    view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=True) if amax is not None else api.no_amax(ws[0].device)
    launch.fwd_list(table, ws, flat, view, spec, check=False, config=cfg)
    return outs


SQUARE = [("nvfp4", 16), ("mxfp8", 32), ("mxfp4", 32), ("fp8_block", 128)]
SQUARE_LAYOUTS = ["blocks", "blocks-ties", "blocks-int16", "rows", "rows-ties", "rows-int16", "two-pass", "pipelined"]


def _pipelined(cfg: launch.KernelConfig, table: tables.ExpertTable, spec: QuantSpec, dtype: torch.dtype,
               monkeypatch: pytest.MonkeyPatch) -> launch.KernelConfig:
    """``cfg`` with loads pipelined and 3, 2 or 4 tiles a program: the first whose plan loops over
    several tiles a program and leaves some expert's last program fewer (it redoes its last tile).
    The GPU's plan keeps the configured tiles a program however few the tiles (as the
    interpreter's does: no SM count), so the test's small experts take them."""
    monkeypatch.setattr(launch, "_sm_count", lambda device: None)
    for n in (3, 2, 4):
        cand = replace(cfg, pipeline_stages=3, tiles_per_program=n)
        kw = launch._fwd_plan(table, spec, dtype, False, False, cand)[1]
        if kw["TPP"] > 1 and any((-(-r // kw["BR"]) * -(-c // kw["BC"])) % kw["TPP"] for r, c in table.shapes if r and c):
            return cand
    raise AssertionError(f"{spec}: no tiles per program leaves a program fewer tiles")


@pytest.mark.parametrize("layout", SQUARE_LAYOUTS)
@pytest.mark.parametrize("fmt,block", SQUARE, ids=[f for f, _ in SQUARE])
def test_square_tiles_in_every_layout_match_reference(fmt: str, block: int, layout: str, gen: torch.Generator, device: str,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Square blocks (``tile_2d``) with rows a multiple of 8 elements (bf16 pairs: the tile and its
    masks in int32 words) but of no whole block, rows of no whole tile: a row of blocks on the
    lanes (default) or a block's rows on the lanes with its row groups in one thread (``rows``:
    ``ROWS_INNER``, ``SPLIT`` > 1), each in the arrangement the installed Triton needs and the other
    one (``-ties``), bf16 as pairs or as int16; list with an empty expert."""
    opts = {"tile_2d": True}
    spec = parse_spec(fmt, None, opts)
    # two-pass reads a block in chunks of 8 rows (a loop the interpreter pays per chunk): a spread of
    # the boundaries there; its chunked max is checked on single peaks by test_square_block_max_held_once
    rows = square_tiles(gen, torch.bfloat16, block, 2 * block + 8, 6 if block == 128 else (12 if layout == "two-pass" else 40))
    if fmt == "nvfp4":
        rows = torch.where(rows.isfinite(), rows, torch.zeros((), dtype=rows.dtype))  # NVFP4 takes its scale from the amax modes below
    cut = rows.shape[0] // 3
    ws = [rows[:cut].to(device), rows[cut: cut + 0].to(device), rows[cut:].to(device)]
    base = layout_config(layout.replace("blocks", "").replace("rows", "").replace("two-pass", ""), 2048, 2)
    cfg = replace(base, num_warps=2, square_rows_on_lanes=layout.startswith("rows"))
    if layout == "two-pass":  # one block a tile, read in chunks of 8 rows (several chunks for every block size)
        cfg = replace(cfg, block=block * block, num_warps=4, square_two_pass=8)
    table = tables.expert_table(ws)
    if layout == "pipelined":
        cfg = _pipelined(cfg, table, spec, torch.bfloat16, monkeypatch)
    kw = launch._fwd_plan(table, spec, torch.bfloat16, False, False, cfg)[1]
    assert kw["CHUNK_R"] == (8 if layout == "two-pass" and fmt != "nvfp4" else 0), kw
    assert kw["STAGES"] == (3 if layout == "pipelined" else 0), kw
    rows_inner = layout.startswith("rows") and block < 128
    assert kw["ROWS_INNER"] == rows_inner and kw["PAIRS"] == (not layout.endswith("int16")), kw
    assert (kw["SPLIT"] > 1) == rows_inner, kw
    amax = amax_stack(ws, ["max", "zero", "below"], per_channel=False).to(device) if fmt == "nvfp4" else None
    outs = _launch_square(table, ws, amax, spec, torch.bfloat16, cfg)
    want = reference.fake_quant_experts(ws, amax, fmt, **opts)
    assert_same_bits(outs, want, ws, case=f"{fmt}/2d/{layout}/ROWS_INNER={rows_inner}/SPLIT={kw['SPLIT']}/PAIRS={kw['PAIRS']}/TIES_LOW={kw['TIES_LOW']}"
                                          f"/CHUNK_R={kw['CHUNK_R']}")


@pytest.mark.parametrize("layout", ["blocks", "rows", "two-pass"])
@pytest.mark.parametrize("fmt,block", SQUARE, ids=[f for f, _ in SQUARE])
def test_square_block_max_held_once(fmt: str, block: int, layout: str, gen: torch.Generator, device: str) -> None:
    """Square blocks whose largest magnitude is held by one element (the other tests' rows give
    every row of a block its amax), the rest below half of it.  Block ``i``'s peak lies in the
    word half ``i % 2`` of a bf16 pair, of sign ``(i // 2) % 2``, in one of the ``k = block // 8``
    8-row chunks (two-pass: ``CHUNK_R = 8``), at a random row of the chunk and word of the row:
    16 blocks of 16 or 32 rows, chunk ``(i + i // 4) % k``, give each half and sign every chunk;
    6 blocks of 128 rows each half and sign, in chunks 0, 3, .. 15 (the first and the last).  A
    block max that misses one half or one sign of the words (``tl_rounding.pair_magnitude_bits``)
    or one chunk gives other bits."""
    spec = parse_spec(fmt, None, {"tile_2d": True})
    nr, nc = (2, 3) if block == 128 else (4, 4)
    x = (torch.rand(nr * block, nc * block, generator=gen) - 0.5) * 2.0 ** torch.randint(-6, 6, (nr * block, 1), generator=gen).float()
    n, k = nr * nc, block // 8
    for i in range(n):
        br, bc = divmod(i, nc)
        chunk = (i + i // 4) % k if n >= 4 * k else i * (k - 1) // (n - 1)
        r = br * block + chunk * 8 + int(torch.randint(0, 8, (), generator=gen))
        c = bc * block + 2 * int(torch.randint(0, block // 2, (), generator=gen)) + i % 2
        peak = x[br * block:(br + 1) * block, bc * block:(bc + 1) * block].abs().max() * 3
        x[r, c] = -peak if (i // 2) % 2 else peak
    ws = [x.to(torch.bfloat16).to(device)]
    cfg = replace(layout_config("", 2048, 2), num_warps=2, square_rows_on_lanes=layout == "rows")
    if layout == "two-pass":
        cfg = replace(cfg, block=block * block, num_warps=4, square_two_pass=8)
    table = tables.expert_table(ws)
    kw = launch._fwd_plan(table, spec, torch.bfloat16, False, False, cfg)[1]
    assert kw["PAIRS"], kw
    amax = torch.stack([w.float().abs().amax() for w in ws]).to(device) if fmt == "nvfp4" else None
    outs = _launch_square(table, ws, amax, spec, torch.bfloat16, cfg)
    want = reference.fake_quant_experts(ws, amax, fmt, tile_2d=True)
    assert_same_bits(outs, want, ws, case=f"{fmt}/2d/{layout}/one peak a block")


ALIGNED_SQUARE_LAYOUTS = {  # (input dtype, configuration over the layout_config of 2048 x 2)
    "pairs": (torch.bfloat16, {}),
    "int16": (torch.bfloat16, {"bf16_pairs": False}),
    "rows": (torch.bfloat16, {"square_rows_on_lanes": True}),
    "two-pass": (torch.bfloat16, {"num_warps": 4, "square_two_pass": 8}),  # one block a tile
    "fp32": (torch.float32, {}),
    "pipelined": (torch.bfloat16, {}),  # _pipelined
}


ALIGNED_SQUARE_CASES = [(f, b, lay) for f, b in SQUARE for lay in ALIGNED_SQUARE_LAYOUTS if (f, lay) != ("nvfp4", "two-pass")]  # NVFP4: one pass only


@pytest.mark.parametrize("fmt,block,layout", ALIGNED_SQUARE_CASES, ids=[f"{f}-{lay}" for f, _, lay in ALIGNED_SQUARE_CASES])
def test_aligned_square_tiles_match_reference(fmt: str, block: int, layout: str, gen: torch.Generator, device: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Square blocks where every expert holds whole tiles (rows a multiple of the tile's rows,
    columns of its columns: the model shapes): the plan says ``ALIGNED`` and the tiles are loaded
    and stored without masks; every scale boundary of the format, all-zero, inf and NaN blocks
    (NVFP4: finite, with the amax modes), an empty expert, bit for bit against the reference."""
    dtype, over = ALIGNED_SQUARE_LAYOUTS[layout]
    spec = parse_spec(fmt, None, {"tile_2d": True})
    rows = square_tiles(gen, dtype, block, 256, 3 if block == 128 else (8 if layout == "two-pass" else 24))
    rows = torch.cat([rows, rows[: -rows.shape[0] % block]])  # whole blocks of rows, the special rows included
    if fmt == "nvfp4":
        rows = torch.where(rows.isfinite(), rows, torch.zeros((), dtype=rows.dtype))
    cut = rows.shape[0] // block // 2 * block
    ws = [rows[:cut].to(device), rows[:0].to(device), rows[cut:].to(device)]
    cfg = replace(layout_config("", 2048, 2), **{"num_warps": 2, **over})
    if layout == "two-pass":
        cfg = replace(cfg, block=block * block)
    table = tables.expert_table(ws)
    if layout == "pipelined":
        cfg = _pipelined(cfg, table, spec, dtype, monkeypatch)
    kw = launch._fwd_plan(table, spec, dtype, False, False, cfg)[1]
    assert kw["ALIGNED"], f"{fmt}/{layout}: the plan must take whole square tiles without masks ({kw['BR']} x {kw['BC']})"
    assert kw["CHUNK_R"] == (8 if layout == "two-pass" else 0), kw
    assert kw["PAIRS"] == (layout not in ("int16", "fp32")), kw
    assert kw["STAGES"] == (3 if layout == "pipelined" else 0), kw
    amax = amax_stack(ws, ["max", "zero", "below"], per_channel=False).to(device) if fmt == "nvfp4" else None
    outs = _launch_square(table, ws, amax, spec, dtype, cfg)
    want = reference.fake_quant_experts(ws, amax, fmt, tile_2d=True)
    assert_same_bits(outs, want, ws, case=f"{fmt}/2d/{layout}/aligned/{kw['BR']}x{kw['BC']}/CHUNK_R={kw['CHUNK_R']}")


OFF_16 = [("mxfp8", {}), ("int4_group", {}), ("fp8_block", {"fp32_scale": True})]


@pytest.mark.parametrize("fmt,options", OFF_16, ids=["mxfp8", "int4_group", "fp8_block-fp32s"])
def test_stacked_input_off_16_bytes_is_read_as_int16(fmt: str, options: dict, gen: torch.Generator, device: str) -> None:
    """A stacked bf16 input that starts one element past a 16-byte boundary (a view into a larger
    buffer): its int32 words would straddle element pairs (and fault on a GPU), so the plan takes
    no pairs; the same data 16-byte aligned takes them; both give the reference's bits."""
    from moe_fq_parity import kernels

    x = torch.stack(_experts(gen, fmt, torch.bfloat16, [(64, 256)] * 3)).to(device)
    buf = torch.empty(x.numel() + 8, dtype=x.dtype, device=device)
    off = buf[1: 1 + x.numel()].view(x.shape)
    off.copy_(x)
    assert off.data_ptr() % 16 == 2 and off.is_contiguous()
    want = reference.fake_quant(x, None, fmt, **options)
    for inp in (x, off):
        got = kernels.fake_quant(inp, None, fmt, **options)
        assert_same_bits([got], [want], [x], case=f"{fmt}{options}/stacked/base%16={inp.data_ptr() % 16}")
    spec = parse_spec(fmt, None, options)
    cfg = launch.fwd_config(spec)  # the GPU's plan (the interpreter's tiles may be too wide to be aligned)
    for aligned in (True, False):
        kw = launch.stacked_fwd_plan([(64, 256)] * 3, torch.bfloat16, torch.device(device), spec, False, False, cfg, base_aligned=aligned)[1]
        assert kw["PAIRS"] == aligned, (fmt, aligned, kw["PAIRS"])
