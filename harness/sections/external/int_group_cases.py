"""The match cases of the INT formats whose scales come from the data (``int4_group``: one scale
``qmax / A`` per group of ``G`` = 128 along in-features, ``A`` the group's amax), for ``variant_match``.

The format rejects NaN and Inf input (``FormatSpec.rejects_nan``: a non-finite group amax has no INT
scale), so every case is finite, as NVFP4's are; a backend's refusal of NaN/Inf is judged by the
forward check (its ``nan`` and ``tile_specials`` cases: "rejected as the spec requires").

* ``groups/all_bf16``: every finite bf16 pattern (65,280, i.e. 510 groups) in bit order -- groups of
  ``-0`` and denormals (tiny amax: the zero-amax rule), of normals of every binade, up to the bf16
  maximum -- then ``shuffles`` seeded permutations of them;
* ``groups/boundaries`` (bf16) and ``groups/boundaries_fp32``: for every binade ``e`` of the input
  dtype, groups whose amax is exactly ``2**e`` or ``qmax * 2**e`` (scale ``qmax / A`` exact, or
  ``2**-e`` exact) and one input ulp either side; ``2**-24`` (the zero-amax boundary, ``<`` vs ``<=``)
  is among them.  The amax sits at a random position and sign, the other ``G - 1`` elements random below it;
* ``groups/special`` (bf16): a ``+0`` group, a ``-0`` group, a mixed ``+-0`` group, groups of
  bf16 denormals, groups at amax ``2**-133 .. 2**-116`` and at the bf16 maximum, and exact-tie
  groups (amax ``qmax * 2**k``, elements ``+-(j + 1/2) 2**k``: ``x * s`` is exactly a half);
* ``groups/partial`` (bf16) and ``groups/partial_fp32``: in-features ``PARTIAL_WIDTHS`` (not multiples
  of ``G``, so the last group of each row is short and zero-padded), rows at magnitudes ``2**U(-30, 30)``,
  one row per expert whose short group is all zero and one whose short group is tiny (``2**-30``);
* ``groups/random`` (bf16), ``groups/random_fp32``, ``groups/random_fp16``: ``randn`` groups at
  magnitudes ``2**U(lo, hi)`` over the dtype's range.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from moe_fq_parity import reference

from . import probes
from .case_parts import Case, blocks_below, neighbours

PARTIAL_WIDTHS = (1, 5, 127, 129, 200, 255, 257, 300)
"""``groups/partial``: in-features of its experts (4 rows each)."""
PARTIAL_ROWS = 4
TIE_BINADES = tuple(range(-20, 21, 4))
"""``groups/special``: the ``k`` of its exact-tie groups (amax ``qmax * 2**k``)."""


def make_group_case(name: str, weights: list[torch.Tensor], group: int) -> Case:
    """A case of amax-less groups: ``elem_amax`` is each element's group amax (``max |x|`` over its
    ``group`` along the last dim; a short last group is zero-padded, which never raises it)."""
    elem = []
    for w in weights:
        x = w.to(torch.float32)
        pad = (-x.shape[-1]) % group
        rows = F.pad(x, (0, pad)).reshape(-1, group)
        a = rows.abs().amax(dim=1, keepdim=True).expand(-1, group).reshape(*x.shape[:-1], -1)
        elem.append(a[..., : x.shape[-1]].reshape(-1))
    return Case(name, weights, None, None, None, torch.cat(elem))


def _rows(rows: torch.Tensor, group: int) -> torch.Tensor:
    """``[n, group]`` rows as experts of 8 groups a row when ``n`` allows it."""
    return rows.reshape(-1, 8 * group) if rows.shape[0] % 8 == 0 else rows.reshape(-1, group)


def _boundary_amax(dtype: torch.dtype, qmax: float) -> torch.Tensor:
    """``2**e`` and ``qmax * 2**e`` for every binade of ``dtype``, and their neighbours in ``dtype``."""
    lo = -133 if dtype == torch.bfloat16 else -149
    e = torch.arange(lo, 128, dtype=torch.float64)
    edges = torch.cat([2.0**e, qmax * 2.0**e])
    edges = edges[(edges < torch.finfo(dtype).max) & (edges >= 2.0**lo)]
    return neighbours(edges.to(torch.float32), dtype)


def _ties(group: int, qmax: float) -> torch.Tensor:
    """Exact-tie groups (bf16): amax ``qmax 2**k`` first, then ``+-(j + 1/2) 2**k`` for ``j < qmax``, cycled."""
    halves = torch.arange(int(qmax), dtype=torch.float32) + 0.5
    body = torch.cat([halves, -halves]).repeat(group)[: group - 1]
    rows = [torch.cat([torch.tensor([qmax]), body]) * 2.0**k for k in TIE_BINADES]
    return torch.stack(rows).to(torch.bfloat16)


def _special(group: int, qmax: float, gen: torch.Generator) -> torch.Tensor:
    zero = torch.zeros(group, dtype=torch.bfloat16)
    mixed = torch.where(torch.rand(group, generator=gen) < 0.5, 0.0, -0.0).to(torch.bfloat16)
    sub = probes.all_bf16(finite_only=True)
    sub = sub[(sub.to(torch.float32).abs() < 2.0**-126) & (sub.to(torch.float32) != 0)]
    sub = torch.cat([sub, sub.new_zeros((-sub.numel()) % group)]).reshape(-1, group)
    tiny = blocks_below(torch.exp2(torch.arange(-133, -115, dtype=torch.float32)), group, torch.bfloat16, gen)
    top = blocks_below(torch.tensor([float(torch.finfo(torch.bfloat16).max)]), group, torch.bfloat16, gen)
    return torch.cat([torch.stack([zero, -zero, mixed]), sub, tiny, top, _ties(group, qmax)])


def _partial(dtype: torch.dtype, group: int, gen: torch.Generator) -> list[torch.Tensor]:
    out = []
    for k in PARTIAL_WIDTHS:
        mag = torch.exp2(torch.randint(-30, 31, (PARTIAL_ROWS, 1), generator=gen).to(torch.float32))
        w = torch.randn(PARTIAL_ROWS, k, generator=gen) * mag
        tail = slice(k - k % group, k)  # the short last group (no width is a multiple of the group)
        w[0, tail] = 0.0
        w[1, tail] = w[1, tail].sign() * 2.0**-30
        out.append(w.to(dtype))
    return out


def _random(n: int, dtype: torch.dtype, group: int, gen: torch.Generator) -> torch.Tensor:
    lo, hi = {torch.bfloat16: (-140, 124), torch.float32: (-140, 124), torch.float16: (-24, 12)}[dtype]  # |randn| < 8: finite
    mag = torch.exp2(torch.randint(lo, hi + 1, (n, 1), generator=gen).to(torch.float32))
    return _rows((torch.randn(n, group, generator=gen) * mag).to(dtype), group)


def int_group_cases(fmt: str, *, seed: int = 0, shuffles: int = 7, random_blocks: int = 8192) -> list[Case]:
    """The cases of the module docstring for ``fmt``; ``shuffles`` permutations in ``groups/all_bf16``
    and ``random_blocks`` groups in each random case (sized per suite as the MX cases are)."""
    spec = reference.format_spec(fmt)
    group, qmax = spec.tiles.size, float(spec.grid.bounds()[1])
    gen = probes.generator(seed, f"groups/{fmt}")
    every = probes.all_bf16(finite_only=True)
    perms = [every] + [every[torch.randperm(every.numel(), generator=gen)] for _ in range(shuffles)]
    cases = [make_group_case("groups/all_bf16", [p.reshape(-1, 2 * group) for p in perms], group)]
    for dtype, name in ((torch.bfloat16, "groups/boundaries"), (torch.float32, "groups/boundaries_fp32")):
        rows = blocks_below(_boundary_amax(dtype, qmax), group, dtype, gen)
        cases.append(make_group_case(name, [_rows(rows, group)], group))
    cases.append(make_group_case("groups/special", [_special(group, qmax, gen)], group))
    for dtype, name in ((torch.bfloat16, "groups/partial"), (torch.float32, "groups/partial_fp32")):
        cases.append(make_group_case(name, _partial(dtype, group, gen), group))
    for dtype, name in ((torch.bfloat16, "groups/random"), (torch.float32, "groups/random_fp32"), (torch.float16, "groups/random_fp16")):
        cases.append(make_group_case(name, [_random(random_blocks, dtype, group, gen)], group))
    return cases
