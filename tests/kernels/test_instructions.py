"""The offline instruction profile (``benchmarks.instructions``): a bench column compiled for sm_90
without a GPU, as the production launch compiles it, and its PTX and SASS counted (in a process of
its own: this session's kernels may be the interpreter's)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="pip install -e '.[triton]'")
pytest.importorskip("triton.backends.nvidia.compiler", reason="Triton without its NVIDIA back end (ptxas, cuobjdump)")

REPO = Path(__file__).resolve().parents[2]


def _profile(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, list]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = tmp_path / f"rows{len(list(tmp_path.iterdir()))}.json"
    proc = subprocess.run([sys.executable, "-m", "moe_fq_parity.benchmarks.instructions", "--json", str(out), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    return proc, json.loads(out.read_text()) if out.exists() else []


def test_int8_column_compiles_offline_and_its_checks_cost_instructions(tmp_path):
    proc, (off,) = _profile(tmp_path, "--columns", "int8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    _, (on,) = _profile(tmp_path, "--columns", "int8", "--check")
    from moe_fq_parity.kernels.formats import FMT_INT
    from moe_fq_parity.kernels.launch import FWD_CONFIG

    cfg = FWD_CONFIG[FMT_INT]
    per_thread = cfg.block // (32 * cfg.num_warps) * cfg.tiles_per_program  # the Ultra launch keeps the configured tile
    assert off["elements_per_thread"] == per_thread and off["shape_tiled"][1] % per_thread == 0
    assert 16 <= off["registers"] <= 255  # ptxas's count, as the GPU reports it (44 for this launch with Triton 3.6 on an H100)
    assert 0 < off["ptx"] < on["ptx"] and 0 < off["sass"] < on["sass"]  # the checked launch flags bad amax and inputs
    assert dict(off["sass_top"]).get("FMUL", 0) >= 3 * per_thread  # x*s, q*r2 and *256 per element
    assert "int8" in proc.stdout and str(off["sass"]) in proc.stdout


def test_bad_columns_and_the_interpreter_are_refused(tmp_path):
    proc, rows = _profile(tmp_path, "--columns", "int9")
    assert proc.returncode == 2 and "unknown ['int9']" in proc.stderr and rows == []
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-m", "moe_fq_parity.benchmarks.instructions"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2 and "TRITON_INTERPRET" in proc.stderr


def test_a_blocks_parts_and_a_square_blocks_rows_lie_where_the_kernel_relies_on(tmp_path):
    """The layouts ``tiles.tile_aligned`` (``SPLIT``) and ``tiles.tile_rows`` are written for, read
    from the compiled kernels' TTGIR at the Ultra launch on the installed Triton (1-D block tiles
    are built in the arrangement its tie rule needs: ``env.layout_ties_low``): a 1-D block tile
    ``[K, NB, part]`` (``[NB, K, part]`` with ``ties_low``) keeps its ``K`` axis in one thread (no
    lane, no warp along it) and a block's part on exactly its lanes; a square tile, loaded as rows
    ``[BR, BC]``, puts whole rows of blocks on a warp's lanes (whole 128-byte lines a warp access)
    and its warps across the rows (NVFP4 16x16's load is its pipelined copy to shared memory).
    bf16 tiles count int32 words of two elements (``pairs``)."""
    proc, rows = _profile(tmp_path, "--columns", "nvfp4,int4_group,fp8_block+fp32s,nvfp4+2d,mxfp4+2d")
    assert proc.returncode == 0, proc.stderr[-2000:]
    by = {r["column"]: r for r in rows}
    for col in ("nvfp4", "int4_group", "fp8_block+fp32s"):  # MX splits no block (launch.FWD_CONFIG)
        lay, k, ties = by[col]["input_layout"], by[col]["split"], by[col]["ties_low"]
        kax = 1 if ties else 0
        assert by[col]["pairs"] and k > 1 and lay["shape"][kax] == k, (col, lay, k)
        assert lay["threadsPerWarp"][kax] == 1 and lay["warpsPerCTA"][kax] == 1, (col, lay)
        assert lay["sizePerThread"][2] * lay["threadsPerWarp"][2] == lay["shape"][2] and lay["warpsPerCTA"][2] == 1, (col, lay)
    for col, block_words in (("nvfp4+2d", 8), ("mxfp4+2d", 16)):
        lay = by[col]["input_layout"]
        assert by[col]["pairs"] and by[col]["split"] == 1 and len(lay["shape"]) == 2, (col, lay)
        row_words = lay["sizePerThread"][1] * lay["threadsPerWarp"][1]  # a warp access's words of one row
        assert row_words % block_words == 0 and row_words * 4 % 128 == 0, (col, lay)  # whole blocks, whole lines
        assert lay["warpsPerCTA"][1] == 1 and lay["threadsPerWarp"][0] * lay["warpsPerCTA"][0] > 1, (col, lay)  # warps across rows
