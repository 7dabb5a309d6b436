"""Frozen result records: what every check returns, and what the report stores (never a bare bool).

``CheckRecord.to_json`` / ``from_json`` are the report's ``records[]`` entries (schema in
``reports/schema/report.schema.json``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Optional

from moe_fq_parity.reports.schema import CHECKS, VERDICTS

OUTCOMES = ("checked", "oom", "crash", "timeout")
"""How a check ended: ``checked`` (it ran to its verdict); ``oom`` (it ran out of memory: no parity
verdict exists; ``message`` names the case, its bytes and the memory free); ``crash`` (the isolation
worker running it died: exit, signal or a lost CUDA context; ``message`` says how, or names the check
of the same case and backend that crashed when this one never ran); ``timeout`` (a backend call
outlived the timeout and its worker was killed).  Every outcome but ``checked`` has verdict ``fail``,
so every gate fails the run."""

def _plain(obj: Any) -> dict[str, Any]:
    """A dataclass's fields as a dict, in declaration order, values as they are (no copies)."""
    names = _FIELDS.get(type(obj))
    if names is None:
        names = _FIELDS[type(obj)] = tuple(f.name for f in fields(obj))
    return {n: getattr(obj, n) for n in names}


_FIELDS: dict[type, tuple[str, ...]] = {}


@dataclass(frozen=True)
class Offender:
    """One mismatching element: where, what went in, what was expected and got, and why.

    ``expert``: index of the tensor in its list; ``row``/``col``: the element in that tensor seen as
    ``[-1, last dim]``; ``input``: the fake-quant input (``None`` where the comparison has none);
    ``cls``: a class of ``harness.core.ulp.CLASSES`` (the external section's variant match adds
    ``signed_zero`` and ``exact_tie``); ``expected_bits``/``got_bits``/``input_bits``: the bit
    patterns in hex (NaN payloads differ there, not in the values); ``amax``/``amax_bits``: the
    element's fp32 amax, where the comparison has one per element (the variant match).
    """

    expert: int
    row: int
    col: int
    input: Optional[float]
    expected: float
    got: float
    pre_round: Optional[float]
    ulp: Optional[int]
    cls: str
    expected_bits: str = ""
    got_bits: str = ""
    input_bits: str = ""
    amax: Optional[float] = None
    amax_bits: str = ""


@dataclass(frozen=True)
class ExpertStats:
    """Per-expert breakdown of a comparison."""

    expert: int
    numel: int
    amax: Optional[float]
    max_ulp: int
    counts: dict[str, int]


@dataclass(frozen=True)
class Perf:
    """Timing of one backend call on one case (units in the names)."""

    time_us: float
    gbps: float
    pct_of_copy: Optional[float]
    timer: str
    samples_us: tuple[float, ...]
    bytes_moved: int
    kernel_us: Optional[float] = None
    """The kernel alone through a prepared launch (backends with ``timed_entries``)."""
    unchecked_us: Optional[float] = None
    """The public call with its value checks off."""
    host_us: Optional[float] = None
    """Host time of one public call (``perf_counter``, device idle at the start), median."""
    loop_us: Optional[float] = None
    """The per-expert eager loop (``reference.fake_quant_experts``) on the same case, median."""
    pct_kernel: Optional[float] = None
    pct_unchecked: Optional[float] = None
    speedup_vs_loop: Optional[float] = None
    """``loop_us / time_us``: the public call against the per-expert eager loop."""
    copy_same_us: Optional[float] = None
    """A device copy moving ``bytes_moved`` under the same timer (the run's copy curve, interpolated:
    ``harness.core.timing.copy_us_at``): what this call would take were it a copy."""
    pct_of_same_copy: Optional[float] = None
    """``100 * copy_same_us / time_us``: the call against a copy of its size timed the same way
    (launch latency and L2 flush included in both), where ``pct_of_copy`` compares with the run's
    largest copy."""


@dataclass(frozen=True)
class CheckRecord:
    """The result of one check of one backend on one case.

    ``counts`` uses the classes of ``harness.core.ulp`` (``exact``, ``ulp1``, ``tie_flip``, ``nan_bits``, ``error``);
    ``offenders`` are the first mismatches in (expert, row, col) order; ``repro`` is a shell command
    that reruns exactly this case and check.  ``outcome``: one of ``OUTCOMES``.
    ``peak_bytes``: CUDA memory the check needed at its peak, counted from before the case's tensors
    were built (``torch.cuda.max_memory_allocated`` during the check minus ``memory_allocated`` before
    the case), so the case's inputs, gradients and reference outputs count; ``None`` off CUDA.
    ``case_bytes``: the case's fake-quant input + output bytes (``CaseInputs.nbytes``), the unit of
    the memory budget (``harness.core.memory.BUDGET_FACTOR``).
    """

    case_id: str
    backend: str
    check: str
    verdict: str
    fmt: str
    n: int
    numel: int
    mode: str = "strict"
    message: str = ""
    max_ulp: int = 0
    counts: dict[str, int] = field(default_factory=dict)
    signed_zero: int = 0
    nan_mismatch: int = 0
    inf_mismatch: int = 0
    histogram: tuple[int, ...] = ()
    per_expert: tuple[ExpertStats, ...] = ()
    offenders: tuple[Offender, ...] = ()
    perf: Optional[Perf] = None
    repro: str = ""
    duration_s: float = 0.0
    outcome: str = "checked"
    peak_bytes: Optional[int] = None
    case_bytes: int = 0

    def __post_init__(self) -> None:
        if self.verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {VERDICTS}, got {self.verdict!r}")
        if self.outcome not in OUTCOMES:
            raise ValueError(f"outcome must be one of {OUTCOMES}, got {self.outcome!r}")
        if self.outcome != "checked" and self.verdict != "fail":
            what = "an out-of-memory" if self.outcome == "oom" else f"a {self.outcome}"
            raise ValueError(f"{what} record has verdict 'fail' (the run fails), got {self.verdict!r}")
        if self.check not in CHECKS:
            raise ValueError(f"check must be one of {CHECKS}, got {self.check!r}")

    @property
    def key(self) -> str:
        """Unique key of the record in a report: ``case_id|backend|check``."""
        return f"{self.case_id}|{self.backend}|{self.check}"

    @property
    def exact(self) -> bool:
        """True when every compared element was bit-exact (``counts`` only ``exact``)."""
        return self.verdict == "pass" and all(v == 0 for k, v in self.counts.items() if k != "exact")

    def to_json(self) -> dict[str, Any]:
        """The report entry: the fields in declaration order, then ``key``; tuples as lists, dicts
        copied (nothing aliases the record).  Built field by field: ``dataclasses.asdict`` deep-copies
        every value and cost 0.13 ms a record (two thirds of a ``ci`` run's report plumbing)."""
        d = _plain(self)
        d["counts"] = dict(self.counts)
        d["histogram"] = list(self.histogram)
        d["per_expert"] = [_plain(e) | {"counts": dict(e.counts)} for e in self.per_expert]
        d["offenders"] = [_plain(o) for o in self.offenders]
        if self.perf is not None:
            d["perf"] = _plain(self.perf) | {"samples_us": list(self.perf.samples_us)}
        d["key"] = self.key
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "CheckRecord":
        d = dict(d)
        d.pop("key", None)
        d["histogram"] = tuple(d.get("histogram", ()))
        d["per_expert"] = tuple(ExpertStats(**e) for e in d.get("per_expert", ()))
        d["offenders"] = tuple(Offender(**o) for o in d.get("offenders", ()))
        if d.get("perf") is not None:
            p = dict(d["perf"])
            p["samples_us"] = tuple(p["samples_us"])
            d["perf"] = Perf(**p)
        return cls(**d)
