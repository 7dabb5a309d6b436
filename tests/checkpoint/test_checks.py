"""``diff_bits``: one comparison of the whole tensor where all is equal, the per-expert walk (with
offenders naming the expert) where anything differs; both under the one bitwise policy."""

from __future__ import annotations

import torch

from moe_fq_parity.harness.sections.checkpoint.checks import diff_bits


def _experts() -> torch.Tensor:
    return torch.arange(4 * 3 * 5, dtype=torch.float32).reshape(4, 3, 5) / 7


def test_equal_tensors_have_no_mismatch():
    e = _experts()
    d = diff_bits("w", e, e.clone())
    assert d.ok and (d.numel, d.mismatches, d.first) == (60, 0, ())


def test_one_differing_element_is_counted_and_named_by_expert():
    e = _experts()
    g = e.clone()
    g[2, 1, 3] = 0.5
    d = diff_bits("w", e, g)
    assert not d.ok and d.mismatches == 1
    assert len(d.first) == 1 and "expert 2" in d.first[0] and "(1, 3)" in d.first[0]


def test_signed_zero_differs_and_nan_payloads_do_not():
    e = torch.zeros(2, 4)
    g = e.clone()
    g[1, 0] = -0.0
    assert diff_bits("w", e, g).mismatches == 1
    quiet = torch.full((3,), float("nan"))
    other = quiet.view(torch.int32).bitwise_or(1).view(torch.float32)  # another NaN payload
    assert torch.isnan(other).all() and diff_bits("v", quiet, other).ok


def test_note_is_kept_when_all_elements_are_equal():
    e = _experts()
    d = diff_bits("w", e, e.clone(), note="replicas at offset (0, 0) disagree")
    assert d.mismatches == 0 and not d.ok and d.note
