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

from moe_fq_parity.harness.core.equality import bitwise, compare_each, offender, same_bits
from moe_fq_parity.harness.core.ulp import CLASSES, Comparison

from .common import (
    MAX_OFFENDERS, CheckContext, call_backend, call_options, expert_offenders, mismatch_message, not_run_reason, problems_of, record,
    reference_options, summarize, undeclared_reason,
)
from .forward import compare_expert


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
                  other: Sequence[torch.Tensor], what: str, experts: Sequence[int] | None = None):
    """A failed record when ``base`` and ``other`` differ bitwise (``equality.bitwise``), else ``None``.

    ``base`` is a sequence or a function ``k -> tensor`` (computed when compared, one at a time);
    ``experts`` names the original expert index of each compared tensor (default ``0..len-1``).
    """
    idx = list(experts) if experts is not None else list(range(len(other)))
    offenders: list = []
    get = base if callable(base) else base.__getitem__

    def full(k: int):
        b, o = get(k), other[k]
        comp = bitwise(b, o, ctx.nan_bits)
        offenders.extend(expert_offenders(idx[k], comp, ctx.inputs.weights[idx[k]], b, o, None, MAX_OFFENDERS - len(offenders)))
        return comp

    comps = compare_each(len(other), get, other, full)
    fields = summarize(comps, None if ctx.inputs.amax is None else ctx.inputs.amax[idx])
    if not fields["counts"]["error"] and not fields["counts"]["nan_bits"]:
        return None
    fields["per_expert"] = tuple(replace(e, expert=idx[e.expert]) for e in fields["per_expert"])
    numel = sum(c.numel for c in comps)
    return record(ctx, check, "fail", f"{what}: " + mismatch_message(fields, numel, bitwise=True), offenders=tuple(offenders), **fields)


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
    # the separate copies are built inside the call: they live only as long as it does
    call = call_backend(ctx, lambda: be.fake_quant([w.clone() for w in ws], inputs.amax, case.fmt, **opts))
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
            return record(ctx, check, "fail", f"fake_quant_stacked returned {type(call.value).__name__} {getattr(call.value, 'shape', '')}, "
                                              f"expected {tuple(stacked.shape)} {stacked.dtype}")
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


def _classified(ctx: CheckContext, e: int, expected: torch.Tensor, got: torch.Tensor, amax: torch.Tensor, limit: int
                ) -> tuple[Comparison, list]:
    """Expert ``e``'s comparison with the forward check's classes (ULP, tie flip with the pre-rounding
    values, NaN bits) for the reference at ``amax``, and its first ``limit`` offenders; a
    sign-of-zero difference (bitwise here, as everywhere but forward ``1-ulp``) is an offender of
    class ``signed_zero``."""
    comp, pre = compare_expert(ctx.inputs, e, expected, got, ctx.nan_bits, amax=amax)
    w = ctx.inputs.weights[e]
    found = expert_offenders(e, comp, w, expected, got, pre, limit)
    if comp.signed_zero and len(found) < limit:
        g = got.detach().to(expected.device).reshape(-1)
        ex = expected.reshape(-1)
        zeros = torch.nonzero((ex == 0) & (g == 0) & (torch.signbit(ex) != torch.signbit(g))).reshape(-1)
        found += [offender(e, int(i), expected, got.detach().to(expected.device), "signed_zero", inputs=w, pre_round=pre, ulp=0)
                  for i in zeros[: limit - len(found)].tolist()]
    return comp, found


def _differing(ctx: CheckContext, amax: torch.Tensor, got: Sequence[torch.Tensor]) -> tuple[int, list[torch.Tensor]]:
    """Elements of ``got`` that are not ``same_bits`` as the reference at ``amax``: the count and a mask per expert."""
    case, per = ctx.case, split_expert_amax(ctx.inputs.weights, amax, fmt=ctx.case.fmt)
    masks = []
    for e, w in enumerate(ctx.inputs.weights):
        ref = reference.fake_quant(w, per[e], case.fmt, case.variant, **reference_options(case))
        masks.append(~same_bits(ref, got[e], ctx.nan_bits))
    return sum(int(m.sum()) for m in masks), masks


def check_recalibrate(ctx: CheckContext):
    """Same weights, new amax (as after calibration or a checkpoint reload): the second call must
    follow the new amax, bit for bit with the reference.  Catches an amax gathered once and cached.

    The elements are classified as the forward check classifies them (tie flips with their
    pre-rounding values), and a failure says how it relates to the original amax: the elements that
    equal the reference for the old amax (a stale amax when that is all of them), and whether the
    backend differs from the reference at the original amax too (the forward check of this case
    fails then: one cause, reported by both checks).

    Memory: the first call's outputs are dropped before the second call; the reference for the new
    amax is computed expert by expert while comparing.  A failure costs one more backend call at the
    original amax and the reference at both amaxes (output-sized masks per expert).
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
    per = split_expert_amax(inputs.weights, new_amax, fmt=inputs.case.fmt)

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
    seconds += second.seconds
    if (problem := problems_of(second, inputs.weights)) is not None:
        return record(ctx, check, "fail", f"call after recalibration: {problem}")
    offenders: list = []

    def full(e: int) -> Comparison:
        comp, found = _classified(ctx, e, reference_for(e), second.value[e], new_amax, MAX_OFFENDERS - len(offenders))
        offenders.extend(found)
        return comp

    try:
        comps = compare_each(len(inputs.weights), reference_for, second.value, full)
    except _SpecRejects as exc:
        return record(ctx, check, "skip", f"the spec rejects the recalibrated input ({exc})")
    fields = summarize(comps, new_amax)
    if all(c.counts["exact"] == c.numel and not c.signed_zero for c in comps):
        return record(ctx, check, "pass", "", duration_s=seconds, **_pass_fields(ctx))
    # Why: the elements that equal the reference for the old amax, and the backend at the original amax.
    bad, bad_masks = _differing(ctx, new_amax, second.value)
    stale = sum(int((m & ~d).sum()) for m, d in zip(bad_masks, _differing(ctx, inputs.amax, second.value)[1]))
    again = call_backend(ctx, lambda: be.fake_quant(inputs.weights, inputs.amax, case.fmt, **opts))
    seconds += again.seconds
    why = []
    if stale == bad:
        why.append(f"all {bad} equal the reference's output for the old amax: the backend kept using the old amax (a stale amax)")
    elif stale:
        why.append(f"{stale} of them equal the reference's output for the old amax")
    if problems_of(again, inputs.weights) is None:
        at_old, old_masks = _differing(ctx, inputs.amax, again.value)
        if at_old == 0:
            why.append("at the original amax the backend matches the reference (the forward check of this case passes)")
        else:
            same = all(bool((m & ~o).sum() == 0) for m, o in zip(bad_masks, old_masks))
            why.append(f"the forward check of this case fails too ({at_old} elements at the original amax"
                       + (", every element failing here among them" if same else "") + "): read that record first, it may be the same cause")
    del again
    msg = f"with the amax x {RECALIBRATE_FACTOR} (as after recalibration): " + mismatch_message(fields, case.numel, bitwise=False)
    return record(ctx, check, "fail", msg + "".join(f"; {w}" for w in why), offenders=tuple(offenders), duration_s=seconds, **fields)
