"""What the benchmark times: model shapes (from ``cases/shapes.py``), expert counts, the order of
the cases, the format columns, and the seeded expert weights."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import torch

from moe_fq_parity.cases.shapes import N_VALUES, NEMOTRON, ULTRA_PRODUCTION, WIDE_ACCEPTANCE
from moe_fq_parity.kernels.formats import AMAX_FORMATS, DEFAULT_VARIANTS, FORMATS as KERNEL_FORMATS
from moe_fq_parity.reference.formats import format_spec

SHAPES: dict[str, tuple[int, int]] = {f"{model}_fc1": NEMOTRON[model]["fc1"] for model in ("nano", "super", "ultra")}
"""The timed routed-expert shapes (fc1 of Nemotron 3 Nano / Super / Ultra)."""
EXPERT_COUNTS: tuple[int, ...] = N_VALUES
PRODUCTION: tuple[str, int, tuple[int, int]] = ("ultra_prod", *ULTRA_PRODUCTION)
"""``(name, N, shape)`` of the Ultra production case."""
WIDE: tuple[str, int, tuple[int, int]] = (f"wide_{WIDE_ACCEPTANCE[1][0]}x{WIDE_ACCEPTANCE[1][1]}", *WIDE_ACCEPTANCE)

FIRST = (("ultra_prod", 32), ("wide_1024x2048", 128), ("super_fc1", 64), ("nano_fc1", 8))
"""Timed first (partial results are written after every case): the production case and the
acceptance cases N=128 x [1024, 2048], N=64 x Super fc1, N=8 x Nano fc1."""


BENCH_OPTIONS = ("tile_2d", "fp32_scale")
"""Options that select kernel code of their own (square 2D tiles, fp32 tile scales): each format
that takes one is also timed with it set."""


@dataclass(frozen=True)
class BenchFormat:
    """One timed column: a kernel format (its default variant) with ``options``; ``key`` as a case id
    writes it (``fp8_block+2d``)."""

    key: str
    fmt: str
    options: dict[str, Any] = field(default_factory=dict, hash=False)

    @property
    def takes_amax(self) -> bool:
        return self.fmt in AMAX_FORMATS

    def amax(self, amax: torch.Tensor) -> Optional[torch.Tensor]:
        """What the public call and the reference take: ``amax``, or ``None`` where the scales come from the data."""
        return amax if self.takes_amax else None


def bench_formats() -> tuple[BenchFormat, ...]:
    """Every kernel format with its default options, then with each of ``BENCH_OPTIONS`` it takes."""
    out = []
    for fmt in KERNEL_FORMATS:
        out.append(BenchFormat(fmt, fmt))
        spec = format_spec(fmt)
        for name in BENCH_OPTIONS:
            opt = spec.option(name)
            if opt is not None and (opt.variants is None or DEFAULT_VARIANTS[fmt] in opt.variants):
                out.append(BenchFormat(f"{fmt}+{opt.code}", fmt, {name: True}))
    return tuple(out)


FORMATS: tuple[BenchFormat, ...] = bench_formats()
"""The timed columns, amax formats first."""
BY_KEY: dict[str, BenchFormat] = {b.key: b for b in FORMATS}


def case_list(quick: bool) -> list[tuple[str, int, tuple[int, int]]]:
    """``(name, N, shape)`` of every case, the ``FIRST`` ones first; ``quick``: Ultra fc1 at N in
    {4, 32, 128} plus the wide and production cases."""
    counts = (4, 32, 128) if quick else EXPERT_COUNTS
    shapes = {"ultra_fc1": SHAPES["ultra_fc1"]} if quick else SHAPES
    cases = [(f"{name}/N{n}", n, shape) for name, shape in shapes.items() for n in counts]
    cases += [(f"{WIDE[0]}/N{WIDE[1]}", WIDE[1], WIDE[2]), (f"{PRODUCTION[0]}/N{PRODUCTION[1]}", PRODUCTION[1], PRODUCTION[2])]
    first = [c for key in FIRST for c in cases if c[0] == f"{key[0]}/N{key[1]}"]
    return first + [c for c in cases if c not in first]


def make_experts(n: int, shape: tuple[int, int], seed: int, device: str = "cuda") -> tuple[list[torch.Tensor], torch.Tensor]:
    """N bf16 experts with per-expert scales (so per-expert amax differ) and amax = 0.9 max|w|."""
    g = torch.Generator(device=device).manual_seed(seed)
    scales = torch.logspace(-2, 0, max(n, 1), device=device)
    ws = [(torch.randn(shape, device=device, generator=g) * scales[i]).to(torch.bfloat16) for i in range(n)]
    amax = torch.stack([w.float().abs().amax() for w in ws]) * 0.9
    return ws, amax
