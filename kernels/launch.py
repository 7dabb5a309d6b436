"""Host side of one launch: build the expert table, pick the tile, launch, read the check flags.

Two layouts share one kernel source:

* list: N tensors anywhere in memory; their addresses, output offsets and shapes go into one
  int64 table ``meta[5, N]`` (see ``ExpertTable``) that the kernel reads per program;
* stacked: one contiguous tensor; expert ``e`` starts at ``e * rows * cols``.

Outputs of the list layout are views into one buffer (one allocation), each expert starting on a
64-element boundary so the kernel may use 16-byte vector accesses.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Sequence

import torch

from . import env
from .amax import AmaxView, raise_value_errors, value_errors
from .formats import BITS_DTYPE, FMT_FP8, FMT_INT, FMT_NVFP4, IO_CODES, QuantSpec
from .geometry import TileShape, choose_tile, expert_matrix_shape, grid_for, tiles_per_program, with_tpp



@dataclass(frozen=True)
class KernelConfig:
    """Elements per program, warps, and how much tile padding ``choose_tile`` may accept.

    GPU values are chosen from H100 measurements (``kernels/bench.py``).  Under the interpreter a
    program costs milliseconds of Python whatever its size, so it gets few, large tiles.
    """

    block: int
    num_warps: int
    max_waste: float = 0.03
    max_bc: int = 2048
    nvfp4_int_recip: bool = True
    """NVFP4 block reciprocal ``RN(1/d)``: integer ``div_rn_pos`` (True) or ``tl.math.div_rn``."""
    scalar_int_div: bool = True
    """Per-expert/per-row scale divisions: integer ``div_rn_pos`` (True) or ``tl.math.div_rn``."""
    tiles_per_program: int = 1
    """Most tiles each program loops over (per-expert scales computed once per program); fewer
    when the problem is small (``geometry.tiles_per_program``)."""


# Fastest of `python -m moe_fq_parity.kernels.bench --sweep` at the Ultra production case on an H200 (2 runs;
# differences under ~2% are run-to-run noise): INT 4096x4w/4 tiles 92.4%, FP8 2048x4w/8 93.7%,
# NVFP4 2048x4w/8 78.7% (integer block reciprocal: 42%), backward 8192x8w/2 95.3% of copy bandwidth.
FWD_CONFIG: dict[int, KernelConfig] = {
    FMT_INT: KernelConfig(4096, 4, tiles_per_program=4),
    FMT_FP8: KernelConfig(2048, 4, tiles_per_program=8),
    FMT_NVFP4: KernelConfig(2048, 4, tiles_per_program=8, nvfp4_int_recip=False),
}
BWD_CONFIG = KernelConfig(8192, 8, tiles_per_program=2)
INTERPRETER_CONFIG = KernelConfig(65536, 4, max_waste=float("inf"), max_bc=65536)
"""Under the interpreter both division paths are numpy's IEEE division or exact integer code."""


def _config(device: torch.device, config: KernelConfig | None, gpu_default: KernelConfig) -> KernelConfig:
    if config is not None:
        return config
    return INTERPRETER_CONFIG if device.type == "cpu" else gpu_default


def _quiet(device: torch.device):
    """Under the interpreter, numpy warns about the inf/NaN arithmetic the kernels do on purpose."""
    if device.type != "cpu":
        return contextlib.nullcontext()
    import numpy as np

    return np.errstate(all="ignore")


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def tile_for(shapes: Sequence[tuple[int, int]], cfg: KernelConfig, device: torch.device) -> TileShape:
    """The tile geometry (and tiles per program) a launch over ``shapes`` uses."""
    tile = choose_tile(shapes, cfg.block, cfg.num_warps, min_bc=_MIN_BC, max_waste=cfg.max_waste, max_bc=cfg.max_bc)
    return with_tpp(tile, tiles_per_program(shapes, tile, cfg.tiles_per_program, _sm_count(device)))
_MIN_BC = 16


_PAD_ELEMS = 64  # every expert's output starts on a 64-element boundary: >= 128 bytes for any dtype


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(BITS_DTYPE[t.dtype])


def _vec(tensors: Sequence[torch.Tensor], shapes: Sequence[tuple[int, int]]) -> int:
    """Elements per 16 bytes when every non-empty expert starts 16-byte aligned and its row length is
    a multiple of that (the kernel may then use 16-byte vector accesses), else 1."""
    vec = 16 // tensors[0].element_size()
    ok = all(t.data_ptr() % 16 == 0 and c % vec == 0 for t, (r, c) in zip(tensors, shapes) if r and c)
    return vec if ok else 1


def _base_offsets(tensors: Sequence[torch.Tensor], base: torch.Tensor) -> list[int]:
    """Element offsets of each tensor's data from ``base``'s (same dtype: exact division)."""
    esize, b = base.element_size(), base.data_ptr()
    offs = [(t.data_ptr() - b) // esize for t in tensors]
    assert all((t.data_ptr() - b) % esize == 0 for t in tensors), "expert data not aligned to its dtype"
    return offs


@dataclass(frozen=True)
class ExpertTable:
    """What a list-layout launch needs that depends only on the experts' addresses and shapes.

    ``meta`` (int64 ``[5, N]`` on the device): input offset (elements from ``xs[base]``), output
    offset (from the output buffer), rows, cols, gradient offset (from ``grads[base]``).  Output
    offsets follow from the shapes alone, so the table stays valid for any output buffer from
    ``alloc_outputs`` and the module adapter can keep it while the weights stay where they are.
    ``base``: the first non-empty expert (an empty tensor's address may be 0); ``xvec``/``gvec``:
    elements per 16-byte vector the kernel may assume (1: no alignment assumed).
    """

    meta: torch.Tensor
    shapes: tuple[tuple[int, int], ...]
    out_shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    total: int
    base: int
    xvec: int
    gvec: int
    key: tuple


def table_key(xs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None = None) -> tuple:
    """Identity of a table: addresses, shapes, dtypes (and gradient addresses)."""
    key = tuple((w.data_ptr(), tuple(w.shape), w.dtype) for w in xs)
    if grads is not None:
        key += tuple((g.data_ptr(), g.dtype) for g in grads)
    return key


def expert_table(xs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None = None) -> ExpertTable:
    """Build the table for validated experts ``xs`` (and, for the backward, their gradients)."""
    shapes = tuple(expert_matrix_shape(w) for w in xs)
    offsets, total = [], 0
    for r, c in shapes:
        offsets.append(total)
        total += -(-(r * c) // _PAD_ELEMS) * _PAD_ELEMS
    base = next((i for i, (r, c) in enumerate(shapes) if r and c), 0)
    xo = _base_offsets(xs, xs[base])
    go = _base_offsets(grads, grads[base]) if grads is not None else [0] * len(xs)
    device = xs[0].device
    meta = torch.tensor([xo, offsets, [r for r, _ in shapes], [c for _, c in shapes], go], dtype=torch.int64,
                        pin_memory=device.type == "cuda")  # fmt: skip
    meta = meta.to(device, non_blocking=True)
    xvec = _vec(xs, shapes)
    gvec = _vec(grads, shapes) if grads is not None else xvec
    return ExpertTable(meta, shapes, tuple(w.shape for w in xs), tuple(offsets), total, base, xvec, gvec, table_key(xs, grads))


def alloc_outputs(table: ExpertTable, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat buffer plus the per-expert contiguous views the kernel writes (``table.offsets``).

    Equal shapes whose size is a multiple of the padding (the usual grouped layer) take one
    ``[N, ...]`` allocation and ``unbind``: a single call instead of 2N view constructions.
    """
    n = len(table.shapes)
    first = table.out_shapes[0]
    if n and all(s == first for s in table.out_shapes) and table.offsets[-1] == (n - 1) * first.numel() and first.numel():
        stacked = torch.empty((n, *first), dtype=dtype, device=device)
        return stacked.view(-1), list(stacked.unbind(0))
    flat = torch.empty(max(table.total, 1), dtype=dtype, device=device)
    sizes: list[int] = []
    prev = 0
    for off, (r, c) in zip(table.offsets, table.shapes):
        sizes += [off - prev, r * c]
        prev = off + r * c
    sizes.append(flat.numel() - prev)
    chunks = flat.split(sizes)
    return flat, [chunks[2 * i + 1].view(s) for i, s in enumerate(table.out_shapes)]


def _flags(device: torch.device, check: bool) -> torch.Tensor:
    return torch.zeros(2, dtype=torch.int32, device=device) if check else _dummy(device)


_DUMMIES: dict[torch.device, torch.Tensor] = {}


def _dummy(device: torch.device) -> torch.Tensor:
    """A small int32 buffer the kernel never writes (checks off); shared per device."""
    if device not in _DUMMIES:
        _DUMMIES[device] = torch.zeros(2, dtype=torch.int32, device=device)
    return _DUMMIES[device]


def _finish_checks(flags: torch.Tensor, amax: AmaxView, spec: QuantSpec) -> None:
    """One sync: amax value errors first (as the reference checks them first), then input errors."""
    values = torch.cat([value_errors(amax.data), flags]).tolist()
    raise_value_errors(values[:3])
    if values[3]:
        raise ValueError("unsigned INT quantization got negative input values (Model-Optimizer rejects them too)")
    if values[4]:
        raise ValueError("NVFP4 fake quant got NaN input: the block scale of a NaN block is undefined")


def _fwd_constexprs(spec: QuantSpec, dtype: torch.dtype, device: torch.device, amax: AmaxView, check: bool, cfg: KernelConfig) -> dict:
    return dict(
        FMT=spec.code,
        LO=spec.lo,
        QMAX=spec.qmax,
        IO=IO_CODES[dtype],
        PER_CHANNEL=amax.per_channel,
        CHECK=check,
        UNSIGNED=spec.unsigned,
        EXACT_FMA=env.exact_fma(device.type),
        BLOCK_RECIP_INT=cfg.nvfp4_int_recip,
        INT_DIV=cfg.scalar_int_div,
    )


def _launch_opts(tile: TileShape) -> dict:
    return dict(BR=tile.br, BC=tile.bc, TPP=tile.tpp, num_warps=tile.num_warps, enable_fp_fusion=False)


def _stacked_shapes(x: torch.Tensor) -> list[tuple[int, int]]:
    """``x`` (``[..., rows, cols]``, or 1-D) as ``N`` experts of ``(rows, cols)``."""
    cols = int(x.shape[-1])
    rows = int(x.shape[-2]) if x.dim() >= 2 else 1
    n = int(torch.Size(x.shape[:-2]).numel()) if x.dim() >= 2 else 1
    return [(rows, cols)] * n


def _stacked_vec(x: torch.Tensor, cols: int) -> int:
    vec = 16 // x.element_size()
    return vec if cols % vec == 0 else 1


def fwd_list(
    table: ExpertTable,
    xs: Sequence[torch.Tensor],
    out_flat: torch.Tensor,
    amax: AmaxView,
    spec: QuantSpec,
    *,
    check: bool,
    config: KernelConfig | None = None,
) -> None:
    """Fake-quantize the experts ``xs`` of ``table`` into ``out_flat`` (from ``alloc_outputs``), one launch."""
    from .fwd_kernel import fake_quant_fwd_kernel

    x0 = xs[table.base]
    cfg = _config(x0.device, config, FWD_CONFIG[spec.code])
    tile = tile_for(table.shapes, cfg, x0.device)
    grid = grid_for(table.shapes, tile)
    flags = _flags(x0.device, check)
    with _quiet(x0.device):
        fake_quant_fwd_kernel[grid](
            _bits(x0), _bits(out_flat), table.meta, amax.data, amax.se, amax.sr, flags, len(table.shapes), 0, 0,
            LIST=True, VEC=table.xvec, **_fwd_constexprs(spec, x0.dtype, x0.device, amax, check, cfg), **_launch_opts(tile),
        )  # fmt: skip
    if check:
        _finish_checks(flags, amax, spec)


def fwd_stacked(
    x: torch.Tensor, out: torch.Tensor, amax: AmaxView, spec: QuantSpec, *, check: bool, config: KernelConfig | None = None
) -> None:
    """Fake-quantize contiguous ``x`` viewed as ``[N, rows, cols]`` into ``out`` in one launch."""
    from .fwd_kernel import fake_quant_fwd_kernel

    shapes = _stacked_shapes(x)
    (rows, cols), n = shapes[0], len(shapes)
    cfg = _config(x.device, config, FWD_CONFIG[spec.code])
    tile = tile_for(shapes, cfg, x.device)
    grid = grid_for(shapes, tile)
    flags = _flags(x.device, check)
    with _quiet(x.device):
        fake_quant_fwd_kernel[grid](
            _bits(x), _bits(out), flags, amax.data, amax.se, amax.sr, flags, n, rows, cols,
            LIST=False, VEC=_stacked_vec(x, cols), **_fwd_constexprs(spec, x.dtype, x.device, amax, check, cfg), **_launch_opts(tile),
        )  # fmt: skip
    if check:
        _finish_checks(flags, amax, spec)


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
    from .bwd_kernel import clipped_bwd_kernel

    x0, g0 = xs[table.base], grads[table.base]
    cfg = _config(x0.device, config, BWD_CONFIG)
    tile = tile_for(table.shapes, cfg, x0.device)
    grid = grid_for(table.shapes, tile)
    cvec = max(table.xvec, table.gvec) if min(table.xvec, table.gvec) > 1 else 1
    with _quiet(x0.device):
        clipped_bwd_kernel[grid](
            _bits(x0), _bits(g0), _bits(out_flat), table.meta, amax.data, amax.se, amax.sr, len(table.shapes), 0, 0,
            IO=IO_CODES[x0.dtype], LIST=True, PER_CHANNEL=amax.per_channel, XVEC=table.xvec, GVEC=table.gvec, CVEC=cvec,
            **_launch_opts(tile),
        )  # fmt: skip


def bwd_stacked(
    x: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, amax: AmaxView, *, config: KernelConfig | None = None
) -> None:
    """Clipped STE backward for one contiguous tensor viewed as ``[N, rows, cols]``."""
    from .bwd_kernel import clipped_bwd_kernel

    shapes = _stacked_shapes(x)
    (rows, cols), n = shapes[0], len(shapes)
    cfg = _config(x.device, config, BWD_CONFIG)
    tile = tile_for(shapes, cfg, x.device)
    grid = grid_for(shapes, tile)
    xvec, gvec = _stacked_vec(x, cols), _stacked_vec(grad, cols)
    with _quiet(x.device):
        clipped_bwd_kernel[grid](
            _bits(x), _bits(grad), _bits(out), grad, amax.data, amax.se, amax.sr, n, rows, cols,
            IO=IO_CODES[x.dtype], LIST=False, PER_CHANNEL=amax.per_channel, XVEC=xvec, GVEC=gvec,
            CVEC=max(xvec, gvec) if min(xvec, gvec) > 1 else 1, **_launch_opts(tile),
        )  # fmt: skip
