"""The inputs of a variant match, as cases: expert tensors, their amax, and what to show per element.

* ``all_bf16``             -- all 65,536 bf16 bit patterns, one expert ``[256, 256]`` per amax:
  the named edge amax (``probes.edge_amax``) and constructed amax where the reference variants
  disagree (``split_amax``);
* ``near_tie/per_tensor``  -- constructed near-tie rows (``probes.near_ties``), one expert
  ``[1, 6]`` per amax;
* ``near_tie/per_channel`` -- the same rows as one expert ``[M, 6]`` with a per-channel amax;
* ``blocks`` (NVFP4 only)  -- all finite bf16 patterns with ``|x| <= 256``, rows of 64, for the
  data's max, twice it, and 1.0 as global amax (no near-tie construction for NVFP4 yet);
* ``fp32``                 -- random fp32 inputs ``[256, 256]``, per-channel random amax: fp32
  outputs show every fp32 op-order difference that bf16 rounding hides (INT, FP8);
* ``calibrated``           -- one expert per bf16 amax ``m``: every finite bf16 ``|x| <= m``,
  zero-padded to ``[16k, 16]``, so ``amax == max|x|`` exactly as max calibration gives it.  The
  only case for a backend that takes its amax from the data (its ``calibrated_only`` formats).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.ulp import bits_equal

from . import probes

NVFP4_WINDOW = 256.0
"""``blocks`` case: finite bf16 values with ``|x| <= 256`` (2**8)."""

CALIBRATED_AMAX = (1.0, 0.875, 448.0)
"""Named amax of the ``calibrated`` case (bf16 values; FP8 scales 448, 512, 1 are exact)."""


@dataclass(frozen=True)
class Case:
    """Inputs of one comparison, all on the CPU."""

    name: str
    weights: list[torch.Tensor]
    amax: torch.Tensor
    """``[N]`` per expert or ``[N, out]`` per channel, as the backend contract takes it."""
    stacked: Optional[torch.Tensor]
    """The same data as one tensor the reference evaluates at once, or ``None`` (then the
    reference runs expert by expert)."""
    stacked_amax: Optional[torch.Tensor]
    elem_amax: torch.Tensor
    """fp32 amax of every element, in the flat order of ``torch.cat([w.reshape(-1) for w in weights])``."""

    @property
    def numel(self) -> int:
        return sum(w.numel() for w in self.weights)

    def flat_input(self) -> torch.Tensor:
        return torch.cat([w.reshape(-1) for w in self.weights])


def make_case(name: str, weights: list[torch.Tensor], amax: torch.Tensor,
              stacked: Optional[torch.Tensor] = None, stacked_amax: Optional[torch.Tensor] = None) -> Case:
    """A ``Case`` with its per-element amax filled in."""
    per = reference.split_expert_amax(weights, amax)
    elem = torch.cat([torch.broadcast_to(a.reshape(-1, 1) if a.dim() else a, w.shape).reshape(-1) for w, a in zip(weights, per)])
    return Case(name, weights, amax, stacked, stacked_amax, elem.to(torch.float32))


def split_amax(fmt: str, ties: probes.NearTies, count: int, **options) -> torch.Tensor:
    """Up to ``count`` constructed amax whose near-tie row the reference variants disagree on,
    one per construction kind first (input/output tie, ulp offset), then in order."""
    outs = [reference.fake_quant(ties.x, ties.amax, fmt, v, **options) for v in reference.variants(fmt)]
    differ = torch.zeros(len(ties), dtype=torch.bool)
    for o in outs[1:]:
        same = bits_equal(o, outs[0]) | (torch.isnan(o) & torch.isnan(outs[0]))
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


def calibrated_case(fmt: str, *, seed: int = 0, n_split: int = 4, **options) -> Case:
    """``calibrated``: ``CALIBRATED_AMAX`` plus up to ``n_split`` seeded random bf16 amax in
    ``[2**-8, 2**8]`` at which the reference variants' pre-round value of ``x = amax`` differ
    (i.e. their scales differ; NVFP4: the first ``n_split`` candidates)."""
    gen = probes.generator(seed, f"calibrated/{fmt}")
    cand = probes.all_bf16(finite_only=True)
    cf = cand.to(torch.float32)
    cand = cand[(cf >= 2.0**-8) & (cf <= 2.0**8)]
    cand = cand[torch.randperm(cand.numel(), generator=gen)[:256]]
    if fmt == "nvfp4":
        picked = cand[:n_split]
    else:
        col, a = cand.reshape(-1, 1), cand.to(torch.float32)
        pre = [reference.fake_quant_traced(col, a, fmt, v, **options).pre_round.reshape(-1) for v in reference.variants(fmt)]
        differ = torch.zeros(cand.numel(), dtype=torch.bool)
        for p in pre[1:]:
            differ |= p != pre[0]
        picked = cand[differ][:n_split]
    values = torch.cat([torch.tensor(CALIBRATED_AMAX, dtype=torch.bfloat16), picked]).to(torch.float32)
    every = probes.all_bf16(finite_only=True)
    weights = []
    for m in values.tolist():
        x = every[every.to(torch.float32).abs() <= m]
        weights.append(torch.cat([x, torch.zeros((-x.numel()) % 256, dtype=x.dtype)]).reshape(-1, 16))
    return make_case("calibrated", weights, values)


def build_cases(
    fmt: str, *, seed: int = 0, n_ties: int = 200, n_split: int = 4, calibrated_only: bool = False, **options
) -> list[Case]:
    """The cases of the module docstring for ``fmt``; ``calibrated_only``: that case alone.

    * ``seed``: construction seed (``probes.generator``);
    * ``n_ties``: near-tie constructions (each at 5 amax ulp offsets);
    * ``n_split``: variant-splitting amax added to ``all_bf16`` and ``calibrated``;
    * ``options``: format options, as the reference takes them (they decide the splits).
    """
    calibrated = calibrated_case(fmt, seed=seed, n_split=n_split, **options)
    if calibrated_only:
        return [calibrated]
    if fmt == "nvfp4":
        return [nvfp4_blocks_case(), calibrated]
    ties = probes.near_ties(fmt, n_ties, seed=seed)
    return [all_bf16_case(fmt, ties, n_split, **options), *near_tie_cases(ties), fp32_case(fmt, seed=seed), calibrated]
