"""One-row tiles over rows that are whole multiples of the tile (``ALIGNED``: the production
launch at the model shapes): tile ``t`` starts at element ``t * BC`` and is loaded and stored
without a mask.  Every format, ragged and empty experts, one and three tiles per program (bf16;
fp32 input, whose elements are 32-bit, with three), bit for bit against the reference; the plan must say ``ALIGNED`` (else the test checks nothing new), and a
row that is not a multiple of the tile must not."""

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


@pytest.mark.parametrize("dtype,tpp", [(torch.bfloat16, 1), (torch.bfloat16, 3), (torch.float32, 3)], ids=["bf16-tpp1", "bf16-tpp3", "fp32-tpp3"])
@pytest.mark.parametrize("fmt,options", AMAX_FORMATS + DATA_FORMATS, ids=lambda v: v if isinstance(v, str) else "-".join(v) or "")
def test_aligned_tiles_match_reference(fmt: str, options: dict, dtype: torch.dtype, tpp: int, gen: torch.Generator, device: str) -> None:
    spec = parse_spec(fmt, None, options)
    ws = [w.to(device) for w in _experts(gen, fmt, dtype, SHAPES)]
    cfg = launch.KernelConfig(256, 1, tiles_per_program=tpp)
    table = tables.expert_table(ws)
    assert launch._fwd_plan(table, spec, dtype, False, False, cfg)[1]["ALIGNED"], f"{fmt}: the plan must tile aligned rows"
    flat, outs = tables.alloc_outputs(table, dtype, ws[0].device)
    if fmt in BLOCK:
        amax, view = None, api.no_amax(ws[0].device)
    else:
        amax = amax_stack(ws, [AMAX_MODES[i % len(AMAX_MODES)] for i in range(len(ws))], per_channel=False).to(device)
        view = amax_for_list(amax, [r for r, _ in table.shapes], ws[0].device, nvfp4=spec.code == FMT_NVFP4)
    launch.fwd_list(table, ws, flat, view, spec, check=False, config=cfg)
    want = reference.fake_quant_experts(ws, amax, fmt, **options)
    assert_same_bits(outs, want, ws, case=f"{fmt}{options}/{dtype}/aligned/tpp={tpp}")


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
