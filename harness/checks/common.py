"""What every check shares: the context, backend options, guarded calls and record assembly."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch

from moe_fq_parity.cases import CaseInputs, make_inputs
from moe_fq_parity.reference import default_variant
from moe_fq_parity.harness.backends import LoadedBackend
from moe_fq_parity.harness.core.guard import Call, InputsModified, fingerprint, guarded, output_problems
from moe_fq_parity.harness.core.memory import CheckOutOfMemory, forget, is_oom
from moe_fq_parity.harness.core.records import CheckRecord, ExpertStats, Offender
from moe_fq_parity.harness.core.repro import repro_command
from moe_fq_parity.harness.core.equality import DEFAULT_NAN_BITS, MAX_OFFENDERS, offender  # noqa: F401 - MAX_OFFENDERS re-exported to the checks
from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S
from moe_fq_parity.harness.core.timing import CopyCurve
from moe_fq_parity.harness.core.ulp import CLASSES, HIST_EDGES, Comparison

from .plan import declares


@dataclass(frozen=True)
class CheckContext:
    """One backend on one case: everything a check needs."""

    backend: LoadedBackend
    inputs: CaseInputs
    seed: int
    mode: str = "strict"
    timeout_s: Optional[float] = CALL_TIMEOUT_S
    copy_gbps: Optional[float] = None
    extra: dict = field(default_factory=dict)
    mem_base: Optional[int] = None
    """CUDA bytes allocated before the case's tensors were built (the zero of ``peak_bytes``);
    ``None``: measure from the start of each check."""
    nan_bits: str = DEFAULT_NAN_BITS
    """NaN policy of every comparison (``harness.core.equality``): ``any`` or ``strict``."""
    copy_curve: Optional[CopyCurve] = None
    """The run's copy timings (``harness.core.timing.copy_curve``): the perf check's same-size copy."""
    alone: Optional[Callable[[], ContextManager[None]]] = None
    """A context in which this process has the device to itself (``harness.run.gpu_lease.CaseTurns.alone``,
    case workers sharing a GPU): the perf check times inside it.  ``None``: nothing to wait for."""

    @property
    def case(self):
        return self.inputs.case


def call_options(case) -> dict[str, Any]:
    """Backend keyword options of ``case``: its options, plus ``variant`` when it is not the default."""
    opts = dict(case.option_dict)
    if case.variant != default_variant(case.fmt):
        opts["variant"] = case.variant
    return opts


def reference_options(case) -> dict[str, Any]:
    """Keyword options for ``reference.fake_quant*`` (the variant is passed positionally there)."""
    return dict(case.option_dict)


def record(ctx: CheckContext, check: str, verdict: str, message: str = "", **fields: Any) -> CheckRecord:
    """A ``CheckRecord`` with the case/backend fields and the repro command filled in."""
    case = ctx.case
    return CheckRecord(
        case_id=case.id, backend=ctx.backend.spec, check=check, verdict=verdict, fmt=case.fmt, n=case.n,
        numel=case.numel, mode=ctx.mode, message=message,
        repro=repro_command(case.id, ctx.backend.spec, check, ctx.seed, ctx.mode, timeout_s=ctx.timeout_s, nan_bits=ctx.nan_bits),
        case_bytes=ctx.inputs.nbytes, **fields,
    )


def _input_tensors(inputs) -> list[Optional[torch.Tensor]]:
    return [*inputs.weights, inputs.amax, *inputs.grads, inputs.stacked]


def _modified(inputs, before: tuple, after: tuple) -> str:
    """Which inputs changed between two ``fingerprint`` s (weights by expert, amax, grads by expert, stacked)."""
    n = len(inputs.weights)
    names = [f"weights of expert {i}" for i in range(n)] + ["amax"] + [f"gradient of expert {i}" for i in range(len(inputs.grads))] + ["stacked weights"]
    changed = [name for name, hb, ha, sb, sa in zip(names, before[0], after[0], before[1] + (None,) * len(names), after[1] + (None,) * len(names))
               if hb != ha or sb != sa]
    return ", ".join(changed[:8]) + (f" and {len(changed) - 8} more" if len(changed) > 8 else "")


def restore_inputs(ctx: CheckContext) -> None:
    """Write the case's generated bits back into its input tensors (in place, so every holder of them,
    the pytest plugin's case cache included, sees the fresh inputs again)."""
    fresh = make_inputs(ctx.case, ctx.seed, ctx.inputs.device)
    with torch.no_grad():
        for old, new in zip(_input_tensors(ctx.inputs), _input_tensors(fresh)):
            if old is not None and new is not None:
                old.copy_(new)


def call_backend(ctx: CheckContext, fn: Callable[[], Any]) -> Call:
    """``guarded(fn)``; a backend that ran out of memory raises ``CheckOutOfMemory`` out of the check
    (its record becomes ``oom``, never a parity verdict) after its traceback's frames are dropped.

    Writes to the inputs are caught per check, around all of the check's calls (``inputs_unchanged``).
    """
    call = guarded(fn, ctx.timeout_s, ctx.backend.state)
    if call.error is not None and is_oom(call.error):
        message = call.message
        forget(call.error)
        del call
        raise CheckOutOfMemory("the backend call", message)
    return call


def inputs_unchanged(ctx: CheckContext, fn: Callable[[], CheckRecord]) -> CheckRecord:
    """``fn()`` (one check), with the case's inputs checked bit for bit before and after it.

    A backend that wrote to its inputs (weights, amax, gradients, the stacked tensor:
    ``harness.core.guard.fingerprint``) raises ``InputsModified`` after the inputs were restored
    (``restore_inputs``), so every check starts from the generated inputs, as its one-check repro
    does.  Cost: one fingerprint per check after its calls (one read of the inputs and one
    synchronisation), plus one per case of the inputs as generated (``_generated_fingerprint``).
    """
    tensors = _input_tensors(ctx.inputs)
    before = _generated_fingerprint(ctx.inputs, tensors)
    rec = fn()
    after = fingerprint(tensors)
    if after != before:
        what = _modified(ctx.inputs, before, after)
        detail = f"the backend wrote to its inputs ({what}); a backend must leave weights, amax and gradients untouched"
        del rec
        restore_inputs(ctx)
        raise InputsModified("a backend call of this check", detail)
    return rec


_GENERATED: dict[int, tuple[weakref.ref, tuple]] = {}
"""``id(inputs) -> (weak reference to inputs, fingerprint)`` of the one case whose checks run now."""


def _generated_fingerprint(inputs: Any, tensors: list[Optional[torch.Tensor]]) -> tuple:
    """The fingerprint of ``inputs`` as generated: taken once per inputs object, so the consecutive
    checks of one case pay one fingerprint each (after their calls), not two.  Valid because nothing
    but a backend writes to the inputs between checks and a write is undone (``restore_inputs``)
    before the check's failure is raised."""
    held = _GENERATED.get(id(inputs))
    if held is not None and held[0]() is inputs:
        return held[1]
    fp = fingerprint(tensors)
    _GENERATED.clear()  # one case at a time: an earlier case's entry would only pin its id
    _GENERATED[id(inputs)] = (weakref.ref(inputs), fp)
    return fp


def undeclared_reason(be: object, fmt: str) -> str:
    """The skip reason for a format the backend does not list in ``formats``: its own
    ``format_available(fmt)`` reason where it has one (the Triton kernel says why it declines)."""
    probe = getattr(be, "format_available", None)
    why = probe(fmt)[1] if callable(probe) else ""
    return why or f"backend formats {sorted(be.formats)} do not include {fmt}"  # type: ignore[attr-defined]


def not_run_reason(ctx: CheckContext, call: Call) -> Optional[str]:
    """A skip reason when the backend declined, else ``None``.

    A backend may decline what it does not declare: a non-default variant or option, with
    ``NotImplementedError``, ``TypeError`` or ``ValueError`` (the contract's way to refuse an option it
    does not implement).  A format it lists in ``formats`` it has declared: declining a plain default
    call of it (even with ``NotImplementedError``) is a failure, so a declared format cannot silently
    lose its coverage (``problems_of`` says so).  Likewise a variant and options it declares
    (``variants``/``options``, ``harness.checks.plan.declares``): declining those fails.
    """
    opts = call_options(ctx.case)
    if opts and isinstance(call.error, (NotImplementedError, TypeError, ValueError)) and not declares(ctx.backend, ctx.case):
        return f"backend refused options {opts}: {call.message}"
    return None


def problems_of(call: Call, like: Sequence[torch.Tensor]) -> Optional[str]:
    """Failure message of a call that raised or returned malformed outputs, else ``None``."""
    if isinstance(call.error, NotImplementedError):
        return (f"backend declined a format it declares ({call.message}); a backend may decline only formats it does not list in "
                f"`formats` and variants or options it does not declare (`variants`, `options`)")
    if not call.ok:
        return f"backend raised {call.message}"
    bad = output_problems(call.value, like)
    return "; ".join(bad) if bad else None


def expert_offenders(
    e: int, comp: Comparison, x: torch.Tensor, expected: torch.Tensor, got: torch.Tensor, pre: Optional[torch.Tensor], limit: int,
) -> list[Offender]:
    """The first ``limit`` mismatching elements of expert ``e``, with their inputs and values.

    The checks compare expert by expert and call this while the expert's tensors are at hand, so
    nothing expert-sized is kept for the offender table (``MAX_OFFENDERS`` over all experts).
    """
    got = got.detach().to(expected.device)
    out = []
    for j in range(min(comp.mismatch_index.numel(), max(0, limit))):
        cls = CLASSES[int(comp.mismatch_class[j])]
        # a tie flip is one grid step (harness.core.ulp): its ULP distance is no measure of it
        ulp = None if cls == "tie_flip" else int(comp.mismatch_ulp[j])
        out.append(offender(e, int(comp.mismatch_index[j]), expected, got, cls, inputs=x, pre_round=pre, ulp=ulp))
    return out


def expert_amax_values(amax: Optional[torch.Tensor], n: int) -> list[Optional[float]]:
    """The amax shown for each of the first ``n`` experts (per channel: its largest row amax; an
    expert with no rows: 0), in one host transfer; ``None`` for a format without amax."""
    if amax is None:
        return [None] * n
    a = amax[:n].detach().float()
    if a.dim() > 1:
        a = a.reshape(a.shape[0], -1)
        a = a.amax(dim=1) if a.shape[1] else torch.zeros(a.shape[0], device=a.device)
    return a.tolist()


def summarize(comps: Sequence[Comparison], amax: Optional[torch.Tensor]) -> dict[str, Any]:
    """Aggregate per-expert comparisons into record fields (counts, histogram, per-expert stats)."""
    counts = {c: sum(comp.counts[c] for comp in comps) for c in CLASSES}
    hist = [sum(comp.histogram[k] for comp in comps) for k in range(len(HIST_EDGES))]
    amaxes = expert_amax_values(amax, len(comps))
    per = tuple(
        ExpertStats(expert=e, numel=comp.numel, amax=amaxes[e], max_ulp=comp.max_ulp, counts=dict(comp.counts))
        for e, comp in enumerate(comps)
    )
    return {
        "counts": counts,
        "histogram": tuple(hist),
        "max_ulp": max((comp.max_ulp for comp in comps), default=0),
        "signed_zero": sum(comp.signed_zero for comp in comps),
        "nan_mismatch": sum(comp.nan_mismatch for comp in comps),
        "inf_mismatch": sum(comp.inf_mismatch for comp in comps),
        "per_expert": per,
    }


def _are(n: int) -> str:
    return f"{n} {'are' if n != 1 else 'is'}"


def mismatch_message(fields: dict[str, Any], numel: int, *, bitwise: bool = False) -> str:
    """One line in plain words: how many elements differ and why, then where (empty when none differ).

    The kinds, each named in the headline so the reason never hides in the details: ``ULP apart``
    (the largest distance with it), ``tie flips`` (a rounding tie of the grid rounded the other
    way: one grid step each, ``harness.core.ulp``), ``+0 vs -0`` (sign of zero: ULP distance 0),
    ``NaN with other bits`` (``--nan-bits strict``), NaN or inf where the reference has none.
    ``bitwise``: the comparison was ``equality.bitwise`` (a sign-of-zero difference is an ``error``
    there; it is named as a sign of zero, not as an error of 0 ULP).
    """
    c = fields["counts"]
    zeros = fields.get("signed_zero", 0)
    nan_bits, nan_mismatch, inf_mismatch = c.get("nan_bits", 0), fields.get("nan_mismatch", 0), fields.get("inf_mismatch", 0)
    bad = numel - c["exact"] + (0 if bitwise else zeros)
    if not bad:
        return ""
    other = c.get("error", 0) - nan_mismatch - inf_mismatch - (zeros if bitwise else 0)
    parts = []
    if zeros:
        parts.append(f"{zeros} {'differ' if zeros != 1 else 'differs'} in the sign of zero (+0 vs -0: 0 ULP apart, other bits)")
    if c.get("ulp1"):
        parts.append(f"{_are(c['ulp1'])} 1 ULP apart")
    if c.get("tie_flip"):
        parts.append(f"{_are(c['tie_flip'])} {'tie flips' if c['tie_flip'] > 1 else 'a tie flip'} (a value on a rounding tie, rounded "
                     f"the other way: one grid step)")
    if other > 0:
        parts.append(f"{_are(other)} {'wrong values' if other > 1 else 'a wrong value'}"
                     + (f" (up to {fields['max_ulp']} ULP apart)" if fields["max_ulp"] > 1 else ""))
    if nan_bits:
        parts.append(f"{_are(nan_bits)} NaN with other bits than the reference's NaN (--nan-bits strict; by default NaN payload and sign "
                     f"are not compared)")
    if nan_mismatch:
        parts.append(f"{_are(nan_mismatch)} NaN where the reference has none, or a number where it has NaN")
    if inf_mismatch:
        parts.append(f"{inf_mismatch} {'disagree' if inf_mismatch > 1 else 'disagrees'} on inf")
    experts = [s.expert for s in fields["per_expert"] if s.counts["exact"] != s.numel]
    where = f" in experts {experts[:12]}{'...' if len(experts) > 12 else ''}" if experts else ""
    return f"{bad} of {numel} elements differ{where}: " + "; ".join(parts)
