"""``equality.compare_each``: the one-synchronisation fast path gives exactly the comparisons of the
full per-expert path (``ulp.compare`` and ``equality.bitwise``), for identical and differing pairs."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.harness.core.equality import bitwise, compare_each
from moe_fq_parity.harness.core.ulp import compare

FIELDS = ("numel", "counts", "signed_zero", "nan_mismatch", "inf_mismatch", "max_ulp", "histogram")


def _pairs(dtype: torch.dtype) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(7)
    base = [torch.randn(4, 9, generator=g).to(dtype) for _ in range(6)]
    base[1][0, 0] = float("nan")
    base[2][1, 1] = float("inf")
    base[5] = base[5][:0]  # an empty expert
    got = [b.clone() for b in base]
    bits = torch.int32 if dtype == torch.float32 else torch.int16
    got[3].view(bits).reshape(-1)[4] += 1  # one ulp
    got[4].reshape(-1)[0], base[4].reshape(-1)[0] = -0.0, 0.0  # sign of zero
    got[1].view(bits).reshape(-1)[0] ^= 1  # another NaN payload: exact under nan_bits="any", differs in bits
    return list(zip(base, got))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("how", ["compare", "bitwise"])
def test_fast_path_equals_the_full_comparison(dtype, how):
    pairs = _pairs(dtype)
    fn = (lambda e, g: compare(e, g)) if how == "compare" else (lambda e, g: bitwise(e, g))
    calls: list[int] = []

    def full(k):
        calls.append(k)
        return fn(*pairs[k])

    fast = compare_each(len(pairs), lambda k: pairs[k][0], [g for _, g in pairs], full)
    assert calls == [1, 3, 4]  # only the pairs whose bits differ take the full path
    for k, (e, g) in enumerate(pairs):
        want, got = fn(e, g), fast[k]
        assert all(getattr(want, f) == getattr(got, f) for f in FIELDS), (k, want, got)
        for t in ("mismatch_index", "mismatch_class", "mismatch_ulp"):
            assert torch.equal(getattr(want, t), getattr(got, t)) and getattr(want, t).dtype == getattr(got, t).dtype, (k, t)
