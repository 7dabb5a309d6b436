"""The reference's default variants reproduce Model-Optimizer's CUDA extension bit for bit.

Data: ``reference/data/modelopt_cuda_vectors.npz`` (shipped with the package; provenance in
``reference/data/README.md``): every bf16 bit pattern through Model-Optimizer 0.47.0's CUDA
extension on an H200, for 8 amax values, NaN and Inf included.
"""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity import reference as R

CASES = {
    "int8_wide": ("int8", {}),
    "int8_narrow": ("int8", {"narrow_range": True}),
    "int4_wide": ("int4", {}),
    "fp8_e4m3": ("fp8_e4m3", {}),
}


def _mismatches(got: torch.Tensor, want_bits) -> list[int]:
    want = torch.from_numpy(want_bits)
    return torch.nonzero(got.reshape(-1).view(torch.int16) != want).reshape(-1).tolist()


@pytest.mark.parametrize("key", sorted(CASES))
def test_forward_matches_cuda_extension(golden, key):
    fmt, opts = CASES[key]
    x = torch.from_numpy(golden["x_bits"]).view(torch.bfloat16).reshape(1, -1)
    failures = []
    for i, amax in enumerate(golden["amax"]):
        got = R.fake_quant(x, torch.tensor(amax), fmt, **opts)
        bad = _mismatches(got, golden[key][i])
        if bad:
            j = bad[0]
            failures.append(f"amax={amax!r}: {len(bad)} elements differ, first x={x[0, j].item()!r} got={got[0, j].item()!r}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("key,mode", [("int8_wide_clipgrad", "clipped"), ("fp8_e4m3_clipgrad", "clipped"), ("int8_wide_passgrad", "pass_through")])
def test_ste_matches_cuda_extension(golden, key, mode):
    x = torch.from_numpy(golden["x_bits"]).view(torch.bfloat16).reshape(1, -1)
    ones = torch.ones_like(x)
    failures = []
    for i, amax in enumerate(golden["amax"]):
        got = R.ste_backward(x, torch.tensor(amax), ones, mode)
        bad = _mismatches(got, golden[key][i])
        if bad:
            failures.append(f"amax={amax!r}: {len(bad)} gradients differ, first at x={x[0, bad[0]].item()!r}")
    assert not failures, "\n".join(failures)


def test_golden_file_is_the_one_produced_and_ships_with_the_package():
    """The file's bytes are those recorded in its README (no silent regeneration) and it holds every key."""
    import hashlib

    from moe_fq_parity.reference import golden as G

    assert hashlib.sha256(G.GOLDEN_PATH.read_bytes()).hexdigest() == G.GOLDEN_SHA256
    assert G.GOLDEN_SHA256 in (G.GOLDEN_PATH.parent / "README.md").read_text()
    data = G.load_golden()
    assert set(data) == {"amax", "x_bits", *G.FORWARD_KEYS, *G.GRADIENT_KEYS}
    assert data["x_bits"].shape == (65536,) and len(set(data["x_bits"].tolist())) == 65536
    assert all(data[k].shape == (8, 65536) for k in (*G.FORWARD_KEYS, *G.GRADIENT_KEYS))
