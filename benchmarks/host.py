"""Host cost per call: the distribution over many calls of the public entry points and of
``QuantGroupedLinear`` against the bound 40 us + 0.5 us per expert, and PyTorch's own floor for
list-in/list-out calls (``host_floor_rows``)."""

from __future__ import annotations

from typing import Callable

import torch

from moe_fq_parity.harness.core.timing import host_samples_us
from moe_fq_parity.kernels import api, checks
from moe_fq_parity.kernels.module import QuantGroupedLinear
from moe_fq_parity.kernels.tables import table_key

from .cases import EXPERT_COUNTS, SHAPES, make_experts


def host_bound_us(n: int) -> float:
    """The host-cost target per call: 40 us + 0.5 us per expert."""
    return 40.0 + 0.5 * n


def stats(xs: list[float]) -> dict[str, float]:
    s = sorted(xs)
    q = lambda f: s[min(len(s) - 1, int(f * len(s)))]  # noqa: E731
    return {"calls": len(s), "min": s[0], "p10": q(0.10), "median": q(0.5), "p90": q(0.9), "p99": q(0.99), "max": s[-1]}


class _NoOpExperts(torch.autograd.Function):
    """N weights in, N fresh views of one buffer out; backward hands the gradients straight back:
    the autograd engine's own cost for an N-input node (and N ``AccumulateGrad``s), no kernel."""

    @staticmethod
    def forward(ctx, *ws):  # type: ignore[override]
        return torch.empty((len(ws), *ws[0].shape), dtype=ws[0].dtype, device=ws[0].device).unbind(0)

    @staticmethod
    def backward(ctx, *grads):  # type: ignore[override]
        return grads


FLOOR_ENTRIES = ("floor: N output views (torch.empty + unbind)", "floor: table key of N experts",
                 "floor: autograd backward of an N-input no-op node")  # fmt: skip
"""PyTorch's own host cost for what any list-in/list-out call must do (``host_floor_rows``)."""


def host_floor_rows(params: list[torch.Tensor], grads: list[torch.Tensor], calls: int,
                    sync: Callable[[], None] = lambda: None) -> list[dict]:  # fmt: skip
    """Host time (us) of the work no implementation of the public calls can skip, over ``calls``
    calls each, for N = ``len(params)`` experts of one shape (``params`` require grad):

    * creating the N output tensors (one ``torch.empty`` and ``unbind``: the cheapest way);
    * reading each expert's address, shape, contiguity and dtype (``launch.table_key``: what tells a
      reused table from a stale one);
    * ``torch.autograd.backward`` through one N-input node that does nothing (the engine and the N
      gradient accumulations of a module with N weights).

    ``sync`` runs before each timed call (the device's synchronize on a GPU)."""
    n, shape, dtype, device = len(params), tuple(params[0].shape), params[0].dtype, params[0].device
    state: dict = {}

    def fwd() -> None:
        for p in params:
            p.grad = None
        state["outs"] = _NoOpExperts.apply(*params)

    rows = [host_samples_us(lambda: torch.empty((n, *shape), dtype=dtype, device=device).unbind(0), calls, sync=sync),
            host_samples_us(lambda: table_key(params), calls, sync=sync),
            host_samples_us(lambda: torch.autograd.backward(state.pop("outs"), grads), calls, before=fwd, sync=sync)]  # fmt: skip
    return [{"entry": e, "n": n, "bound_us": None, **stats(r)} for e, r in zip(FLOOR_ENTRIES, rows)]


def host_distribution(calls: int, counts=EXPERT_COUNTS, shape: tuple[int, int] = SHAPES["super_fc1"]) -> list[dict]:
    """Host time per call over ``calls`` calls each, for the public entry points and the module."""
    rows = []
    for n in counts:
        ws, amax = make_experts(n, shape, seed=7)
        grads = [torch.randn_like(w) for w in ws]
        stacked, gstacked = torch.stack(ws), torch.stack(grads)
        first = len(rows)
        layer = QuantGroupedLinear(n, shape[1], shape[0], "fp8_e4m3", device="cuda", ste_mode="clipped")
        with torch.no_grad():
            for q, a in zip(layer.weight_quantizer, amax):
                q._amax.fill_(float(a))
        slayer = QuantGroupedLinear(n, shape[1], shape[0], "fp8_e4m3", device="cuda", ste_mode="clipped", stacked=True)
        slayer.load_state_dict(layer.state_dict())
        splits = [4] * n
        x = torch.randn(4 * n, shape[1], device="cuda", dtype=torch.bfloat16, requires_grad=True)
        gy = torch.randn(4 * n, shape[0], device="cuda", dtype=torch.bfloat16)
        state: dict = {}

        def module_fwd():
            state["wq"] = layer.quantized_weights()

        def module_bwd():
            if "wq" not in state:
                module_fwd()
            torch.autograd.backward(state.pop("wq"), grads)

        def layer_step():
            x.grad = None
            for w in layer.weights():
                w.grad = None
            layer(x, splits).backward(gy)

        def stacked_fwd():
            state["swq"] = slayer.quantized_weight()

        def stacked_bwd():
            if "swq" not in state:
                stacked_fwd()
            torch.autograd.backward(state.pop("swq"), gstacked)

        entries = {
            "fake_quant_experts (checked)": lambda: api.fake_quant_experts(ws, amax, "fp8_e4m3"),
            "fake_quant_experts (unchecked)": lambda: api.fake_quant_experts(ws, amax, "fp8_e4m3", check_values=False),
            "ste_backward_experts (clipped)": lambda: api.ste_backward_experts(ws, amax, grads, "clipped"),
            "QuantGroupedLinear fq forward": module_fwd,
            "fake_quant stacked [N, out, in] (checked)": lambda: api.fake_quant(stacked, amax, "fp8_e4m3"),
            "ste_backward stacked [N, out, in] (clipped)": lambda: api.ste_backward(stacked, amax, gstacked, "clipped"),
        }
        for what, fn in entries.items():
            rows.append({"entry": what, "n": n, "bound_us": host_bound_us(n), **stats(host_samples_us(fn, calls))})
        def fresh_forward() -> None:  # the backward needs a fresh forward each time (untimed)
            module_fwd()
            for w in layer.weights():
                w.grad = None  # AccumulateGrad then keeps the gradient (no per-expert add kernels)

        samples = host_samples_us(module_bwd, calls, before=fresh_forward)
        rows.append({"entry": "QuantGroupedLinear fq backward", "n": n, "bound_us": host_bound_us(n), **stats(samples)})
        rows.append({"entry": "QuantGroupedLinear(stacked=True) fq forward", "n": n, "bound_us": host_bound_us(n),
                     **stats(host_samples_us(stacked_fwd, calls))})

        def fresh_stacked_forward() -> None:
            stacked_fwd()
            slayer.weight.grad = None

        samples = host_samples_us(stacked_bwd, calls, before=fresh_stacked_forward)
        rows.append({"entry": "QuantGroupedLinear(stacked=True) fq backward", "n": n, "bound_us": host_bound_us(n), **stats(samples)})
        rows.append({"entry": "QuantGroupedLinear layer fwd+bwd (incl. N GEMMs)", "n": n, "bound_us": None,
                     **stats(host_samples_us(layer_step, max(50, calls // 10)))})  # fmt: skip
        rows += host_floor_rows(layer.weights(), grads, calls, torch.cuda.synchronize)
        for r in rows[first:]:
            r["within_bound"] = None if r["bound_us"] is None else r["median"] <= r["bound_us"]
            print(f"  host {r['entry']:52s} N={n:3d}  median {r['median']:7.1f} us  p90 {r['p90']:7.1f}  p99 {r['p99']:7.1f}"
                  f"  bound {r['bound_us'] or float('nan'):6.1f}", flush=True)  # fmt: skip
        floor = {r["entry"]: r["median"] for r in rows[-len(FLOOR_ENTRIES):]}
        print(f"  host N={n:3d}: floor of a list-out call (views + key) {floor[FLOOR_ENTRIES[0]] + floor[FLOOR_ENTRIES[1]]:7.1f} us"
              f" vs bound {host_bound_us(n):6.1f} us", flush=True)  # fmt: skip
        del ws, grads, layer, slayer, stacked, gstacked
        torch.cuda.empty_cache()
    checks.raise_pending_errors()
    return rows
