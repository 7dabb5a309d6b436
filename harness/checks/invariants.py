"""Invariants of one backend, bit for bit (no reference involved).

* ``invariant.layout``  -- N separate tensors, N views of one stacked ``[N, out, in]`` tensor, and the
  backend's optional ``fake_quant_stacked`` give identical bits.
* ``invariant.grouped`` -- one grouped call over all experts equals one-expert calls, bit for bit, on
  up to ``GROUPED_SAMPLE`` experts (first, last, every empty one, then spread over the rest), so the
  check costs a bounded number of launches at any N.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import torch

from moe_fq_parity.harness.core.ulp import CLASSES

from .common import CheckContext, call_backend, call_options, not_run_reason, offenders_of, problems_of, record, summarize
from .backward import _bitwise


GROUPED_SAMPLE = 4


def grouped_sample(n: int, empty: set[int]) -> list[int]:
    """Experts compared one by one: first, last, the empty ones, then evenly spread (``GROUPED_SAMPLE`` at least)."""
    picked = dict.fromkeys([0, n - 1, *sorted(empty)])
    for i in range(n):
        if len(picked) >= GROUPED_SAMPLE:
            break
        picked.setdefault(i * n // GROUPED_SAMPLE)
    return sorted(picked)


def _compare_runs(ctx: CheckContext, check: str, base: Sequence[torch.Tensor], other: Sequence[torch.Tensor], what: str,
                  experts: Sequence[int] | None = None):
    """A failed record when ``base`` and ``other`` differ bitwise, else ``None``.

    ``experts`` names the original expert index of each compared tensor (default ``0..len-1``).
    """
    idx = list(experts) if experts is not None else list(range(len(base)))
    comps = [_bitwise(b, o) for b, o in zip(base, other)]
    fields = summarize(comps, ctx.inputs.amax[idx])
    bad = fields["counts"]["error"]
    if not bad:
        return None
    fields["per_expert"] = tuple(replace(e, expert=idx[e.expert]) for e in fields["per_expert"])
    offenders = tuple(replace(o, expert=idx[o.expert]) for o in offenders_of(comps, [ctx.inputs.weights[i] for i in idx], base, other))
    return record(ctx, check, "fail", f"{what}: {bad} elements differ bitwise", offenders=offenders, **fields)


def _pass_fields(ctx: CheckContext) -> dict:
    counts = dict.fromkeys(CLASSES, 0)
    counts["exact"] = ctx.case.numel
    return {"counts": counts}


def check_layout(ctx: CheckContext):
    """List of separate tensors vs views of one stacked tensor vs ``fake_quant_stacked``."""
    check = "invariant.layout"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", f"backend formats do not include {case.fmt}")
    ws = inputs.weights
    if case.layout == "ragged" or case.empty or any(w.shape != ws[0].shape for w in ws):
        return record(ctx, check, "skip", "layout invariant needs experts of one shape")
    opts = call_options(case)
    stacked = inputs.stacked if inputs.stacked is not None else torch.stack(ws)
    separate = [w.clone() for w in ws]
    runs = {}
    for label, fn in (("separate", lambda: be.fake_quant(separate, inputs.amax, case.fmt, **opts)),
                      ("stacked views", lambda: be.fake_quant(list(stacked.unbind(0)), inputs.amax, case.fmt, **opts))):
        call = call_backend(ctx, fn)
        if (reason := not_run_reason(ctx, call)) is not None:
            return record(ctx, check, "skip", reason)
        if (problem := problems_of(call, ws)) is not None:
            return record(ctx, check, "fail", f"{label}: {problem}")
        runs[label] = call.value
    notes = ""
    if callable(getattr(be, "fake_quant_stacked", None)):
        call = call_backend(ctx, lambda: be.fake_quant_stacked(stacked, inputs.amax, case.fmt, **opts))
        if not_run_reason(ctx, call) is not None:
            notes = "fake_quant_stacked not implemented; list layouts only"
        elif not call.ok:
            return record(ctx, check, "fail", f"fake_quant_stacked raised {call.message}")
        elif not isinstance(call.value, torch.Tensor) or call.value.shape != stacked.shape or call.value.dtype != stacked.dtype:
            return record(ctx, check, "fail", f"fake_quant_stacked returned {type(call.value).__name__} {getattr(call.value, 'shape', '')}, expected {tuple(stacked.shape)} {stacked.dtype}")
        else:
            runs["fake_quant_stacked"] = list(call.value.unbind(0))
    else:
        notes = "backend has no fake_quant_stacked; list layouts only"
    base = runs.pop("separate")
    for label, other in runs.items():
        failed = _compare_runs(ctx, check, base, other, f"separate tensors vs {label}")
        if failed is not None:
            return failed
    return record(ctx, check, "pass", notes, **_pass_fields(ctx))


def check_grouped(ctx: CheckContext):
    """One grouped call vs a per-expert loop of one-expert calls."""
    check = "invariant.grouped"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", f"backend formats do not include {case.fmt}")
    opts = call_options(case)
    grouped = call_backend(ctx, lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
    if (reason := not_run_reason(ctx, grouped)) is not None:
        return record(ctx, check, "skip", reason)
    if (problem := problems_of(grouped, inputs.weights)) is not None:
        return record(ctx, check, "fail", f"grouped call: {problem}")
    experts = grouped_sample(len(inputs.weights), {i for i, w in enumerate(inputs.weights) if w.numel() == 0})
    loop, seconds = [], grouped.seconds
    for i in experts:
        w = inputs.weights[i]
        call = call_backend(ctx, lambda: be.fake_quant([w], inputs.amax[i:i + 1], case.fmt, **opts))
        seconds += call.seconds
        if (problem := problems_of(call, [w])) is not None:
            return record(ctx, check, "fail", f"one-expert call for expert {i}: {problem}", duration_s=seconds)
        loop.append(call.value[0])
    failed = _compare_runs(ctx, check, [grouped.value[i] for i in experts], loop, f"grouped call vs one-expert calls (experts {experts})", experts)
    if failed is not None:
        return replace(failed, duration_s=seconds)
    return record(ctx, check, "pass", f"experts {experts} compared" if len(experts) < case.n else "", duration_s=seconds, **_pass_fields(ctx))


RECALIBRATE_FACTOR = 0.6875
"""New amax = old amax x 0.6875 (11/16): not a power of two, which FP8/NVFP4 could not see."""


def check_recalibrate(ctx: CheckContext):
    """Same weights, new amax (as after calibration or a checkpoint reload): the second call must
    follow the new amax, bit for bit with the reference.  Catches an amax gathered once and cached."""
    from dataclasses import replace as dc_replace

    from .forward import expected_forward

    check = "invariant.recalibrate"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", f"backend formats do not include {case.fmt}")
    if not bool((inputs.amax > 0).any()):
        return record(ctx, check, "skip", "every amax is zero: a new amax would be invisible")
    opts = call_options(case)
    first = call_backend(ctx, lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
    if (reason := not_run_reason(ctx, first)) is not None:
        return record(ctx, check, "skip", reason)
    new_inputs = dc_replace(inputs, amax=inputs.amax * RECALIBRATE_FACTOR)
    expected = expected_forward(new_inputs)
    if expected.error is not None:
        return record(ctx, check, "skip", f"the spec rejects the recalibrated input ({expected.error})")
    second = call_backend(ctx, lambda: be.fake_quant(inputs.weights, new_inputs.amax, case.fmt, **opts))
    if (problem := problems_of(second, inputs.weights)) is not None:
        return record(ctx, check, "fail", f"call after recalibration: {problem}")
    failed = _compare_runs(ctx, check, [t.out for t in expected.traced], second.value,
                           f"after amax x {RECALIBRATE_FACTOR} the backend disagrees with the reference for the new amax (stale amax?)")
    if failed is not None:
        return failed
    return record(ctx, check, "pass", "", duration_s=first.seconds + second.seconds, **_pass_fields(ctx))
