"""Inputs of the variant match: every bf16 pattern, and near-tie constructions that are near ties."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.sections.external import probes
from moe_fq_parity.harness.core.ulp import near_tie
from moe_fq_parity.reference.constants import TINY_AMAX


def test_all_bf16_is_every_pattern_once_in_bit_order():
    x = probes.all_bf16()
    bits = x.view(torch.int16).to(torch.int32)
    assert x.numel() == 65536 and bits.unique().numel() == 65536
    assert bits[0] == -32768 and bits[-1] == 32767
    finite = probes.all_bf16(finite_only=True)
    assert finite.numel() == 65536 - 2 * (1 + 127)  # per sign: one inf and 127 NaN payloads
    assert bool(torch.isfinite(finite.to(torch.float32)).all())


def test_hex_bits_names_each_pattern():
    assert probes.hex_bits(torch.tensor([1.0, -0.0], dtype=torch.bfloat16)) == ["0x3F80", "0x8000"]
    assert probes.hex_bits(torch.tensor([1.0], dtype=torch.float32)) == ["0x3F800000"]
    with pytest.raises(TypeError):
        probes.hex_bits(torch.tensor([1], dtype=torch.int32))


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3"])
def test_near_ties_are_seeded_valid_and_mostly_on_ties(fmt):
    ties = probes.near_ties(fmt, 60, seed=3)
    assert len(ties) <= 60 * len(probes.ULP_OFFSETS) and len(ties) > 0.9 * 60 * len(probes.ULP_OFFSETS)
    assert bool((ties.amax > TINY_AMAX).all()) and bool(torch.isfinite(ties.amax).all())
    assert ties.x.shape == (len(ties), 6) and ties.x.dtype == torch.bfloat16
    again = probes.near_ties(fmt, 60, seed=3)
    assert torch.equal(again.amax, ties.amax) and torch.equal(again.x.view(torch.int16), ties.x.view(torch.int16))
    assert not torch.equal(probes.near_ties(fmt, 60, seed=4).amax, ties.amax)
    # the constructed input of every unshifted input-tie row sits within the tie window of a grid
    # boundary under the reference's default scale
    rows = [i for i, k in enumerate(ties.kind) if k == "input_tie+0"]
    tr = reference.fake_quant_traced(ties.x[rows, :1], ties.amax[rows], fmt)
    assert float(near_tie(tr.pre_round.reshape(-1), tr.grid_round).float().mean()) > 0.9


def test_near_ties_rejects_formats_and_counts_it_cannot_build():
    with pytest.raises(ValueError, match="nvfp4"):
        probes.near_ties("nvfp4", 4, seed=0)
    with pytest.raises(ValueError, match="count"):
        probes.near_ties("int8", 0, seed=0)


def test_edge_amax_names_the_tiny_boundary():
    edge = probes.edge_amax()
    assert edge["tiny"] == TINY_AMAX and edge["tiny+1ulp"] > TINY_AMAX and edge["zero"] == 0.0
