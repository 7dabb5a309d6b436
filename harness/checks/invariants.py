"""Invariants of one backend, bit for bit (``harness.core.equality``: NaN payloads per the run's policy).

* ``invariant.layout``  -- N separate tensors, N views of one stacked ``[N, out, in]`` tensor, and the
  backend's optional ``fake_quant_stacked`` give identical bits.
* ``invariant.grouped`` -- one grouped call over all experts equals one-expert calls, bit for bit, on
  up to ``GROUPED_SAMPLE`` experts (first, last, every empty one, then spread over the rest), so the
  check costs a bounded number of launches at any N.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, Sequence

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import split_expert_amax

from moe_fq_parity.harness.core.equality import bitwise, compare_each, same_bits
from moe_fq_parity.harness.core.ulp import CLASSES

from .common import (
    MAX_OFFENDERS, CheckContext, call_backend, call_options, expert_offenders, not_run_reason, problems_of, record, reference_options,
    summarize, undeclared_reason,
)


GROUPED_SAMPLE = 4


def grouped_sample(n: int, empty: set[int]) -> list[int]:
    """Experts compared one by one: first, last, the empty ones, then evenly spread (``GROUPED_SAMPLE`` at least)."""
    picked = dict.fromkeys([0, n - 1, *sorted(empty)])
    for i in range(n):
        if len(picked) >= GROUPED_SAMPLE:
            break
        picked.setdefault(i * n // GROUPED_SAMPLE)
    return sorted(picked)


def _compare_runs(ctx: CheckContext, check: str, base: Sequence[torch.Tensor] | Callable[[int], torch.Tensor],
                  other: Sequence[torch.Tensor], what: str, experts: Sequence[int] | None = None,
                  explain: Callable[[int, torch.Tensor, torch.Tensor], int] | None = None, explained: str = ""):
    """A failed record when ``base`` and ``other`` differ bitwise (``equality.bitwise``), else ``None``.

    ``base`` is a sequence or a function ``k -> tensor`` (computed when compared, one at a time);
    ``experts`` names the original expert index of each compared tensor (default ``0..len-1``).
    ``explain(expert, mismatch_mask, got)`` counts the mismatching elements a suspected cause
    accounts for; the message then states that count with ``explained`` (a diagnosis is only
    made from that evidence).
    """
    idx = list(experts) if experts is not None else list(range(len(other)))
    offenders: list = []
    n_explained = 0
    get = base if callable(base) else base.__getitem__

    def full(k: int):
        nonlocal n_explained
        b, o = get(k), other[k]
        comp = bitwise(b, o, ctx.nan_bits)
        offenders.extend(expert_offenders(idx[k], comp, ctx.inputs.weights[idx[k]], b, o, None, MAX_OFFENDERS - len(offenders)))
        if explain is not None and comp.counts["error"]:
            n_explained += explain(idx[k], ~same_bits(b, o, ctx.nan_bits) & ~(torch.isnan(b) & torch.isnan(o.to(b.device))), o)
        return comp

    comps = compare_each(len(other), get, other, full)
    fields = summarize(comps, None if ctx.inputs.amax is None else ctx.inputs.amax[idx])
    errors, nan_bits = fields["counts"]["error"], fields["counts"]["nan_bits"]
    if not errors and not nan_bits:
        return None
    fields["per_expert"] = tuple(replace(e, expert=idx[e.expert]) for e in fields["per_expert"])
    parts = []
    if errors:
        parts.append(f"{errors} elements differ bitwise")
        if explain is not None:
            parts.append(f"{n_explained} of them {explained}")
    if nan_bits:
        parts.append(f"{nan_bits} NaN with other bits than the reference's NaN (--nan-bits strict)")
    return record(ctx, check, "fail", f"{what}: " + "; ".join(parts), offenders=tuple(offenders), **fields)


def _pass_fields(ctx: CheckContext) -> dict:
    counts = dict.fromkeys(CLASSES, 0)
    counts["exact"] = ctx.case.numel
    return {"counts": counts}


def check_layout(ctx: CheckContext):
    """List of separate tensors vs views of one stacked tensor vs ``fake_quant_stacked``.

    Memory: the separate copies live only during their call; then one result is kept and each other
    layout's result is compared and dropped before the next call (two output-sized results at most).
    """
    check = "invariant.layout"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", undeclared_reason(be, case.fmt))
    ws = inputs.weights
    if case.layout == "ragged" or case.empty or any(w.shape != ws[0].shape for w in ws):
        return record(ctx, check, "skip", "layout invariant needs experts of one shape")
    opts = call_options(case)
    stacked = inputs.stacked if inputs.stacked is not None else torch.stack(ws)
    separate = [w.clone() for w in ws]
    call = call_backend(ctx, lambda: be.fake_quant(separate, inputs.amax, case.fmt, **opts))
    del separate
    if (reason := not_run_reason(ctx, call)) is not None:
        return record(ctx, check, "skip", reason)
    if (problem := problems_of(call, ws)) is not None:
        return record(ctx, check, "fail", f"separate: {problem}")
    base = call.value
    del call
    call = call_backend(ctx, lambda: be.fake_quant(list(stacked.unbind(0)), inputs.amax, case.fmt, **opts))
    if (reason := not_run_reason(ctx, call)) is not None:
        return record(ctx, check, "skip", reason)
    if (problem := problems_of(call, ws)) is not None:
        return record(ctx, check, "fail", f"stacked views: {problem}")
    failed = _compare_runs(ctx, check, base, call.value, "separate tensors vs stacked views")
    del call
    if failed is not None:
        return failed
    notes = ""
    if callable(getattr(be, "fake_quant_stacked", None)):
        call = call_backend(ctx, lambda: be.fake_quant_stacked(stacked, inputs.amax, case.fmt, **opts))
        if isinstance(call.error, NotImplementedError) or not_run_reason(ctx, call) is not None:  # optional entry point
            notes = "fake_quant_stacked not implemented; list layouts only"
        elif not call.ok:
            return record(ctx, check, "fail", f"fake_quant_stacked raised {call.message}")
        elif not isinstance(call.value, torch.Tensor) or call.value.shape != stacked.shape or call.value.dtype != stacked.dtype:
            return record(ctx, check, "fail", f"fake_quant_stacked returned {type(call.value).__name__} {getattr(call.value, 'shape', '')}, expected {tuple(stacked.shape)} {stacked.dtype}")
        else:
            failed = _compare_runs(ctx, check, base, list(call.value.unbind(0)), "separate tensors vs fake_quant_stacked")
            if failed is not None:
                return failed
    else:
        notes = "backend has no fake_quant_stacked; list layouts only"
    return record(ctx, check, "pass", notes, **_pass_fields(ctx))


def check_grouped(ctx: CheckContext):
    """One grouped call vs a per-expert loop of one-expert calls."""
    check = "invariant.grouped"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", undeclared_reason(be, case.fmt))
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
        one = None if inputs.amax is None else inputs.amax[i:i + 1]
        call = call_backend(ctx, lambda: be.fake_quant([w], one, case.fmt, **opts))
        seconds += call.seconds
        if (problem := problems_of(call, [w])) is not None:
            return record(ctx, check, "fail", f"one-expert call for expert {i}: {problem}", duration_s=seconds)
        loop.append(call.value[0])
    failed = _compare_runs(ctx, check, [grouped.value[i] for i in experts], loop, f"grouped call vs one-expert calls (experts {experts})", experts)
    if failed is not None:
        return replace(failed, duration_s=seconds)
    return record(ctx, check, "pass", f"experts {experts} compared" if len(experts) < case.n else "", duration_s=seconds, **_pass_fields(ctx))


class _SpecRejects(Exception):
    """The reference rejects the recalibrated input (the check is skipped with the reason)."""


RECALIBRATE_FACTOR = 0.6875
"""New amax = old amax x 0.6875 (11/16): not a power of two, which FP8/NVFP4 could not see."""


def check_recalibrate(ctx: CheckContext):
    """Same weights, new amax (as after calibration or a checkpoint reload): the second call must
    follow the new amax, bit for bit with the reference.  Catches an amax gathered once and cached.

    Memory: the first call's outputs are dropped before the second call; the reference for the new
    amax is computed expert by expert while comparing.
    """
    check = "invariant.recalibrate"
    case, inputs, be = ctx.case, ctx.inputs, ctx.backend.obj
    if case.fmt not in be.formats:
        return record(ctx, check, "skip", undeclared_reason(be, case.fmt))
    if inputs.amax is None:
        return record(ctx, check, "skip", f"{case.fmt} takes no amax (its scales come from the data): there is no amax to change")
    if not bool((inputs.amax > 0).any()):
        return record(ctx, check, "skip", "every amax is zero: a new amax would be invisible")
    opts = call_options(case)
    first = call_backend(ctx, lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
    if (reason := not_run_reason(ctx, first)) is not None:
        return record(ctx, check, "skip", reason)
    seconds = first.seconds
    del first
    new_amax = inputs.amax * RECALIBRATE_FACTOR
    per = split_expert_amax(inputs.weights, new_amax)

    def reference_for(k: int) -> torch.Tensor:
        try:
            return reference.fake_quant(inputs.weights[k], per[k], case.fmt, case.variant, **reference_options(case))
        except (ValueError, TypeError) as exc:
            raise _SpecRejects(f"{type(exc).__name__}: {exc}") from None

    try:
        reference_for(0)
    except _SpecRejects as exc:
        return record(ctx, check, "skip", f"the spec rejects the recalibrated input ({exc})")
    second = call_backend(ctx, lambda: be.fake_quant(inputs.weights, new_amax, case.fmt, **opts))
    if (problem := problems_of(second, inputs.weights)) is not None:
        return record(ctx, check, "fail", f"call after recalibration: {problem}")
    old_per = split_expert_amax(inputs.weights, inputs.amax, fmt=case.fmt)

    def old_amax_explains(e: int, differ: torch.Tensor, got: torch.Tensor) -> int:
        """Mismatching elements of expert ``e`` that equal the reference for the *old* amax."""
        old = reference.fake_quant(inputs.weights[e], old_per[e], case.fmt, case.variant, **reference_options(case))
        return int((differ & same_bits(old, got, ctx.nan_bits)).sum())

    try:
        failed = _compare_runs(ctx, check, reference_for, second.value,
                               f"after amax x {RECALIBRATE_FACTOR} the backend disagrees with the reference for the new amax",
                               explain=old_amax_explains, explained="equal the reference for the old amax (a stale amax when that is all of them)")
    except _SpecRejects as exc:
        return record(ctx, check, "skip", f"the spec rejects the recalibrated input ({exc})")
    if failed is not None:
        return failed
    return record(ctx, check, "pass", "", duration_s=seconds + second.seconds, **_pass_fields(ctx))
