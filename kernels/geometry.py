"""Host-side layout: validation of expert lists / stacked weights and the launch geometry.

Layout only, no arithmetic.  An expert is viewed as a row-major ``[rows, cols]`` matrix
(``cols`` = last dim, ``rows`` = product of the others); the kernels tile it with ``[BR, BC]``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import gcd
from typing import Sequence

import torch

from moe_fq_parity.reference.granularity import check_input

from .formats import FLOAT_DTYPES

MAX_EXPERTS = 65535  # CUDA grid y-dimension limit: experts are program_id(1)
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class TileShape:
    """``BR x BC`` elements per tile, ``num_warps`` and ``tpp`` tiles per program."""

    br: int
    bc: int
    num_warps: int
    tpp: int = 1


def tiles_per_program(shapes: Sequence[tuple[int, int]], tile: TileShape, max_tpp: int, sms: int | None) -> int:
    """Largest power of two <= ``max_tpp`` that still leaves 16 programs per SM (a small problem
    needs every program it can get to fill the machine; a large one amortises per-program work)."""
    if sms is None:
        return max_tpp
    total = sum((-(-r // tile.br)) * (-(-c // tile.bc)) for r, c in shapes)
    tpp = 1 << (max(max_tpp, 1).bit_length() - 1)
    while tpp > 1 and total // tpp < 16 * sms:
        tpp //= 2
    return tpp


def expert_matrix_shape(w: torch.Tensor) -> tuple[int, int]:
    """``(rows, cols)`` of an expert tensor of shape ``[..., cols]`` (at least 1-D)."""
    cols = int(w.shape[-1])
    rows = int(w.numel() // cols) if cols else int(torch.Size(w.shape[:-1]).numel())
    return rows, cols


_NEG_VIEW = ("is a negated view (negative bit set: torch._neg_view, or .imag of a conjugated complex tensor): "
             "its memory holds the negated values, and the kernel reads memory")


def check_expert_list(weights: Sequence[torch.Tensor], what: str = "weights") -> tuple[torch.dtype, torch.device]:
    """Validate a non-empty list of experts: tensors, >= 1-D, one float dtype, one device, contiguous,
    no negative bit.

    Returns ``(dtype, device)``.  Errors name the offending expert.
    """
    if isinstance(weights, torch.Tensor):
        raise TypeError(f"{what} must be a sequence of tensors (one per expert), got a single tensor")
    first = weights[0]
    for i, w in enumerate(weights):
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{what}[{i}] is a {type(w).__name__}, not a torch.Tensor")
        if w.dim() < 1:
            raise ValueError(f"{what}[{i}] must have at least 1 dimension, got shape {tuple(w.shape)}")
        if w.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{what}[{i}] dtype must be one of {FLOAT_DTYPES}, got {w.dtype}")
        if w.dtype != first.dtype:
            raise ValueError(f"{what}[{i}] has dtype {w.dtype} but {what}[0] has {first.dtype}; one launch needs one dtype")
        if w.device != first.device:
            raise ValueError(f"{what}[{i}] is on {w.device} but {what}[0] is on {first.device}")
        if not w.is_contiguous():
            raise ValueError(f"{what}[{i}] is not contiguous (strides {w.stride()}); pass w.contiguous()")
        if w.is_neg():
            raise ValueError(f"{what}[{i}] {_NEG_VIEW}; pass w.resolve_neg()")
    return first.dtype, first.device


def check_stacked(x: torch.Tensor, what: str = "x") -> None:
    """Validate a single (stacked) tensor: the reference's input rules, plus contiguity and no
    negative bit."""
    check_input(x)
    if not x.is_contiguous():
        raise ValueError(f"{what} is not contiguous (strides {x.stride()}); pass x.contiguous()")
    if x.is_neg():
        raise ValueError(f"{what} {_NEG_VIEW}; pass x.resolve_neg()")


def _pow2_at_most(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)


def choose_tile(
    shapes: Sequence[tuple[int, int]], block: int, num_warps: int, *, min_bc: int, max_waste: float = 0.03, max_bc: int = 2048
) -> TileShape:
    """Pick ``BC`` (power of two, ``min_bc..min(block, max_bc)``) and ``BR = block // BC``.

    ``BC`` is the largest candidate whose padded element count (summed over experts) is within
    ``max_waste`` of the smallest achievable, so rows like 2688 = 21*128 get ``BC = 128`` rather
    than masking a quarter of a 4096-wide tile (masked lanes cost GPU issue slots; under the
    interpreter programs cost far more than lanes, so it passes ``max_waste=inf``).  ``BR`` shrinks
    to the tallest expert (rounded up to a power of two) so tiny experts do not run mostly masked
    programs.
    """
    live = [(r, c) for r, c in shapes if r and c]
    if not live:
        return TileShape(1, min_bc, num_warps)
    cap = max(min_bc, min(block, max_bc))
    candidates = [1 << k for k in range(min_bc.bit_length() - 1, cap.bit_length())]
    padded = {bc: sum(r * (-(-c // bc)) * bc for r, c in live) for bc in candidates}
    best = min(padded.values())
    bc = max(b for b in candidates if padded[b] <= best * (1.0 + max_waste))
    bc = min(bc, max(min_bc, 1 << (max(c for _, c in live) - 1).bit_length()))
    br = max(1, block // bc)
    tallest = max(r for r, _ in live)
    br = min(br, 1 << (tallest - 1).bit_length())
    widest = max(c for _, c in live)
    while br > 1 and br * widest + bc > _INT32_MAX:
        br //= 2
    if br * widest + bc > _INT32_MAX:
        raise ValueError(f"a row of {widest} elements is too long for the kernel's int32 in-tile offsets (max {2**31 - 1 - bc})")
    return TileShape(_pow2_at_most(br), bc, num_warps)


def flat_width(shapes: Sequence[tuple[int, int]], cap: int) -> int:
    """Width ``W`` of the flat view of every expert: the largest power of two <= ``cap`` dividing
    each non-empty expert's element count (0 when that is below 16 or there is no element).

    Where elements are independent of their row (per-expert amax; NVFP4 also needs every row length
    to be a multiple of its 16-element block), an expert ``[rows, cols]`` may be tiled as the
    contiguous ``[rows * cols / W, W]``: the same elements at the same addresses, in wide tiles even
    when the rows are narrow or not a power of two wide (Nano's 2688 = 21 x 128 otherwise gets
    128-wide tiles)."""
    g = 0
    for r, c in shapes:
        g = gcd(g, r * c)
    if g == 0:
        return 0
    w = min(g & -g, cap)
    return w if w >= 16 else 0


def flat_shapes(shapes: Sequence[tuple[int, int]], width: int) -> list[tuple[int, int]]:
    """``shapes`` viewed ``[rows * cols / width, width]`` (``width`` from ``flat_width``)."""
    return [(r * c // width, width) for r, c in shapes]


def with_tpp(tile: TileShape, tpp: int) -> TileShape:
    return replace(tile, tpp=tpp)


def grid_for(shapes: Sequence[tuple[int, int]], tile: TileShape) -> tuple[int, int]:
    """``(cdiv(max tiles per expert, tile.tpp), N)``; ``ValueError`` past the CUDA grid limits."""
    n = len(shapes)
    if n > MAX_EXPERTS:
        raise ValueError(f"at most {MAX_EXPERTS} experts per launch, got {n}")
    if any(r > _INT32_MAX or c > _INT32_MAX for r, c in shapes):
        raise ValueError(f"expert rows and columns must each be below 2**31, got {max(shapes)}")
    tiles = max((-(-r // tile.br)) * (-(-c // tile.bc)) for r, c in shapes)
    if tiles > _INT32_MAX:
        raise ValueError(f"an expert needs {tiles} tiles of {tile.br}x{tile.bc}; the grid allows {_INT32_MAX}")
    return max(-(-tiles // tile.tpp), 1), n
