"""kernels.interpret: the interpreter without its repeated language patch gives the same bits, and
really skips the repeats (CPU only: on a GPU there is no interpreter)."""

from __future__ import annotations

import collections
import contextlib

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity.kernels import interpret

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="Triton's interpreter runs in the CPU tier only")
pytest.importorskip("triton", reason="pip install 'moe-fq-parity[triton]'")

CALLS = [  # (format, options, amax?): every kernel body (fwd per format family, tile_2d, bwd)
    ("int8", {}, True), ("fp8_e4m3", {}, True), ("nvfp4", {}, True), ("nvfp4", {"tile_2d": True}, True),
    ("mxfp8", {"tile_2d": True}, False), ("mxfp4", {}, False), ("fp8_block", {}, False), ("int4_group", {}, False),
]


def _run_all() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    outs = []
    for fmt, options, takes_amax in CALLS:
        xs = [(torch.randn(33, 64, generator=g) * 4).to(torch.bfloat16) for _ in range(3)]
        xs[1][0, :5] = torch.tensor([0.0, -0.0, 1e-40, 3e38, -7.5])
        amax = torch.stack([x.float().abs().amax() for x in xs]) if takes_amax else None
        outs += kernels.fake_quant_experts(xs, amax, fmt, **options)
    x = [(torch.randn(16, 48, generator=g) * 3).to(torch.bfloat16) for _ in range(2)]
    grads = [torch.randn(16, 48, generator=g).to(torch.bfloat16) for _ in range(2)]
    outs += kernels.ste_backward_experts(x, torch.tensor([2.0, 3.0]), grads, "clipped")
    return [o.view(torch.int16) if o.element_size() == 2 else o.view(torch.int32) for o in outs]


def test_same_bits_with_and_without_the_shortcut():
    assert interpret.install(), "the interpreter no longer has the shape kernels.interpret expects"
    with_it = _run_all()
    with interpret.suspended():
        without = _run_all()
    assert len(with_it) == len(without)
    for i, (a, b) in enumerate(zip(with_it, without)):
        assert torch.equal(a, b), f"output {i}: {int((a != b).sum())} elements differ with the shortcut"


def test_the_repeated_patches_are_skipped(monkeypatch):
    """A launch patches its modules (``tl``, ``tl.tensor``, ``tl.math``, the descriptor class; once
    per launch ``triton.language.standard``'s helpers add ``tl.core``): a bounded number per launch
    with the shortcut, one more set per device-function call without it."""
    from triton.runtime import interpreter

    scans = collections.Counter()
    builder = interpreter.interpreter_builder
    set_grid_dim = builder.set_grid_dim

    def counting_grid(*args, **kwargs):  # once per launch
        scans["launches"] += 1
        return set_grid_dim(*args, **kwargs)

    monkeypatch.setattr(builder, "set_grid_dim", counting_grid)
    counted = {}
    for state in ("without", "with"):
        with interpret.suspended() if state == "without" else contextlib.nullcontext():
            assert interpret.install() == (state == "with")
            inner = interpreter._patch_builtin

            def counting_patch(pkg, builder, scope, inner=inner):
                scans["patches"] += 1
                return inner(pkg, builder, scope)

            monkeypatch.setattr(interpreter, "_patch_builtin", counting_patch)
            scans.clear()
            _run_all()
            counted[state] = dict(scans)
            monkeypatch.setattr(interpreter, "_patch_builtin", inner)
    with_it, without = counted["with"], counted["without"]
    assert with_it["launches"] == without["launches"] > 0, counted
    assert with_it["patches"] <= 12 * with_it["launches"] and 5 * with_it["patches"] <= without["patches"], counted
