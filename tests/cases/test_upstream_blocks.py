"""The adversarial block classes: only the ``inf`` and ``nan`` classes hold non-finite elements (the random draws stay finite)."""
import pytest
import torch

from moe_fq_parity.cases.upstream_blocks import block_classes
from moe_fq_parity.harness.sections.atlas import atlas_formats, tile_options


@pytest.mark.parametrize("fmt", atlas_formats())
def test_random_draws_are_finite(fmt):
    """``random`` and ``op_order`` draw elements up to 2^126 * randn: beyond bf16's max they would be
    +/-inf after the cast, and a variant that refuses non-finite input would fail the whole atlas
    (seed 1234, INT4 group-wise did)."""
    for options in tile_options(fmt):
        for seed in (0, 1234):
            bad = [c.name for c in block_classes(fmt, options, seed=seed, classes=("random", "op_order"))
                   if not bool(torch.isfinite(c.x).all())]
            assert not bad, f"{fmt} {options} seed {seed}: non-finite elements in {bad}"
