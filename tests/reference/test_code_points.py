"""Every E4M3 and E2M1 code point, and every midpoint between neighbours (ties), named with bits."""

from __future__ import annotations

from fractions import Fraction

import pytest
import torch

from moe_fq_parity.reference.exact import E2M1_POSITIVE, E4M3_POSITIVE, round_to_grid
from moe_fq_parity.reference.rounding import round_to_e2m1, round_to_e4m3

# Named edge cases: (fp32 input bits, expected fp32 output bits) for E4M3.
E4M3_NAMED = {
    "max_finite_448": (0x43E00000, 0x43E00000),
    "464_tie_saturates": (0x43E80000, 0x43E00000),  # midpoint 448|480: no 480 in e4m3fn -> 448
    "inf_saturates": (0x7F800000, 0x43E00000),
    "neg_inf_saturates": (0xFF800000, 0xC3E00000),
    "min_subnormal_2^-9": (0x3B000000, 0x3B000000),
    "half_min_subnormal_ties_to_zero": (0x3A800000, 0x00000000),
    "neg_zero_kept": (0x80000000, 0x80000000),
    "carry_into_exponent_31.6_to_32": (0x41FCCCCD, 0x42000000),  # docs/measured.md §1: interpreter gave 16
    "carry_126.3_to_128": (0x42FC9999, 0x43000000),
}


def _f32(bits: int) -> torch.Tensor:
    return torch.tensor([bits], dtype=torch.int64).to(torch.int32).view(torch.float32)


@pytest.mark.parametrize("name", sorted(E4M3_NAMED))
def test_e4m3_named_edge_cases(name):
    x_bits, want_bits = E4M3_NAMED[name]
    got = round_to_e4m3(_f32(x_bits)).view(torch.int32).item() & 0xFFFFFFFF
    assert got == want_bits, f"{name}: input {x_bits:#010x} gave {got:#010x}, want {want_bits:#010x}"


def _codes_and_midpoints(grid):
    vals = [float(v) for v in grid]
    mids = [float((a + b) / 2) for a, b in zip(grid, grid[1:])]
    return vals, mids


@pytest.mark.parametrize(
    "name,fn,grid", [("e4m3", round_to_e4m3, E4M3_POSITIVE), ("e2m1", round_to_e2m1, E2M1_POSITIVE)]
)
def test_code_points_are_fixed_and_midpoints_tie_to_even(name, fn, grid):
    vals, mids = _codes_and_midpoints(grid)
    failures = []
    for sign in (1.0, -1.0):
        v = torch.tensor([sign * x for x in vals], dtype=torch.float32)
        bad = torch.nonzero(fn(v) != v).reshape(-1).tolist()
        failures += [f"{name} code point {v[i].item()} moved to {fn(v)[i].item()}" for i in bad]
        m = torch.tensor([sign * x for x in mids], dtype=torch.float32)
        want = torch.tensor([float(round_to_grid(sign * g, grid)) for g in [(a + b) / 2 for a, b in zip(grid, grid[1:])]])
        got = fn(m)
        failures += [f"{name} midpoint {m[i].item()} -> {got[i].item()}, want {want[i].item()}" for i in torch.nonzero(got != want).reshape(-1).tolist()]
        # one fp32 ulp either side of every midpoint goes to the nearer neighbour
        for direction in (float("inf"), -float("inf")):
            n = torch.nextafter(m, torch.full_like(m, direction))
            want_n = torch.tensor([float(round_to_grid(Fraction(t), grid)) for t in n.tolist()])
            got_n = fn(n)
            failures += [f"{name} near-midpoint {n[i].item()!r} -> {got_n[i].item()}, want {want_n[i].item()}"
                         for i in torch.nonzero(got_n != want_n).reshape(-1).tolist()]
    assert not failures, "\n".join(failures[:20])


def test_e4m3_matches_torch_cast_inside_range(all_bf16):
    """Within ±448 torch's float8_e4m3fn cast (RNE) is an independent implementation."""
    v = all_bf16.float().reshape(-1)
    v = v[torch.isfinite(v) & (v.abs() <= 448)]
    want = v.to(torch.float8_e4m3fn).float()
    got = round_to_e4m3(v)
    bad = torch.nonzero(got.view(torch.int32) != want.view(torch.int32)).reshape(-1)
    assert bad.numel() == 0, f"{bad.numel()} differ, first {v[bad[0]].item()!r}: {got[bad[0]].item()} vs {want[bad[0]].item()}"


def test_e2m1_matches_threshold_table():
    """Transformer Engine's threshold table (docs/measured.md §5) on a dense sweep of [-7, 7]."""
    v = torch.linspace(-7, 7, 200001, dtype=torch.float32)
    v = torch.cat([v, torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]), -torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])])
    a = v.abs()
    table = torch.where(a <= 0.25, 0.0, torch.where(a < 0.75, 0.5, torch.where(a <= 1.25, 1.0, torch.where(a < 1.75, 1.5,
            torch.where(a <= 2.5, 2.0, torch.where(a < 3.5, 3.0, torch.where(a <= 5.0, 4.0, 6.0)))))))
    want = torch.where(v < 0, -table, table)
    got = round_to_e2m1(v)
    bad = torch.nonzero(got != want).reshape(-1)
    assert bad.numel() == 0, f"{bad.numel()} differ, first {v[bad[0]].item()!r}: {got[bad[0]].item()} vs {want[bad[0]].item()}"
