"""Test data for the MoE checks: expert weights and routed tokens whose per-expert amax differ.

Everything is drawn on the CPU from one explicit ``torch.Generator`` seeded with
``cases.inputs.seed_for_id(case_id, seed) = (seed + crc32(case_id)) mod 2**63``, then moved to the device, so the data are
the same on every device and independent of test order.

* Weights: expert ``i`` is ``randn(out, in) * c_i`` with scales ``c_i`` from ``_spread(n, -3, 1)``
  (a ~32x spread, no two a power of two apart, shuffled) plus one planted outlier
  ``±PLANT * c_i`` at a random position; biases ``randn * 0.1``.
* Routing: ``calib_splits`` (two calibration batches) leave the experts in ``empty`` without
  tokens; ``all_splits`` routes at least one token to every expert (the calibration-empty ones
  included), to show what their defined amax (0) does.
* Tokens: ``randn(T, in)`` with the rows routed to expert ``i`` scaled by ``d_i`` from
  ``_spread(n, -1, 2)``; in the calibration batches the first row of every routed expert
  carries a planted outlier ``±PLANT * d_i``.

The planted outliers make every amax ``RNE_bf16(PLANT * scale_i)`` (randn stays below ``PLANT``
standard deviations), so the experts' amax have pairwise distinct mantissas (N <= 128).  Without
them two bf16 maxima of random data collided at N=16, and evenly spaced integer exponents made
FP8 blind to the amax differences at N=4 (both caught by the ``data/*_amax_differ`` rows).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ExpertShape:
    """One expert layer's geometry: ``N`` experts ``[out, in]``, ``tokens`` per batch, dtype, bias."""

    num_experts: int
    out_features: int
    in_features: int
    tokens: int
    dtype: torch.dtype = torch.bfloat16
    bias: bool = True

    def __post_init__(self) -> None:
        if self.num_experts < 3:
            raise ValueError(f"num_experts must be >= 3 (two routed experts and an empty one), got {self.num_experts}")
        if self.tokens < 2 * self.num_experts:
            raise ValueError(f"tokens must be >= 2*num_experts, got {self.tokens} for N={self.num_experts}")

    @property
    def id(self) -> str:
        return f"N{self.num_experts}/{self.out_features}x{self.in_features}"

    @property
    def empty(self) -> tuple[int, ...]:
        """Experts that receive no tokens during calibration: expert 1 and, for N >= 6, expert N-2."""
        return (1,) if self.num_experts < 6 else (1, self.num_experts - 2)


@dataclass(frozen=True)
class ExpertData:
    """Weights, biases and routed batches of one case (all on one device)."""

    weights: list[torch.Tensor]
    biases: list[torch.Tensor] | None
    calib: list[tuple[torch.Tensor, list[int]]]
    routings: dict[str, tuple[torch.Tensor, list[int]]]
    grad_out: dict[str, torch.Tensor]


PLANT = 8.0
"""Planted outlier magnitude in units of an expert's scale (P(|randn| > 8) ~ 1e-15)."""


def _plant(t: torch.Tensor, row: int, value: float, g: torch.Generator) -> None:
    """Set one random element of ``t[row]`` (fp32) to ``±value`` in place."""
    col = int(torch.randint(0, t.shape[1], (1,), generator=g))
    sign = 1.0 if bool(torch.randint(0, 2, (1,), generator=g)) else -1.0
    t[row, col] = sign * value


def _spread(n: int, lo: int, hi: int, g: torch.Generator) -> torch.Tensor:
    """N distinct scales ``2**k_i * m_i`` in shuffled order.

    ``k_i``: integers spread over ``[lo, hi]``; ``m_i = 1 + (i + 1/4) / n`` in ``[1, 2)``: pairwise
    distinct bf16 mantissas for ``n <= 128``, so no two scales differ by a power of two (a
    power-of-two amax change is invisible to FP8 and NVFP4, ``compare.POWER_OF_TWO_BLIND``).
    """
    if n > 128:
        raise ValueError(f"at most 128 experts have distinct bf16 mantissas, got {n}")
    i = torch.arange(n, dtype=torch.float64)
    k = lo + torch.floor(i * (hi - lo + 1) / n)
    m = 1.0 + (i + 0.25) / n
    return (torch.pow(2.0, k) * m)[torch.randperm(n, generator=g)].to(torch.float32)


def _splits(n: int, tokens: int, empty: tuple[int, ...], g: torch.Generator) -> list[int]:
    routed = [i for i in range(n) if i not in empty]
    counts = [0] * n
    for i in routed:
        counts[i] = 1
    extra = torch.randint(0, len(routed), (tokens - len(routed),), generator=g)
    for j in extra.tolist():
        counts[routed[j]] += 1
    return counts


def _tokens(splits: list[int], in_features: int, scales: torch.Tensor, dtype: torch.dtype, g: torch.Generator, *, plant: bool) -> torch.Tensor:
    x = torch.randn(sum(splits), in_features, generator=g)
    x *= torch.repeat_interleave(scales, torch.tensor(splits))[:, None]
    if plant:
        start = 0
        for k, m in enumerate(splits):
            if m:
                _plant(x, start, PLANT * float(scales[k]), g)
            start += m
    return x.to(dtype)


def _weight(out: int, inp: int, scale: float, dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    w = torch.randn(out, inp, generator=g) * scale
    _plant(w, int(torch.randint(0, out, (1,), generator=g)), PLANT * scale, g)
    return w.to(dtype)


def make_expert_data(shape: ExpertShape, seed: int, device: torch.device | str = "cpu") -> ExpertData:
    """Deterministic data for ``shape`` from ``seed`` (see module docstring)."""
    g = torch.Generator().manual_seed(seed)
    n, o, i = shape.num_experts, shape.out_features, shape.in_features
    w_scale = _spread(n, -3, 1, g)
    weights = [_weight(o, i, float(w_scale[k]), shape.dtype, g) for k in range(n)]
    biases = [(torch.randn(o, generator=g) * 0.1).to(shape.dtype) for _ in range(n)] if shape.bias else None
    x_scale = _spread(n, -1, 2, g)
    calib = []
    for _ in range(2):
        s = _splits(n, shape.tokens, shape.empty, g)
        calib.append((_tokens(s, i, x_scale, shape.dtype, g, plant=True), s))
    all_s = _splits(n, shape.tokens, (), g)
    routings = {"calib": calib[0], "all_routed": (_tokens(all_s, i, x_scale, shape.dtype, g, plant=False), all_s)}
    grad_out = {k: torch.randn(sum(s), o, generator=g).to(shape.dtype) for k, (_, s) in routings.items()}
    dev = torch.device(device)
    mv = lambda t: t.to(dev)  # noqa: E731
    return ExpertData(
        weights=[mv(w) for w in weights],
        biases=[mv(b) for b in biases] if biases is not None else None,
        calib=[(mv(x), s) for x, s in calib],
        routings={k: (mv(x), s) for k, (x, s) in routings.items()},
        grad_out={k: mv(v) for k, v in grad_out.items()},
    )
