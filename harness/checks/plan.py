"""What is planned for a backend: a case it does not declare is *not applicable* to it, not a skip.

A backend declares what it implements (``harness.core.contract``): its ``formats`` and, optionally,
per format its ``variants`` and ``options`` (with the values it takes).  A case of a format, variant
or option value outside that declaration was never meant for the backend: the runner and the pytest
plugin ask ``planned_checks`` before running it (a format not declared: no check; a variant or
option not declared: the backward checks only, which take neither), and a report counts the checks
not applicable per backend and reason (``NotApplicable``: one line each, no record) instead of one
skip record per check.  A
case inside the declaration is checked, and a backend that declines it fails
(``checks.common.not_run_reason``).  A backend that declares no variants or options keeps the old
rule: it may decline a non-default variant or option, which is then a skip with its reason.

Cost: a dictionary lookup per case and backend; the report holds one entry per backend and reason.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Iterable, Optional

from moe_fq_parity.harness.core.contract import declared_options, declared_variants

LABEL = "not applicable to this backend"
"""How reports and the pytest plugin name a case outside a backend's declaration."""


def _obj(backend: Any) -> Any:
    return getattr(backend, "obj", backend)  # a LoadedBackend or the backend object itself


def not_applicable(backend: Any, case: Any) -> Optional[str]:
    """Why ``case`` is outside what ``backend`` (a ``LoadedBackend`` or a backend object) declares,
    or ``None`` when the backend declares it (or declares nothing that excludes it)."""
    be = _obj(backend)
    name = getattr(be, "name", "the backend")
    if not format_declared(be, case):
        return f"backend formats {sorted(be.formats)} do not include {case.fmt}"
    variants = declared_variants(be, case.fmt)
    if variants is not None and case.variant not in variants:
        return f"{name} implements the {case.fmt} variants {sorted(variants)}, not {case.variant!r}"
    options = declared_options(be, case.fmt)
    if options is not None:
        for key, value in case.option_dict.items():
            if key not in options:
                return f"{name} does not implement the {case.fmt} option {key}"
            accepted = options[key]
            if accepted is not None and value not in accepted:
                return f"{name} implements {case.fmt} {key} in {sorted(accepted)}, not {value!r}"
    return None


VARIANT_CHECKS = ("forward", "invariant.layout", "invariant.grouped", "invariant.recalibrate", "perf")
"""The checks that call the fake quant with the case's variant and options.  The straight-through
backward (``reference.ste_backward``) takes neither: a case of an undeclared variant or option still
has its backward checks (they passed before there were declarations, and still must)."""


def format_declared(backend: Any, case: Any) -> bool:
    """Whether ``case``'s format is in the backend's ``formats`` (a backend without ``formats``: yes)."""
    formats = getattr(_obj(backend), "formats", None)
    return formats is None or case.fmt in formats


def planned_checks(backend: Any, case: Any, checks: Iterable[str]) -> tuple[list[str], Optional[str]]:
    """``(checks planned for backend on case, why the others are not applicable)`` (``None``: all planned).

    A format the backend does not declare: no check; a variant or option it does not declare: the
    checks outside ``VARIANT_CHECKS``."""
    checks = list(dict.fromkeys(checks))
    why = not_applicable(backend, case)
    if why is None:
        return checks, None
    if not format_declared(backend, case):
        return [], why
    return [c for c in checks if c not in VARIANT_CHECKS], why


def declares(backend: Any, case: Any) -> bool:
    """Whether ``backend`` declares ``case``'s variant and options explicitly (``variants`` and, where
    the case has options, ``options``): then declining the case is a failure, not a skip."""
    be = _obj(backend)
    if not_applicable(be, case) is not None or declared_variants(be, case.fmt) is None:
        return False
    return not case.option_dict or declared_options(be, case.fmt) is not None


@dataclass
class NotApplicable:
    """Checks not applicable to each backend, by reason: ``records`` (the checks not planned) and
    ``cases`` (the cases with such checks).  ``to_json`` is the report's ``not_applicable`` field."""

    records: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    cases: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, backend: str, reason: str, checks: int) -> None:
        self.records[backend][reason] += checks
        self.cases[backend][reason] += 1

    def merge(self, other: "NotApplicable") -> None:
        """Add ``other``'s counts to these."""
        for b, rs in other.records.items():
            self.records[b].update(rs)
            self.cases[b].update(other.cases[b])

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {b: {"records": sum(rs.values()), "cases": sum(self.cases[b].values()),
                    "reasons": [{"reason": why, "records": n, "cases": self.cases[b][why]} for why, n in rs.most_common()]}
                for b, rs in sorted(self.records.items())}


def applicable(backends: Iterable[Any], case: Any, checks: Iterable[str], tally: NotApplicable) -> list[Any]:
    """The backends ``case`` has planned checks for (``planned_checks``; ``run_case_checks`` runs only
    those); the checks not applicable are counted in ``tally``."""
    checks = list(dict.fromkeys(checks))
    out = []
    for b in backends:
        kept, why = planned_checks(b, case, checks)
        if why is not None:
            tally.add(getattr(b, "spec", getattr(b, "name", "?")), why, len(checks) - len(kept))
        if kept:
            out.append(b)
    return out


def summary_line(report: dict[str, Any]) -> str:
    """``"2,800 checks not applicable to their backend (not run, not skips): 2,800 on triton (470 cases)"``
    (``run``'s line and the pytest plugin's); empty when none."""
    na = report.get("not_applicable") or {}
    total = sum(v["records"] for v in na.values())
    if not total:
        return ""
    per = "; ".join(f"{v['records']:,} on {b} ({v['cases']:,} cases)" for b, v in na.items())
    return f"{total:,} checks {LABEL.replace('this backend', 'their backend')} (not run, not skips): {per}"
