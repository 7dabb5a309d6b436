"""The inputs of a variant match, as cases: expert tensors, their amax, and what to show per element.

* ``all_bf16``             -- all 65,536 bf16 bit patterns, one expert ``[256, 256]`` per amax:
  the named edge amax (``probes.edge_amax``) and constructed amax where the reference variants
  disagree (``split_amax``);
* ``near_tie/per_tensor``  -- constructed near-tie rows (``probes.near_ties``), one expert
  ``[1, 6]`` per amax;
* ``near_tie/per_channel`` -- the same rows as one expert ``[M, 6]`` with a per-channel amax;
* ``blocks`` (NVFP4 only)  -- all finite bf16 patterns with ``|x| <= 256``, rows of 64, for the
  data's max, twice it, and 1.0 as global amax;
* ``scale_pairs`` (NVFP4)  -- fp32 blocks built around constructed (global amax ``g``, block amax)
  pairs, 3 in 4 of them pairs whose E4M3 block scale differs by an fp32 ulp between the FP8
  ``cuda`` and ``reciprocal`` cores (``reference.nvfp4.static_block_scales``): fp32 outputs show
  the block scale's last bit;
* ``e2m1_ties`` (NVFP4)    -- fp32 blocks whose ``|x| / block scale`` is *exactly* an E2M1 tie
  (``.25 .75 1.25 1.75 2.5 3.5 5``) in IEEE arithmetic: ``g = 2688 * 2**k`` makes the block scale
  ``E * 2**k`` for every E4M3 value ``E`` (block amax ``6 E 2**k``), so each tie ``t E 2**k`` is
  exact; each block ends in ``-0.0``.  It holds the probe ``g = 2688``, block amax 5.625,
  ``x = 4.6875`` (``reference.nvfp4.nvfp4_tie_probe``);
* ``te_dequant`` (NVFP4)   -- calibrated bf16 experts (``amax == max|x|``, TE's own amax) where
  TE's C++ dequantization order (``te``) and a GEMM's ``RN(RN(q*ds8)*gd)`` part: ``TE_DEQUANT_EXPERTS`` experts ``[128, 128]``
  of random blocks at magnitudes ``1e-3 .. 1e3`` (every other one with a global amax ``c 2**k``,
  ``c`` in ``TE_DEQUANT_AMAX_ODD``, where more exact results are bf16 ties), plus the expert
  ``[2, 16]`` ``[[2.625, 9.875, 0...], [18.375, 0...]]`` whose results 2.4609375 and 9.84375 are exact
  bf16 ties (``te`` lands an fp32 ulp below them and rounds down);
* ``fp32``                 -- random fp32 inputs ``[256, 256]``, per-channel random amax: fp32
  outputs show every fp32 op-order difference that bf16 rounding hides (INT, FP8);
* MX and other formats whose scales come from the data (``amax=None``; blocks of ``B`` along
  in-features, ``B`` the format's tile size), ``mx_cases`` (the INT ones, ``int4_group``:
  ``int_group_cases.int_group_cases``, finite groups):

  - ``blocks/all_bf16``: all 65,536 bf16 patterns in bit order, ``B`` to a block (blocks of
    denormals, of zeros, of Inf and of NaN included), then ``MX_SHUFFLES`` seeded permutations of them;
  - ``blocks/boundaries`` (bf16 and ``blocks/boundaries_fp32``): for every binade ``e`` of the input
    dtype, blocks whose amax is exactly a scale boundary and one input ulp either side: ``2**e``, the
    element maximum times ``2**e`` (448 / 6: the rounded-reciprocal and division rules), and the
    mantissa-rounding edge of the ``even`` rule (``(2 - 2**-m) 2**e``, ``m`` the element's mantissa
    bits); the other ``B - 1`` elements random below the amax, the amax at a random position and sign;
  - ``blocks/special``: zero and ``-0`` blocks, blocks holding one ``+-inf`` or NaN among finite
    values, all-Inf blocks, blocks of bf16 denormals, blocks at amax ``2**-127`` and below;
  - ``blocks/random`` (bf16) and ``blocks/random_fp32``: ``randn`` blocks at magnitudes
    ``2**U(-140, 127)``;
* ``calibrated``           -- one expert per bf16 amax ``m``: every finite bf16 ``|x| <= m``,
  zero-padded to ``[16k, 16]``, so ``amax == max|x|`` exactly as max calibration gives it.  With
  ``calibrated_tiny`` (and NVFP4's ``te_dequant``) the only cases for a backend that takes its amax from the data (its
  ``calibrated_only`` formats);
* ``calibrated_tiny``      -- the same for the tiny amax ``TINY_CALIBRATED_AMAX`` (``<= 2**-24``,
  one just above it, and an all-zero expert): the domain where "amax <= 2**-24 is 1" rules
  (FP8/INT ``cuda``) and plain ``448 / amax`` scales (Transformer Engine current scaling) part.
"""

from __future__ import annotations

import math

import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.equality import same_bits
from moe_fq_parity.reference.constants import E2M1_GRID, NVFP4_BLOCK, NVFP4_GLOBAL_SCALE_NUM
from moe_fq_parity.reference.nvfp4 import static_block_scales

from . import probes
from .case_parts import Case, blocks_below, make_block_case, make_case, neighbours
from .int_group_cases import int_group_cases

NVFP4_WINDOW = 256.0
"""``blocks`` case: finite bf16 values with ``|x| <= 256`` (2**8)."""

CALIBRATED_AMAX = (1.0, 0.875, 448.0)
"""Named amax of the ``calibrated`` case (bf16 values; FP8 scales 448, 512, 1 are exact)."""

TINY_CALIBRATED_AMAX = (0.0, 2.0**-133, 2.0**-126, 2.0**-100, 2.0**-30, 2.0**-25, 2.0**-24, 2.0**-24 * (1 + 2.0**-7))
"""Amax of the ``calibrated_tiny`` case (bf16 values): zero (an all-zero expert, ``-0.0`` included),
the smallest bf16 subnormal, the fp32 normal minimum, ``2**-100`` (``448 / amax`` overflows fp32 below
``448 / FP32_MAX`` ~ ``1.3e-36``, so ``2**-126`` and ``2**-133`` scale by ``FP32_MAX`` in TE),
``2**-30``, ``2**-25``, the boundary ``2**-24`` itself and the next bf16 above it."""

NVFP4_PAIRS = (8, 256)
"""``scale_pairs``: experts (one global amax each) x blocks per expert."""
NVFP4_TIE_K = (-3, -2, -1, 0, 1, 2, 3)
"""``e2m1_ties``: one expert per global amax ``2688 * 2**k``."""
MX_SHUFFLES = 7
"""``blocks/all_bf16``: seeded permutations of the bf16 patterns after the one in bit order."""
MX_RANDOM_BLOCKS = 8192
"""``blocks/random``, ``blocks/random_fp32``: blocks per case."""
TE_DEQUANT_EXPERTS = 20
"""``te_dequant``: random experts ``[128, 128]`` (with the tie expert: 327,712 elements)."""
TE_DEQUANT_AMAX_ODD = (21, 63, 147, 189)
"""``te_dequant``: odd multiples of 21 = 2688 / 2**7 (``c 2**k``, 5-8 significant bits: bf16 values)."""


def _boundary_amax(dtype: torch.dtype, elem_max: float, mbits: int) -> torch.Tensor:
    """Every binade's scale boundaries (see the module docstring) and their neighbours in ``dtype``."""
    lo = -133 if dtype == torch.bfloat16 else -149
    e = torch.arange(lo, 128, dtype=torch.float64)
    edges = torch.cat([2.0**e, elem_max * 2.0**e, (2 - 2.0**-mbits) * 2.0**e])
    edges = edges[(edges < torch.finfo(dtype).max) & (edges >= 2.0**lo)]
    return neighbours(edges.to(torch.float32), dtype)


def mx_cases(fmt: str, *, seed: int = 0, shuffles: int = MX_SHUFFLES, random_blocks: int = MX_RANDOM_BLOCKS) -> list[Case]:
    """The cases of a format whose scales come from the data (module docstring), on 1 x ``B`` blocks;
    ``shuffles`` permutations in ``blocks/all_bf16`` and ``random_blocks`` blocks in each random case
    (a multiple of 8; the section sizes them per suite)."""
    spec = reference.format_spec(fmt)
    block = spec.tiles.size
    mbits, elem_max = spec.grid.mantissa_bits, float(spec.grid.max_value)
    gen = probes.generator(seed, f"blocks/{fmt}")
    every = probes.all_bf16()
    perms = [every] + [every[torch.randperm(every.numel(), generator=gen)] for _ in range(shuffles)]
    cases = [make_block_case("blocks/all_bf16", [p.reshape(-1, 256) for p in perms], block)]
    for dtype, name in ((torch.bfloat16, "blocks/boundaries"), (torch.float32, "blocks/boundaries_fp32")):
        amax = _boundary_amax(dtype, elem_max, mbits)
        rows = blocks_below(amax, block, dtype, gen)
        cases.append(make_block_case(name, [rows.reshape(-1, 8 * block) if rows.shape[0] % 8 == 0 else rows.reshape(-1, block)], block))
    cases.append(make_block_case("blocks/special", [_special_blocks(block, gen)], block))
    for dtype, name in ((torch.bfloat16, "blocks/random"), (torch.float32, "blocks/random_fp32")):
        mag = torch.exp2(torch.randint(-140, 128, (random_blocks, 1), generator=gen).to(torch.float32))
        rows = (torch.randn(random_blocks, block, generator=gen) * mag).to(dtype)
        cases.append(make_block_case(name, [rows.reshape(-1, 8 * block)], block))
    return cases


def _special_blocks(block: int, gen: torch.Generator) -> torch.Tensor:
    """``blocks/special`` rows (bf16): see the module docstring."""
    inf, nan = float("inf"), float("nan")
    base = blocks_below(torch.tensor([1.0, 448.0, 2.0**-120, 3.0e38]), block, torch.bfloat16, gen)
    rows = [torch.zeros(block, dtype=torch.bfloat16), torch.full((block,), -0.0, dtype=torch.bfloat16),
            torch.full((block,), inf, dtype=torch.bfloat16), torch.full((block,), -inf, dtype=torch.bfloat16)]
    for r in base:
        for special in (inf, -inf, nan):
            for pos in (0, block - 1):
                row = r.clone()
                row[pos] = special
                rows.append(row)
    sub = probes.all_bf16(finite_only=True)
    sub = sub[(sub.to(torch.float32).abs() < 2.0**-126) & (sub.to(torch.float32) != 0)]
    sub = torch.cat([sub, sub.new_zeros((-sub.numel()) % block)])
    tiny = blocks_below(torch.exp2(torch.arange(-133, -115, dtype=torch.float32)), block, torch.bfloat16, gen)
    return torch.cat([torch.stack(rows), sub.reshape(-1, block), tiny])


def split_amax(fmt: str, ties: probes.NearTies, count: int, **options) -> torch.Tensor:
    """Up to ``count`` constructed amax whose near-tie row the reference variants disagree on,
    one per construction kind first (input/output tie, ulp offset), then in order."""
    outs = [reference.fake_quant(ties.x, ties.amax, fmt, v, **options) for v in reference.variants(fmt)]
    differ = torch.zeros(len(ties), dtype=torch.bool)
    for o in outs[1:]:
        same = same_bits(outs[0], o)
        differ |= ~same.all(dim=1)
    idx = torch.nonzero(differ).reshape(-1).tolist()
    first, seen = [], set()
    for i in idx:
        if ties.kind[i] not in seen:
            seen.add(ties.kind[i])
            first.append(i)
    picked = (first + [i for i in idx if i not in set(first)])[:count]
    return ties.amax[torch.tensor(picked, dtype=torch.long)]


def all_bf16_case(fmt: str, ties: probes.NearTies, n_split: int, **options) -> Case:
    """``all_bf16``: every pattern for the edge amax and ``n_split`` variant-splitting amax."""
    edge = torch.tensor(list(probes.edge_amax().values()), dtype=torch.float32)
    amax = torch.cat([edge, split_amax(fmt, ties, n_split, **options)])
    x = probes.all_bf16().reshape(256, 256)
    n = amax.numel()
    return make_case("all_bf16", [x] * n, amax, x.expand(n, -1, -1), amax)


def near_tie_cases(ties: probes.NearTies) -> list[Case]:
    """``near_tie/per_tensor`` and ``near_tie/per_channel`` over the same rows."""
    rows = [ties.x[i : i + 1] for i in range(len(ties))]
    return [
        make_case("near_tie/per_tensor", rows, ties.amax, ties.x, ties.amax),
        make_case("near_tie/per_channel", [ties.x], ties.amax.reshape(1, -1), ties.x, ties.amax),
    ]


def nvfp4_blocks_case() -> Case:
    """``blocks`` (NVFP4): see the module docstring."""
    x = probes.all_bf16(finite_only=True)
    x = x[x.to(torch.float32).abs() <= NVFP4_WINDOW]
    width = 64
    x = torch.cat([x, torch.zeros((-x.numel()) % width, dtype=x.dtype)]).reshape(-1, width)
    top = float(x.to(torch.float32).abs().max())
    amax = torch.tensor([top, 2 * top, 1.0], dtype=torch.float32)
    n = amax.numel()
    return make_case("blocks", [x] * n, amax, x.expand(n, -1, -1), amax)


def fp32_case(fmt: str, *, seed: int = 0) -> Case:
    """``fp32``: ``randn * 3`` in fp32, one row per amax drawn from ``[0.01, 6.01)``."""
    gen = probes.generator(seed, f"fp32/{fmt}")
    x = torch.randn(256, 256, generator=gen) * 3
    amax = torch.rand(1, 256, generator=gen) * 6 + 0.01
    return make_case("fp32", [x], amax, x, amax.reshape(-1))


def _reciprocal_block_scales(bamax: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Block scales through the FP8 ``reciprocal`` core instead of ``cuda`` (the alternative the
    ``scale_pairs`` case separates ``modelopt_static`` from)."""
    sixth = torch.reciprocal(torch.tensor(6.0))
    return reference.fake_quant(bamax * sixth, g * sixth, "fp8_e4m3", "reciprocal")


def nvfp4_scale_pairs_case(*, seed: int = 0) -> Case:
    """``scale_pairs`` (NVFP4): see the module docstring.  Expert ``i`` is ``[16, 256]`` fp32 (256
    blocks) with global amax ``g_i`` (fp32, ``2**-6 .. 2**10``); block ``j`` has max ``bamax_ij``
    (``g_i * u``, ``u`` in ``(2**-9, 1]``) at a random position and sign, the rest ``bamax * r``,
    ``r`` uniform in ``[-1, 1]``."""
    gen = probes.generator(seed, "nvfp4/scale_pairs")
    n_exp, n_blocks = NVFP4_PAIRS
    weights, amax = [], []
    for _ in range(n_exp):
        g = torch.exp2(torch.randint(-6, 10, (), generator=gen).float()) * (1 + torch.rand((), generator=gen))
        cand = g * (torch.rand(8 * n_blocks, generator=gen) * (1 - 2.0**-9) + 2.0**-9)
        differ = static_block_scales(cand, g) != _reciprocal_block_scales(cand, g.reshape(1))
        split, rest = cand[differ], cand[~differ]
        k = max(min(split.numel(), 3 * n_blocks // 4), n_blocks - rest.numel())
        bamax = torch.cat([split[:k], rest[: n_blocks - k]])
        blocks = bamax[:, None] * (torch.rand(n_blocks, NVFP4_BLOCK, generator=gen) * 2 - 1)
        where = torch.randint(0, NVFP4_BLOCK, (n_blocks,), generator=gen)
        sign = torch.where(torch.rand(n_blocks, generator=gen) < 0.5, -1.0, 1.0)
        blocks[torch.arange(n_blocks), where] = bamax * sign
        weights.append(blocks.reshape(16, -1).contiguous())
        amax.append(g)
    a = torch.stack(amax).to(torch.float32)
    return make_case("scale_pairs", weights, a, torch.stack(weights), a)


def e4m3_values() -> torch.Tensor:
    """Every positive finite E4M3 value (fp32), subnormals included: 126 values ``2**-9 .. 448``."""
    sub = torch.arange(1, 8, dtype=torch.float32) * 2.0**-9
    normal = torch.tensor([(1 + m / 8) * 2.0**e for e in range(-6, 9) for m in range(8)], dtype=torch.float32)
    return torch.cat([sub, normal[normal <= 448.0]])


def nvfp4_ties_case() -> Case:
    """``e2m1_ties`` (NVFP4): see the module docstring.  Block ``E`` of the expert with
    ``g = 2688 * 2**k``: ``[6 E 2**k, +-t E 2**k for the 7 ties t, -0.0]``; 126 E4M3 values ``E``
    plus two zero blocks make ``[8, 256]`` fp32 per expert."""
    mids = torch.tensor(E2M1_GRID, dtype=torch.float32)
    mids = (mids[1:] + mids[:-1]) / 2
    e = e4m3_values()
    weights, amax = [], []
    for k in NVFP4_TIE_K:
        p = 2.0**k
        blocks = torch.cat([(6 * e * p)[:, None], mids[None, :] * e[:, None] * p, -mids[None, :] * e[:, None] * p,
                            torch.full((e.numel(), 1), -0.0)], dim=1)
        blocks = torch.cat([blocks, torch.zeros(128 - e.numel(), NVFP4_BLOCK)])
        weights.append(blocks.reshape(8, 256).contiguous())
        amax.append(NVFP4_GLOBAL_SCALE_NUM * p)
    a = torch.tensor(amax, dtype=torch.float32)
    return make_case("e2m1_ties", weights, a, torch.stack(weights), a)


def nvfp4_te_dequant_case(*, seed: int = 0) -> Case:
    """``te_dequant`` (NVFP4): see the module docstring.  Expert ``i`` has magnitude
    ``10**(-3 + 6 i / 19)``, each block ``randn * 10**U(-1, 0)`` of it; odd ``i`` get their largest
    element replaced by ``+-c 2**k`` just above the old max, so the expert's amax is that value."""
    gen = probes.generator(seed, "nvfp4/te_dequant")
    weights = []
    for i in range(TE_DEQUANT_EXPERTS):
        mag = 10.0 ** (-3 + 6 * i / (TE_DEQUANT_EXPERTS - 1))
        blocks = torch.randn(128 * 8, NVFP4_BLOCK, generator=gen) * (mag * 10.0 ** -torch.rand(128 * 8, 1, generator=gen))
        w = blocks.reshape(128, 128).to(torch.bfloat16)
        if i % 2:
            flat = w.reshape(-1)
            top = int(flat.to(torch.float32).abs().argmax())
            c = TE_DEQUANT_AMAX_ODD[(i // 2) % len(TE_DEQUANT_AMAX_ODD)]
            k = math.floor(math.log2(float(flat[top].abs()) / c)) + 1
            flat[top] = math.copysign(c * 2.0**k, float(flat[top]))
        weights.append(w)
    tie = torch.zeros(2, NVFP4_BLOCK, dtype=torch.bfloat16)
    tie[0, 0], tie[0, 1], tie[1, 0] = 2.625, 9.875, 18.375
    weights.append(tie)
    amax = torch.stack([w.to(torch.float32).abs().amax() for w in weights])
    return make_case("te_dequant", weights, amax)


def calibrated_case(fmt: str, *, seed: int = 0, n_split: int = 4, **options) -> Case:
    """``calibrated``: ``CALIBRATED_AMAX`` plus up to ``n_split`` seeded random bf16 amax in
    ``[2**-8, 2**8]`` at which the reference variants' pre-round value of ``x = amax`` differ
    (i.e. their scales differ; NVFP4: the first ``n_split`` candidates)."""
    gen = probes.generator(seed, f"calibrated/{fmt}")
    cand = probes.all_bf16(finite_only=True)
    cf = cand.to(torch.float32)
    cand = cand[(cf >= 2.0**-8) & (cf <= 2.0**8)]
    cand = cand[torch.randperm(cand.numel(), generator=gen)[:256]]
    if reference.format_spec(fmt).block is not None:  # two-level block scales: any amax splits the variants' block scales
        picked = cand[:n_split]
    else:
        col, a = cand.reshape(-1, 1), cand.to(torch.float32)
        pre = [reference.fake_quant_traced(col, a, fmt, v, **options).pre_round.reshape(-1) for v in reference.variants(fmt)]
        differ = torch.zeros(cand.numel(), dtype=torch.bool)
        for p in pre[1:]:
            differ |= p != pre[0]
        picked = cand[differ][:n_split]
    values = torch.cat([torch.tensor(CALIBRATED_AMAX, dtype=torch.bfloat16), picked]).to(torch.float32)
    return _calibrated("calibrated", values)


def _calibrated(name: str, values: torch.Tensor) -> Case:
    """One expert per amax ``m``: every finite bf16 ``|x| <= m`` (``+-0`` included), zero-padded to ``[16k, 16]``."""
    every = probes.all_bf16(finite_only=True)
    weights = []
    for m in values.tolist():
        x = every[every.to(torch.float32).abs() <= m]
        weights.append(torch.cat([x, torch.zeros((-x.numel()) % 256, dtype=x.dtype)]).reshape(-1, 16))
    return make_case(name, weights, values)


def calibrated_tiny_case() -> Case:
    """``calibrated_tiny``: ``TINY_CALIBRATED_AMAX``, each the exact max of its expert."""
    values = torch.tensor(TINY_CALIBRATED_AMAX, dtype=torch.float32)
    assert torch.equal(values.to(torch.bfloat16).to(torch.float32), values)
    return _calibrated("calibrated_tiny", values)


def build_cases(
    fmt: str, *, seed: int = 0, n_ties: int = 200, n_split: int = 4, calibrated_only: bool = False,
    mx_shuffles: int = MX_SHUFFLES, mx_random_blocks: int = MX_RANDOM_BLOCKS, **options
) -> list[Case]:
    """The cases of the module docstring for ``fmt``; ``calibrated_only``: the two calibrated cases alone.

    * ``seed``: construction seed (``probes.generator``);
    * ``n_ties``: near-tie constructions (each at 5 amax ulp offsets);
    * ``n_split``: variant-splitting amax added to ``all_bf16`` and ``calibrated``;
    * ``mx_shuffles``, ``mx_random_blocks``: ``mx_cases``' sizes (formats without amax);
    * ``options``: format options, as the reference takes them (they decide the splits).
    """
    if not reference.format_spec(fmt).takes_amax:
        block_cases = int_group_cases if reference.format_spec(fmt).is_int else mx_cases
        return block_cases(fmt, seed=seed, shuffles=mx_shuffles, random_blocks=mx_random_blocks)
    block_scaled = reference.format_spec(fmt).block is not None
    calibrated = [calibrated_case(fmt, seed=seed, n_split=n_split, **options), calibrated_tiny_case()]
    if block_scaled:
        calibrated.append(nvfp4_te_dequant_case(seed=seed))
    if calibrated_only:
        return calibrated
    if block_scaled:
        return [nvfp4_blocks_case(), nvfp4_scale_pairs_case(seed=seed), nvfp4_ties_case(), *calibrated]
    ties = probes.near_ties(fmt, n_ties, seed=seed)
    return [all_bf16_case(fmt, ties, n_split, **options), *near_tie_cases(ties), fp32_case(fmt, seed=seed), *calibrated]
