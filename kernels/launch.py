"""Host side of one launch: pick the tile, launch, read the check flags.

Two layouts share one kernel source:

* list: N tensors anywhere in memory, described by one cached table (``kernels/tables.py``);
* stacked: one contiguous tensor; expert ``e`` starts at ``e * rows * cols``.

Host cost.  A list launch reuses its table's tile, grid and launch arguments (``ExpertTable.plans``);
what remains per call is the table key, the output allocation and views, and one Triton launch.
Measured host time per call is in ``docs/kernels_performance.md``.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import torch

from . import checks, env, interpret
from .amax import AmaxView
from .tables import FLAT_CAP, ExpertTable, await_table
from .formats import BITS_DTYPE, FMT_FP8, FMT_FP8B, FMT_FP8B_FP32S, FMT_INT, FMT_INT4G, FMT_MXFP4, FMT_MXFP8, FMT_NVFP4, IO_CODES, QuantSpec
from .geometry import TileShape, choose_tile, flat_shapes, flat_width, grid_for, tiles_per_program, with_tpp


@dataclass(frozen=True)
class KernelConfig:
    """Elements per program, warps, and how much tile padding ``choose_tile`` may accept.

    GPU values are chosen by measurement (``benchmarks/``; ``docs/kernels_performance.md`` sections
    1, 8 and 9).  Under the interpreter a program costs milliseconds of Python whatever its size,
    so it gets few, large tiles.
    """

    block: int
    num_warps: int
    max_waste: float = 0.03
    max_bc: int = 2048
    hw_e4m3: bool = True
    """E4M3 rounding by the hardware's conversion where the device has one (``env.hw_e4m3_rne``;
    the same bits as the integer rounding of ``tl_rounding.round_mag_e4m3``)."""
    nvfp4_int_recip: bool = True
    """NVFP4 block reciprocal ``RN(1/d)``: integer ``div_rn_pos`` (True) or ``tl.math.div_rn``."""
    scalar_int_div: bool = False
    """Per-expert/per-row scale divisions: integer ``div_rn_pos`` (True) or ``tl.math.div_rn`` (the
    operands and quotients are provably normal there; NVFP4's ``1/ge`` takes the integer path only
    when its quotient is subnormal).  Both give the same bits; the integer path's 64-bit division
    cost every program a long serial prologue (``docs/kernels_performance.md`` section 9)."""
    split_blocks: bool = True
    """A block's parts in one thread (``SPLIT``: ``block_split``, ``square_split``), else 1.  Off
    for MX: its 64-byte blocks in 16-byte parts give each warp access a 64-byte stride (H200,
    MXFP8: 80% of copy from L2 and 83% at Ultra, against 196% and 97% without)."""
    square_rows_on_lanes: bool = False
    """Square blocks of at most 1024 elements on one warp's lanes (``tiles.tile_4d``'s
    ``ROWS_INNER``) instead of a row of blocks on the lanes: no shared memory, but more registers
    (H200, bf16 pairs, 2048 x 2 tiles: NVFP4 16x16 133 / 88, MXFP4 32x32 143 / 94% of copy, L2 ceiling
    / Ultra, against 137 / 94 and 136 / 98 with a row of blocks on the lanes, before NVFP4 16x16's
    pipeline; ``docs/kernels_performance.md`` section 14): off by default."""
    bf16_pairs: bool = True
    """bf16 block tiles loaded as int32 words of two elements (``PAIRS``; ``tl_rounding.bf16_pairs``)
    where the experts are 16-byte aligned with rows of a multiple of 8 elements, else as int16."""
    max_registers: int = 0
    """A cap on the registers a thread (``maxnreg``); 0: the compiler's choice (16-warp programs:
    ``_launch_opts``'s).  The compiler gives square tiles in bf16 pairs more registers than the
    occupancy their memory speed needs (H200, MXFP4 32x32 in 2048 x 2 tiles: 80 registers, 92.5% of
    copy at Ultra; capped at 64, no spills, 94.8).  Applies to every input dtype: fp32 input
    spills a few registers under the square formats' caps (Triton 3.6, sm_90)."""
    square_two_pass: int = 0
    """Rows a chunk of a square block read in two passes (``fwd_kernel._two_pass_block``: one block
    a tile, bf16 pairs, formats whose scales come from the data); 0: one pass."""
    square_max_warps: int = 16
    """Most warps of a square-block program (``square_block_tile``): a 128x128 FP8 block takes a
    program of 16 warps at 32 elements a thread, or 8 at 64."""
    ties_low: Optional[bool] = None
    """The block tiles' arrangement for a Triton that orders tied axes lowest first (``TIES_LOW``);
    ``None``: the installed Triton's (``env.layout_ties_low``).  Either gives the same bits."""
    tiles_per_program: int = 1
    """Most tiles each program loops over (per-expert scales computed once per program); fewer
    when the problem is small (``geometry.tiles_per_program``)."""
    pipeline_stages: int = 0
    """Square-block tiles in bf16 pairs (loaded as rows of words, ``tiles.tile_rows``): the
    program's tile loop as ``tl.range(num_stages=...)``, whose loads Triton's pipeliner issues
    ``stages - 1`` tiles ahead into shared memory (``cp.async`` from compute capability 8.0), so a
    program keeps tiles in flight without registers to hold them; 0: each tile loaded when its
    iteration starts.  Shared memory: ``stages - 1`` tiles a program (NVFP4 16x16 in 2048 x 2
    tiles, 3 stages: 8 KB, so 14 programs an SM by shared memory, 10 by its 96 registers; measured
    by ``ncu`` on an H200).  Other tiles ignore it (``block_layout``): the 1-D block tiles' warp
    accesses use half of each 32-byte sector, which the copy to shared memory fetches whole from L2
    twice (H200, NVFP4: 161 -> 67% of copy from L2); INT8 and FP8 gain at Ultra (98 -> 101, 98 ->
    100) but lose L2 headroom (164 -> 149, 192 -> 161) and need no gain
    (``docs/kernels_performance.md`` section 16)."""


# Chosen by sweeps of the kernel alone over the benchmark's cases (docs/kernels_performance.md
# sections 1, 8, 9 and 12): the L2-resident ceiling and the Ultra kernel of each candidate in one
# process, kept where the acceptance cases (N=128, Super, Nano) hold.  32 elements per thread
# (2048 x 2 warps) where the per-element work is cheap enough that fewer, fuller threads win (INT,
# the block formats); FP8 keeps 16; per-program or per-block division work is spread over 2 tiles
# per program (INT4 group-wise), 4 (FP8 block-wise fp32 scales) or 8 (NVFP4, whose per-expert
# global-scale divisions make the longest prologue: 187% ceiling against 180% with 2).
FWD_CONFIG: dict[int, KernelConfig] = {
    FMT_INT: KernelConfig(2048, 2, tiles_per_program=1),
    FMT_FP8: KernelConfig(2048, 4, tiles_per_program=1),
    FMT_NVFP4: KernelConfig(2048, 2, tiles_per_program=8, nvfp4_int_recip=False),
    FMT_INT4G: KernelConfig(2048, 2, tiles_per_program=2),
    FMT_FP8B: KernelConfig(2048, 2, tiles_per_program=1),
    FMT_FP8B_FP32S: KernelConfig(2048, 4, tiles_per_program=4),
    FMT_MXFP8: KernelConfig(2048, 2, tiles_per_program=1, split_blocks=False),
    FMT_MXFP4: KernelConfig(2048, 2, tiles_per_program=1, split_blocks=False),
}
FWD_CONFIG_SQUARE: dict[int, KernelConfig] = {
    FMT_NVFP4: KernelConfig(2048, 2, tiles_per_program=4, nvfp4_int_recip=False, max_registers=96, pipeline_stages=3),
    FMT_FP8B: KernelConfig(2048, 2, tiles_per_program=1, square_two_pass=32, square_max_warps=8, max_registers=128),
    FMT_FP8B_FP32S: KernelConfig(2048, 2, tiles_per_program=1, square_two_pass=32, square_max_warps=8, max_registers=128),
    FMT_MXFP8: KernelConfig(4096, 4, tiles_per_program=1, split_blocks=False, max_registers=72),
    FMT_MXFP4: KernelConfig(4096, 4, tiles_per_program=1, split_blocks=False, max_registers=64),
}
"""Square-block (``tile_2d``) launches, bf16 loaded as int32 pairs, chosen on an H200 by the L2
ceiling and the Ultra call (``docs/kernels_performance.md`` sections 14-16): NVFP4 16x16 with 4
tiles a program, 96 registers and its loads pipelined 3 stages deep (138% / 99.5% of copy; 8
tiles without the pipeline 146 / 94, with it 144 / 96; 2 tiles 124 / 98.5; 4 stages 135 / 99),
MX 32x32 in 4096 x 4 tiles (MXFP4 capped at 64 registers: 136 / 98, whole tiles 140 / 98; MXFP8
at 72: 167 / 98, whole tiles 171 / 98; 2048 x 2: 135 / 95 and 171 / 96), FP8 128x128 in 8-warp
programs, bf16 read in two passes over 32-row chunks (160 / 100; one pass at
64 elements a thread, two programs an SM: 121 / 89; 16-row chunks 162 / 85; 4 warps 161 / 75,
sixteen 32 KB blocks an SM in flight, twice its L1).  fp16 and fp32 input take the one pass (8
warps, 128 registers)."""


def fwd_config(spec: QuantSpec) -> KernelConfig:
    """The forward's default configuration for ``spec`` (``FWD_CONFIG_SQUARE`` for square blocks
    where it has one, else ``FWD_CONFIG``)."""
    if spec.tile_rows > 1 and spec.code in FWD_CONFIG_SQUARE:
        return FWD_CONFIG_SQUARE[spec.code]
    return FWD_CONFIG[spec.code]


BWD_CONFIG = KernelConfig(4096, 8, tiles_per_program=1)
INTERPRETER_CONFIG = KernelConfig(65536, 4, max_waste=float("inf"), max_bc=65536, nvfp4_int_recip=False)
"""Under the interpreter both division paths are numpy's IEEE division or exact integer code, so the
NVFP4 block reciprocal takes the GPU configurations' ``tl.math.div_rn`` path: the code the GPU runs, and
2.2x cheaper to interpret than the integer long division (N=8 x [19, 21] bf16, 1-D and 16x16 blocks:
130 -> 57 ms and 282 -> 127 ms a call).  ``div_rn_pos`` keeps its own tests."""


def _config(device: torch.device, config: KernelConfig | None, gpu_default: KernelConfig) -> KernelConfig:
    if config is not None:
        return config
    return INTERPRETER_CONFIG if device.type == "cpu" else gpu_default


def _quiet(device: torch.device):
    """Under the interpreter, numpy warns about the inf/NaN arithmetic the kernels do on purpose."""
    if device.type != "cpu":
        return contextlib.nullcontext()
    import numpy as np

    interpret.install()  # once per process: the interpreter without its repeated language patch

    return np.errstate(all="ignore")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


_MIN_BC = 16


def tile_for(shapes: Sequence[tuple[int, int]], cfg: KernelConfig, device: torch.device, block: int = 0, tile_rows: int = 1) -> TileShape:
    """The tile geometry (and tiles per program) a launch over ``shapes`` uses; ``block``: the
    format's block along the row (a tile holds whole blocks: ``BC >= block``); ``tile_rows > 1``:
    square ``tile_rows x block`` blocks, in tiles of exactly ``tile_rows`` rows."""
    if tile_rows > 1:
        tile = square_block_tile(shapes, cfg, block, tile_rows)
        return with_tpp(tile, tiles_per_program(shapes, tile, cfg.tiles_per_program, _sm_count(device)))
    tile = choose_tile(shapes, max(cfg.block, block), cfg.num_warps, min_bc=max(_MIN_BC, block), max_waste=cfg.max_waste,
                       max_bc=max(cfg.max_bc, block))  # fmt: skip
    return with_tpp(tile, tiles_per_program(shapes, tile, cfg.tiles_per_program, _sm_count(device)))


def square_block_tile(shapes: Sequence[tuple[int, int]], cfg: KernelConfig, block: int, tile_rows: int) -> TileShape:
    """``tile_rows`` rows by a power-of-two multiple of ``block`` columns (about ``cfg.block``
    elements, at least one block, no wider than the widest expert needs); one warp per 1024
    elements, at least ``cfg.num_warps``, at most 16 (a 128x128 FP8 tile)."""
    widest = max((c for r, c in shapes if r and c), default=1)
    bc = block * max(1, cfg.block // (tile_rows * block))
    bc = min(bc, max(block, 1 << (widest - 1).bit_length()))
    if tile_rows * widest + bc > 2**31 - 1:
        raise ValueError(f"a row of {widest} elements is too long for the kernel's int32 in-tile offsets")
    return TileShape(tile_rows, bc, min(cfg.square_max_warps, max(cfg.num_warps, tile_rows * bc // 1024)))


def tiling(shapes: Sequence[tuple[int, int]], flat: int, cfg: KernelConfig, device: torch.device, block: int = 0, tile_rows: int = 1
           ) -> tuple[bool, list[tuple[int, int]], TileShape]:
    """``(use the flat view, the shapes tiled, the tile)``: the flat view ``[rows * cols / flat,
    flat]`` (``flat`` > 0: the elements do not depend on their row) where its tiles are wider than
    the rows' own; else the rows.  Nano rows (2688 = 21 x 128) get 128-wide tiles, their flat view
    2048-wide ones.  ``block``, ``tile_rows``: as ``tile_for`` (square blocks need the rows: pass
    ``flat = 0``)."""
    tile = tile_for(shapes, cfg, device, block, tile_rows)
    if flat > tile.bc:
        fs = flat_shapes(shapes, flat)
        ftile = tile_for(fs, cfg, device, block)
        if ftile.bc > tile.bc:
            return True, fs, ftile
    return False, list(shapes), tile


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS_DTYPE[t.dtype])


_DUMMIES: dict[torch.device, torch.Tensor] = {}


def _dummy(device: torch.device) -> torch.Tensor:
    """A small int32 buffer the kernel never writes (checks off); shared per device."""
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(checks.SLOTS, dtype=torch.int32, device=device)
    return _DUMMIES[device]


def _fwd_constexprs(spec: QuantSpec, dtype: torch.dtype, device: torch.device, per_channel: bool, check: bool, cfg: KernelConfig,
                    facts: Optional[tuple[bool, bool, bool]] = None) -> dict:
    """The forward's compile-time arguments; ``facts``: ``(EXACT_FMA, HW_BF16, HW_E4M3)`` when known
    without probing ``device`` (``kernels/env.py``), e.g. compiling for a GPU that is not here."""
    exact_fma, hw_bf16, hw_e4m3 = facts if facts is not None else (env.exact_fma(device.type), env.hw_bf16_rne(device), env.hw_e4m3_rne(device))
    return dict(
        FMT=spec.code,
        LO=spec.lo,
        QMAX=spec.qmax,
        IO=IO_CODES[dtype],
        PER_CHANNEL=per_channel,
        CHECK=check,
        UNSIGNED=spec.unsigned,
        EXACT_FMA=exact_fma,
        HW_BF16=hw_bf16,
        HW_E4M3=hw_e4m3 and cfg.hw_e4m3,
        BLOCK_RECIP_INT=cfg.nvfp4_int_recip,
        INT_DIV=cfg.scalar_int_div,
        BLOCK=spec.block,
        TILE_R=spec.tile_rows,
    )


def row_aligned(shapes: Sequence[tuple[int, int]], tile: TileShape, spec: QuantSpec, per_channel: bool) -> bool:
    """The forward's ``ALIGNED``: every tile whole, so it is loaded and stored without masks.  One-row
    tiles: every non-empty tiled row a multiple of the tile width (tile ``t`` of an expert starts at
    element ``t * BC``), amax per expert (per channel needs each element's row).  Square-block
    tiles: every non-empty expert's rows a multiple of the tile's rows and its columns of the
    tile's columns (the model shapes: Ultra's [5120, 8192], Nano's 2688 = 21 x 128)."""
    if spec.tile_rows > 1:
        return all(r % tile.br == 0 and c % tile.bc == 0 for r, c in shapes if r and c)
    return (tile.br == 1 and not per_channel
            and all(c % tile.bc == 0 for r, c in shapes if r and c))  # fmt: skip


def block_split(tile: TileShape, block: int, dtype: torch.dtype, aligned: bool) -> int:
    """The forward's ``SPLIT``: in an aligned tile of blocks along the row, how many 16-byte vectors
    of one block each thread holds.  A thread's vectors beyond the first lie in the same block
    (``tiles.tile_aligned``), so each block's scale is computed by fewer threads, each once, and
    its max needs fewer lanes: at most the thread's vectors per tile, at most the block's."""
    if not aligned or not block:
        return 1
    vec = 16 // dtype.itemsize
    per_thread = tile.br * tile.bc // (32 * tile.num_warps)
    return max(1, min(per_thread // vec, block // vec))


def block_layout(tile: TileShape, spec: QuantSpec, dtype: torch.dtype, aligned: bool, vec: int, cfg: KernelConfig) -> dict:
    """The forward's block-tile constexprs: ``ROWS_INNER`` (square blocks of at most 1024 elements
    on one warp's lanes, ``cfg.square_rows_on_lanes``; ``tiles.tile_4d``), ``SPLIT`` (a block's
    parts in one thread: ``block_split``, or ``square_split`` with ``ROWS_INNER``), ``PAIRS`` (bf16
    tiles loaded as int32 words, ``tl_rounding.bf16_pairs``: aligned 1-D tiles and every square
    tile, whose block max is taken on the words (``tl_rounding.pair_magnitude_bits``) so that only
    they stay live across a reduction through shared memory, and whose output is stored as words;
    ``vec > 1`` means 16-byte aligned experts whose rows are multiples of 8 elements, so every word
    holds two elements of one row) and ``TIES_LOW``."""
    square = spec.tile_rows > 1
    rows_inner = square and cfg.square_rows_on_lanes and spec.tile_rows * spec.block <= 1024
    if not cfg.split_blocks or (square and not rows_inner):
        split = 1
    else:
        split = square_split(tile, spec, dtype) if square else block_split(tile, spec.block, dtype, aligned)
    pairs = cfg.bf16_pairs and dtype == torch.bfloat16 and vec > 1 and (square or (aligned and spec.block > 0))
    ties = env.layout_ties_low() if cfg.ties_low is None else cfg.ties_low
    two_pass = cfg.square_two_pass if square and pairs and spec.code != FMT_NVFP4 and tile.bc == spec.block and tile.br == spec.tile_rows else 0
    stages = cfg.pipeline_stages if square and pairs and not rows_inner and not two_pass else 0
    return dict(SPLIT=split, PAIRS=pairs, TIES_LOW=ties, ROWS_INNER=rows_inner, CHUNK_R=two_pass, STAGES=stages)


def square_split(tile: TileShape, spec: QuantSpec, dtype: torch.dtype) -> int:
    """The forward's ``SPLIT`` for square blocks of at most 1024 elements (``tiles.tile_4d``'s
    ``ROWS_INNER``): how many row groups of one block each thread holds: all its 16-byte vectors
    (so each thread computes one block scale a tile), and at least enough that a block's other
    rows times its vectors per row fit one warp's 32 lanes (NVFP4 16x16 at 2048 x 2: 4, a block on
    8 lanes; MX 32x32 in bf16: 4, a block on 32 lanes); 1 for larger blocks (their rows go across
    the warps)."""
    r, elements, vec = spec.tile_rows, spec.tile_rows * spec.block, 16 // dtype.itemsize
    if r <= 1 or elements > 1024:
        return 1
    vectors = tile.br * tile.bc // (32 * tile.num_warps * vec)
    return min(r, max(vectors, elements // (32 * vec), 1))


def _launch_opts(tile: TileShape, cfg: Optional[KernelConfig] = None) -> dict:
    """Triton launch options of a tile: its geometry, its warps, no FMA contraction (the formats'
    op sequences round every product), for 16-warp programs a cap of 64 registers a thread, so that
    two programs fit an SM's 65,536 registers (the compiler gave a 16-warp 128x128 kernel 92
    without it: one program per SM, 76% of copy at Ultra against 99% at 60 registers;
    ``docs/kernels_performance.md`` section 12), and ``cfg.max_registers`` where set."""
    opts = dict(BR=tile.br, BC=tile.bc, TPP=tile.tpp, num_warps=tile.num_warps, enable_fp_fusion=False)
    if tile.num_warps >= 16:
        opts["maxnreg"] = 65536 // (2 * 32 * tile.num_warps)
    if cfg is not None and cfg.max_registers:
        opts["maxnreg"] = cfg.max_registers
    return opts


def _stacked_shapes(x: torch.Tensor) -> list[tuple[int, int]]:
    """``x`` (``[..., rows, cols]``, or 1-D) as ``N`` experts of ``(rows, cols)``."""
    cols = int(x.shape[-1])
    rows = int(x.shape[-2]) if x.dim() >= 2 else 1
    n = int(torch.Size(x.shape[:-2]).numel()) if x.dim() >= 2 else 1
    return [(rows, cols)] * n


def _stacked_vec(dtype: torch.dtype, cols: int) -> int:
    vec = 16 // dtype.itemsize
    return vec if cols % vec == 0 else 1


def _launch(jit_fn, plans: dict, fkey: tuple, grid: tuple[int, int], raw: tuple, typed: Callable[[], tuple], kw: dict, device: torch.device):
    """One launch of ``jit_fn`` over ``grid``.

    The first launch with a given ``fkey`` (everything Triton specialises on: dtypes, pointer
    alignment, integer values) goes through the JIT, ``jit_fn[grid](*typed(), **kw)``, with typed
    tensors (the raw bits views that fix the pointer types).  On a GPU, later launches with that
    ``fkey`` call the compiled kernel's launcher directly with ``raw``: the same arguments in
    signature order, device pointers as Python ints (the launcher takes an int as the address
    itself; a tensor costs a ``data_ptr()`` call and a driver pointer query per argument).  This
    skips Triton's per-call argument binding and cache-key hashing, the dtype views and the
    pointer queries.  ``raw`` keeps a tensor only where its device address must come from the
    driver (the mapped host flags of ``kernels/checks.py``)."""
    fast = plans.get(fkey)
    if fast is not None:
        compiled, consts, knobs = fast
        stream = torch._C._cuda_getCurrentRawStream(device.index)
        full = (*raw, *consts)
        runtime = knobs.runtime  # hooks read per launch: a profiler may set them at any time
        enter, leave = _hook(runtime.launch_enter_hook), _hook(runtime.launch_exit_hook)
        md = None if enter is None and leave is None else compiled.launch_metadata(grid, stream, *full)
        compiled.run(grid[0], grid[1], 1, stream, compiled.function, compiled.packed_metadata, md, enter, leave, *full)
        return compiled
    args = typed()
    with _quiet(device):
        compiled = jit_fn[grid](*args, **kw)
    if device.type == "cuda" and FAST_LAUNCH and compiled is not None and hasattr(compiled, "packed_metadata"):
        try:
            from triton import knobs
        except ImportError:  # a Triton without knobs: keep the JIT path
            return compiled
        names = jit_fn.arg_names[len(args):]
        if all(n in kw for n in names):
            plans[fkey] = (compiled, tuple(kw[n] for n in names), knobs)
    return compiled


def _hook(hook):
    """A launch hook as the launcher should get it: ``None`` for none, or for an empty hook chain
    (Triton keeps a ``HookChain`` object where no hook is registered; passed as it is, every launch
    builds a launch-metadata dict and calls the empty chain; the host time saved is measured in
    ``docs/kernels_performance.md`` section 9)."""
    return None if hook is None or getattr(hook, "calls", None) == [] else hook


@functools.lru_cache(maxsize=None)
def _kernel(which: str):
    """The forward or backward ``triton.jit`` function, imported on first use (importing this
    module does not import Triton; an import statement per call costs about a microsecond)."""
    if which == "fwd":
        from .fwd_kernel import fake_quant_fwd_kernel  # deferred: importing Triton waits for the first launch

        return fake_quant_fwd_kernel
    from .bwd_kernel import clipped_bwd_kernel  # deferred: as above

    return clipped_bwd_kernel


FAST_LAUNCH = True
"""Reuse compiled kernels' launchers directly (GPU only); ``False`` always goes through the JIT."""


def _fwd_plan(table: ExpertTable, spec: QuantSpec, dtype: torch.dtype, per_channel: bool, check: bool, config: KernelConfig | None):
    """``(grid, launch keywords)`` of a forward over ``table`` (cached in the table)."""
    pkey = ("fwd", spec, dtype, per_channel, check, config)
    plan = table.plans.get(pkey)
    if plan is None:
        device = table.device
        cfg = _config(device, config, fwd_config(spec))
        whole_blocks = not spec.block or all(c % spec.block == 0 for r, c in table.shapes if r and c)
        flat = 0 if per_channel or not whole_blocks or spec.tile_rows > 1 else table.flat
        use_flat, shapes, tile = tiling(table.shapes, flat, cfg, device, spec.block, spec.tile_rows)
        aligned = row_aligned(shapes, tile, spec, per_channel)
        kw = dict(LIST=True, VEC=table.xvec, FLAT=use_flat, ALIGNED=aligned, **block_layout(tile, spec, dtype, aligned, table.xvec, cfg),
                  **_fwd_constexprs(spec, dtype, device, per_channel, check, cfg), **_launch_opts(tile, cfg))  # fmt: skip
        plan = table.plans[pkey] = (grid_for(shapes, tile), kw)
    return plan


def fwd_list(
    table: ExpertTable,
    xs: Sequence[torch.Tensor],
    out_flat: torch.Tensor,
    amax: AmaxView,
    spec: QuantSpec,
    *,
    check: bool | str,
    config: KernelConfig | None = None,
):
    """Fake-quantize the experts ``xs`` of ``table`` into ``out_flat`` (from ``alloc_outputs``), one
    launch.  ``check``: ``True`` (asynchronous), ``"sync"`` or ``False`` (see ``kernels/checks.py``).
    Returns what the Triton launch returns (the compiled kernel on a GPU)."""
    fake_quant_fwd_kernel = _kernel("fwd")
    x0 = xs[table.base]
    device = table.device
    await_table(table)
    grid, kw = _fwd_plan(table, spec, x0.dtype, amax.per_channel, bool(check), config)
    flags = checks.flags_for(device, check)
    fl = _dummy(device) if flags is None else flags
    a = amax.data
    ap, op = a.data_ptr(), out_flat.data_ptr()
    n = len(table.shapes)
    raw = (x0.data_ptr(), op, table.meta.data_ptr(), ap, amax.se, amax.sr, fl if flags is not None else fl.data_ptr(), n, 0, 0)
    fkey = ("fast", grid, id(kw), ap % 16 == 0, amax.se, amax.sr, op % 16 == 0)
    compiled = _launch(fake_quant_fwd_kernel, table.plans, fkey, grid, raw,
                       lambda: (_bits(x0), _bits(out_flat), table.meta, a, amax.se, amax.sr, fl, n, 0, 0), kw, device)  # fmt: skip
    if flags is not None:
        checks.after_launch(flags, device, check)
    return compiled


STACKED_PLANS = 256
"""Stacked-layout launch plans kept (oldest first out)."""
_STACKED: dict[tuple, tuple] = {}


def _stacked_plan(pkey: tuple, x: torch.Tensor, make: Callable[[list[tuple[int, int]]], tuple[tuple[int, int], dict, list[tuple[int, int]]]]) -> tuple:
    """``(grid, launch keywords, (n, rows, cols), fast-launch plans)`` of a stacked launch, cached
    on ``pkey`` (which holds ``x``'s shape, dtype and device and every launch option): a repeated
    call skips the tile choice, which walks the N experts, and launches through ``_launch``'s
    direct path.  ``make`` returns the grid, the keywords and the shapes tiled (the flat view or
    the rows); ``(rows, cols)`` are those the kernel gets."""
    plan = _STACKED.get(pkey)
    if plan is None:
        grid, kw, shapes = make(_stacked_shapes(x))
        plan = _STACKED[pkey] = (grid, kw, (len(shapes), *shapes[0]), {})
        if len(_STACKED) > STACKED_PLANS:
            del _STACKED[next(iter(_STACKED))]
    return plan


def stacked_fwd_plan(shapes: list[tuple[int, int]], dtype: torch.dtype, device: torch.device, spec: QuantSpec, per_channel: bool,
                     check: bool, cfg: KernelConfig, facts: Optional[tuple[bool, bool, bool]] = None, base_aligned: bool = True
                     ) -> tuple[tuple[int, int], dict, list[tuple[int, int]]]:
    """``(grid, launch keywords, shapes tiled)`` of a stacked forward over ``shapes`` (the flat view
    where the elements do not depend on their row); ``base_aligned``: the input starts 16-byte
    aligned (else no bf16 pairs: a word load at an odd element address faults); ``facts``: as
    ``_fwd_constexprs``."""
    keeps_rows = per_channel or spec.tile_rows > 1 or (spec.block and shapes[0][1] % spec.block != 0)
    _, used, tile = tiling(shapes, 0 if keeps_rows else flat_width(shapes, FLAT_CAP), cfg, device, spec.block, spec.tile_rows)
    aligned = row_aligned(used, tile, spec, per_channel)
    vec = _stacked_vec(dtype, used[0][1])
    kw = dict(LIST=False, VEC=vec, FLAT=False, ALIGNED=aligned, **block_layout(tile, spec, dtype, aligned, vec if base_aligned else 1, cfg),
              **_fwd_constexprs(spec, dtype, device, per_channel, check, cfg, facts), **_launch_opts(tile, cfg))  # fmt: skip
    return grid_for(used, tile), kw, used


def fwd_stacked(
    x: torch.Tensor, out: torch.Tensor, amax: AmaxView, spec: QuantSpec, *, check: bool | str, config: KernelConfig | None = None
) -> None:
    """Fake-quantize contiguous ``x`` viewed as ``[N, rows, cols]`` into ``out`` in one launch."""
    fake_quant_fwd_kernel = _kernel("fwd")
    device = x.device

    def make(shapes: list[tuple[int, int]]) -> tuple[tuple[int, int], dict, list[tuple[int, int]]]:
        return stacked_fwd_plan(shapes, x.dtype, device, spec, amax.per_channel, bool(check), _config(device, config, fwd_config(spec)),
                                base_aligned=base_aligned)

    base_aligned = x.data_ptr() % 16 == 0
    grid, kw, (n, rows, cols), fast = _stacked_plan(("fwd", x.shape, x.dtype, device, spec, amax.per_channel, bool(check), config, base_aligned), x,
                                                    make)
    flags = checks.flags_for(device, check)
    fl = _dummy(device) if flags is None else flags
    a = amax.data
    xp, op, ap = x.data_ptr(), out.data_ptr(), a.data_ptr()
    flp = fl if flags is not None else fl.data_ptr()
    raw = (xp, op, flp, ap, amax.se, amax.sr, flp, n, rows, cols)
    fkey = ("fast", xp % 16 == 0, op % 16 == 0, flags is None, ap % 16 == 0, amax.se, amax.sr)
    _launch(fake_quant_fwd_kernel, fast, fkey, grid, raw, lambda: (_bits(x), _bits(out), fl, a, amax.se, amax.sr, fl, n, rows, cols), kw, device)
    if flags is not None:
        checks.after_launch(flags, device, check)


def _bwd_plan(table: ExpertTable, dtype: torch.dtype, per_channel: bool, config: KernelConfig | None):
    pkey = ("bwd", dtype, per_channel, config)
    plan = table.plans.get(pkey)
    if plan is None:
        cfg = _config(table.device, config, BWD_CONFIG)
        use_flat, shapes, tile = tiling(table.shapes, 0 if per_channel else table.flat, cfg, table.device)
        cvec = max(table.xvec, table.gvec) if min(table.xvec, table.gvec) > 1 else 1
        kw = dict(IO=IO_CODES[dtype], LIST=True, PER_CHANNEL=per_channel, XVEC=table.xvec, GVEC=table.gvec, CVEC=cvec, FLAT=use_flat,
                  **_launch_opts(tile))  # fmt: skip
        plan = table.plans[pkey] = (grid_for(shapes, tile), kw)
    return plan


def bwd_list(
    table: ExpertTable,
    xs: Sequence[torch.Tensor],
    grads: Sequence[torch.Tensor],
    out_flat: torch.Tensor,
    amax: AmaxView,
    *,
    config: KernelConfig | None = None,
) -> None:
    """Clipped STE backward for the experts of ``table`` (built with ``grads``), one launch."""
    clipped_bwd_kernel = _kernel("bwd")
    x0, g0 = xs[table.base], grads[table.base]
    await_table(table)
    grid, kw = _bwd_plan(table, x0.dtype, amax.per_channel, config)
    a = amax.data
    ap, op = a.data_ptr(), out_flat.data_ptr()
    n = len(table.shapes)
    raw = (x0.data_ptr(), g0.data_ptr(), op, table.meta.data_ptr(), ap, amax.se, amax.sr, n, 0, 0)
    fkey = ("fast", grid, id(kw), ap % 16 == 0, amax.se, amax.sr, op % 16 == 0)
    _launch(clipped_bwd_kernel, table.plans, fkey, grid, raw,
            lambda: (_bits(x0), _bits(g0), _bits(out_flat), table.meta, a, amax.se, amax.sr, n, 0, 0), kw, table.device)  # fmt: skip


def bwd_stacked(
    x: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, amax: AmaxView, *, config: KernelConfig | None = None
) -> None:
    """Clipped STE backward for one contiguous tensor viewed as ``[N, rows, cols]``."""
    clipped_bwd_kernel = _kernel("bwd")
    device = x.device

    def make(shapes: list[tuple[int, int]]) -> tuple[tuple[int, int], dict, list[tuple[int, int]]]:
        cfg = _config(device, config, BWD_CONFIG)
        _, used, tile = tiling(shapes, 0 if amax.per_channel else flat_width(shapes, FLAT_CAP), cfg, device)
        cols = used[0][1]
        xvec, gvec = _stacked_vec(x.dtype, cols), _stacked_vec(grad.dtype, cols)
        kw = dict(IO=IO_CODES[x.dtype], LIST=False, PER_CHANNEL=amax.per_channel, XVEC=xvec, GVEC=gvec,
                  CVEC=max(xvec, gvec) if min(xvec, gvec) > 1 else 1, FLAT=False, **_launch_opts(tile))  # fmt: skip
        return grid_for(used, tile), kw, used

    pkey = ("bwd", x.shape, x.dtype, grad.dtype, device, amax.per_channel, config)
    grid, kw, (n, rows, cols), fast = _stacked_plan(pkey, x, make)
    a = amax.data
    xp, gp, op, ap = x.data_ptr(), grad.data_ptr(), out.data_ptr(), a.data_ptr()
    raw = (xp, gp, op, gp, ap, amax.se, amax.sr, n, rows, cols)
    fkey = ("fast", xp % 16 == 0, gp % 16 == 0, op % 16 == 0, ap % 16 == 0, amax.se, amax.sr)
    _launch(clipped_bwd_kernel, fast, fkey, grid, raw, lambda: (_bits(x), _bits(grad), _bits(out), grad, a, amax.se, amax.sr, n, rows, cols),
            kw, device)  # fmt: skip
