"""The MX, FP8 block-wise and INT4 group-wise reference against an independent numpy/``math`` evaluation
(``block_oracle``) on every CI case of those formats: the tile patterns (scale boundaries and one
ulp either side, all-zero / inf / NaN / tiny / subnormal / dtype-max tiles), partial tiles, empty
experts, bf16 / fp16 / fp32, every variant and option."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference as R
from moe_fq_parity.cases import make_inputs, suite

from .block_oracle import fp8_block_fake_quant, int4_group_fake_quant, mx_fake_quant

CASES = [c for c in suite("ci") if not R.format_spec(c.fmt).takes_amax]


def _oracle(case, w: torch.Tensor) -> torch.Tensor:
    x = w.float().numpy()
    opts = case.option_dict
    tile = R.format_spec(case.fmt).tiles.tile(opts)
    if case.fmt == "fp8_block":
        y = fp8_block_fake_quant(x, case.variant, tile, bool(opts.get("fp32_scale")), float(torch.finfo(w.dtype).max))
    elif case.fmt == "int4_group":
        y = int4_group_fake_quant(x, case.variant, tile[1])
    else:
        y = mx_fake_quant(x, case.fmt, case.variant, tile)
    return torch.from_numpy(y).to(w.dtype)


def _same(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return (a.float().view(torch.int32) == b.float().view(torch.int32)) | (torch.isnan(a) & torch.isnan(b))


def test_the_oracle_cases_cover_every_variant_and_pattern():
    seen = {(c.fmt, c.variant, c.dist) for c in CASES}
    for fmt in ("mxfp8", "mxfp4", "fp8_block", "int4_group"):
        for v in R.variants(fmt):
            assert (fmt, v, "tile_edges") in seen and ((fmt, v, "tile_specials") in seen or R.format_spec(fmt).rejects_nan_for(v))
    assert {c.dtype for c in CASES} == {"bf16", "fp16", "fp32"} and any(c.empty for c in CASES)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_reference_equals_the_numpy_oracle(case):
    inp = make_inputs(case)
    if R.format_spec(case.fmt).rejects_nan_for(case.variant) and any(bool((~torch.isfinite(w.float())).any()) for w in inp.weights):
        with pytest.raises(ValueError, match="NaN"):
            R.fake_quant_experts(inp.weights, inp.amax, case.fmt, case.variant, **case.option_dict)
        return
    got = R.fake_quant_experts(inp.weights, inp.amax, case.fmt, case.variant, **case.option_dict)
    for e, (w, y) in enumerate(zip(inp.weights, got)):
        want = _oracle(case, w)
        ok = _same(want, y)
        if not bool(ok.all()):
            i = int((~ok).reshape(-1).nonzero()[0])
            pytest.fail(f"{case.id} expert {e} element {i}: x={w.reshape(-1)[i].item()!r} reference={y.reshape(-1)[i].item()!r} "
                        f"oracle={want.reshape(-1)[i].item()!r}; {int((~ok).sum())} differ; rerun: "
                        f"python -m pytest tests/reference/test_block_oracle.py -k '{case.id}'")
