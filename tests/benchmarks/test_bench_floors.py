"""The benchmark's host-cost floors (``benchmarks.host.host_floor_rows``) time the work they name."""

from __future__ import annotations

import torch

from moe_fq_parity.benchmarks import host


def test_floor_rows_time_views_key_and_a_real_autograd_backward() -> None:
    n = 6
    params = [torch.nn.Parameter(torch.randn(8, 16)) for _ in range(n)]
    grads = [torch.full((8, 16), float(i)) for i in range(n)]
    rows = host.host_floor_rows(params, grads, calls=5)
    assert [r["entry"] for r in rows] == list(host.FLOOR_ENTRIES)
    assert all(r["n"] == n and r["calls"] == 5 and 0 < r["min"] <= r["median"] <= r["max"] for r in rows)
    # the autograd floor ran a backward: every weight accumulated exactly its gradient
    assert all(p.grad is not None and torch.equal(p.grad, g) for p, g in zip(params, grads))


def test_noop_node_returns_n_fresh_outputs_of_the_weights_shape() -> None:
    params = [torch.nn.Parameter(torch.randn(3, 4)) for _ in range(5)]
    outs = host._NoOpExperts.apply(*params)
    assert len(outs) == 5 and all(o.shape == (3, 4) and o.requires_grad for o in outs)
    assert len({o.data_ptr() for o in outs}) == 5
