"""One-row tiles over rows that are whole multiples of the tile (``ALIGNED``: the production
launch at the model shapes): tile ``t`` starts at element ``t * BC`` and is loaded and stored
without a mask.  Every format, ragged and empty experts, one and three tiles per program (bf16;
fp32 input, whose elements are 32-bit, with three), and tiles whose threads hold several vectors
of one block (``SPLIT``), bit for bit against the reference; the plan must say ``ALIGNED`` (else
the test checks nothing new), and a row that is not a multiple of the tile must not."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.kernels import api, launch, tables
from moe_fq_parity.kernels.amax import amax_for_list
from moe_fq_parity.kernels.formats import FMT_NVFP4, parse_spec

from .bitcheck import AMAX_MODES, amax_stack, assert_same_bits, expert_weights
from .test_block_formats import BLOCK, block_rows, boundary_amaxes

SHAPES = [(48, 256), (0, 256), (17, 256), (5, 512)]
AMAX_FORMATS = [("int8", {}), ("int4", {}), ("fp8_e4m3", {}), ("nvfp4", {})]
DATA_FORMATS = [("int4_group", {}), ("fp8_block", {}), ("fp8_block", {"fp32_scale": True}), ("mxfp8", {}), ("mxfp4", {})]


def _experts(gen: torch.Generator, fmt: str, dtype: torch.dtype, shapes: list[tuple[int, int]]) -> list[torch.Tensor]:
    if fmt in BLOCK:  # every scale boundary of the format, zero blocks, inf/NaN blocks where allowed
        rows = block_rows(gen, boundary_amaxes(dtype), 256, BLOCK[fmt], fmt != "int4_group")
        rows = rows[torch.randperm(rows.shape[0], generator=gen)]
        out, i = [], 0
        for r, c in shapes:
            out.append(rows[i: i + r * c // 256].reshape(r, c).contiguous())
            i = (i + r * c // 256) % max(1, rows.shape[0] - 64)
        return out
    return expert_weights(gen, shapes, dtype, specials=fmt != "nvfp4")


WIDE = [(12, 1024), (0, 1024), (5, 2048)]
LAYOUTS = {  # (dtype, tiles per program, tile width, shapes): a one-warp tile of 256 holds 8 elements a thread, of 1024 32
    "bf16-tpp1": (torch.bfloat16, 1, 256, SHAPES),
    "bf16-tpp3": (torch.bfloat16, 3, 256, SHAPES),
    "fp32-tpp3": (torch.float32, 3, 256, SHAPES),
    "bf16-split": (torch.bfloat16, 1, 1024, WIDE),
    "fp32-split": (torch.float32, 2, 1024, WIDE),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("fmt,options", AMAX_FORMATS + DATA_FORMATS, ids=lambda v: v if isinstance(v, str) else "-".join(v) or "")
def test_aligned_tiles_match_reference(fmt: str, options: dict, layout: str, gen: torch.Generator, device: str) -> None:
    """The ``-split`` layouts give each thread several vectors of one block (``SPLIT`` 2 to 8): the
    plan must say so for the block formats."""
    dtype, tpp, bc, shapes = LAYOUTS[layout]
    spec = parse_spec(fmt, None, options)
    ws = [w.to(device) for w in _experts(gen, fmt, dtype, shapes)]
    cfg = launch.KernelConfig(bc, 1, tiles_per_program=tpp)
    table = tables.expert_table(ws)
    kw = launch._fwd_plan(table, spec, dtype, False, False, cfg)[1]
    assert kw["ALIGNED"], f"{fmt}: the plan must tile aligned rows"
    assert kw["BC"] == bc, f"{fmt}: the plan's tile is {kw['BC']} wide, not {bc}"
    if spec.block and layout.endswith("-split"):
        assert kw["SPLIT"] > 1, f"{fmt}: the plan must give a thread more than one vector of a block"
    flat, outs = tables.alloc_outputs(table, dtype, ws[0].device)
    if fmt in BLOCK:
        amax, view = None, api.no_amax(ws[0].device)
    else:
        amax = amax_stack(ws, [AMAX_MODES[i % len(AMAX_MODES)] for i in range(len(ws))], per_channel=False).to(device)
        view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=spec.code == FMT_NVFP4)
    launch.fwd_list(table, ws, flat, view, spec, check=False, config=cfg)
    want = reference.fake_quant_experts(ws, amax, fmt, **options)
    assert_same_bits(outs, want, ws, case=f"{fmt}{options}/{layout}/aligned/SPLIT={kw['SPLIT']}")


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
    assert not launch.row_aligned([(128, 256)], one_row, parse_spec("fp8_block", None, {"tile_2d": True}), False)


def test_square_blocks_take_their_own_configuration_where_one_is_set() -> None:
    """``launch.fwd_config``: NVFP4 16x16 launches with ``FWD_CONFIG_SQUARE`` (2 tiles a program),
    1-D NVFP4 with ``FWD_CONFIG`` (8); a square-block format without an entry falls back to
    ``FWD_CONFIG``; the plan a list launch builds uses the chosen one."""
    nvfp4, nvfp4_2d = parse_spec("nvfp4", None, {}), parse_spec("nvfp4", None, {"tile_2d": True})
    assert launch.fwd_config(nvfp4) is launch.FWD_CONFIG[nvfp4.code]
    assert launch.fwd_config(nvfp4_2d) is launch.FWD_CONFIG_SQUARE[nvfp4.code]
    assert launch.fwd_config(nvfp4_2d).tiles_per_program != launch.fwd_config(nvfp4).tiles_per_program
    mx_2d = parse_spec("mxfp8", None, {"tile_2d": True})
    assert launch.fwd_config(mx_2d) is launch.FWD_CONFIG[mx_2d.code]
    shapes = [(4096, 4096)] * 64  # enough tiles that no program count caps the tiles per program
    for spec in (nvfp4, nvfp4_2d):
        tile = launch.tile_for(shapes, launch.fwd_config(spec), torch.device("cpu"), spec.block, spec.tile_rows)
        assert tile.tpp == launch.fwd_config(spec).tiles_per_program, spec
