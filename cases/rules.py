"""Which ``Case`` records are valid experiments: every validation rule of a case, in one module.

A ``Case`` is a plain record (``cases.case``); this module decides whether it can be run.  Format
knowledge comes from the registry (``reference.formats``: variants, amax granularities, options and
their types), distribution knowledge from ``cases.distributions`` (which formats a distribution
applies to, whether it designs amax).  Entry points:

* ``problems(case)``: every rule the case breaks (empty: valid);
* ``validate(case)``: the case, or ``ValueError("invalid Case: ...")`` naming every problem;
* ``make_case(**fields)``: build and validate; ``parse_case(case_id)``: parse an id and validate.
"""

from __future__ import annotations

from moe_fq_parity.reference.formats import FORMATS, case_options, format_spec

from .case import AMAX_POLICIES, DTYPES, GRANULARITIES, LAYOUTS, Case
from .distributions import DISTRIBUTIONS


def _format_problems(case: Case) -> list[str]:
    if case.fmt not in FORMATS:
        return [f"fmt={case.fmt!r} not in {FORMATS}"]
    spec = format_spec(case.fmt)
    if case.variant not in spec.variants:
        return [f"variant={case.variant!r} not in {spec.variant_names}"]
    out = []
    if case.granularity in GRANULARITIES and (why := spec.granularity_problem(case.granularity)):
        out.append(why)
    takes = {o.name: o for o in spec.options_for(case.variant) if o.code is not None}
    for name, value in case.options:
        opt = takes.get(name)
        if opt is None:
            if spec.option(name) is not None and spec.option(name).code is None:
                out.append(f"option {name!r} is not a case option (a case id cannot write it)")
            elif name in case_options():
                out.append(f"{case.fmt}.{case.variant} does not take option {name!r} (it takes {sorted(takes)})")
            else:
                out.append(f"unknown option {name!r}; case options: {sorted(case_options())}")
        elif (why := opt.problem(value)) is not None:
            out.append(why)
        elif opt.type is bool and value is not True:
            out.append(f"{name} is written only when True, got {value!r}")
    return out


def _distribution_problems(case: Case) -> list[str]:
    d = DISTRIBUTIONS.get(case.dist)
    if d is None:
        return [f"dist={case.dist!r} not in {sorted(DISTRIBUTIONS)}"]
    out = []
    if case.fmt in FORMATS and not d.applies_to(case.fmt):
        out.append(f"dist={case.dist!r} applies to {d.formats()} only")
    if case.amax == "design" and not d.designs_amax:
        out.append(f"amax='design' needs a distribution that designs amax, not {case.dist!r}")
    if d.design_only and case.amax != "design":
        out.append(f"dist={case.dist!r} is built for its designed amax: use amax='design'")
    return out


def problems(case: Case) -> list[str]:
    """Every rule ``case`` breaks, in a fixed order (an empty list: the case is valid)."""
    out = _format_problems(case)
    if case.granularity not in GRANULARITIES:
        out.append(f"granularity={case.granularity!r} not in {GRANULARITIES}")
    if case.layout not in LAYOUTS:
        out.append(f"layout={case.layout!r} not in {LAYOUTS}")
    if case.n < 1:
        out.append(f"n={case.n} must be >= 1")
    if len(case.shape) != 2 or min(case.shape) < 1:
        out.append(f"shape={case.shape} must be two positive ints")
    if case.dtype not in DTYPES:
        out.append(f"dtype={case.dtype!r} not in {DTYPES}")
    if not 0 <= case.empty < case.n:
        out.append(f"empty={case.empty} must be in [0, n)")
    if case.empty and case.layout == "stacked":
        out.append("a stacked layout cannot hold empty experts")
    if case.granularity == "per_channel" and (case.layout == "ragged" or case.empty):
        out.append("per_channel amax [N, out] needs every expert to have the same rows (no ragged/empty)")
    if case.amax not in AMAX_POLICIES:
        out.append(f"amax={case.amax!r} not in {AMAX_POLICIES}")
    elif (case.granularity == "from_data") != (case.amax == "none"):
        out.append("granularity 'from_data' (no amax) goes with amax policy 'none', and only with it")
    out += _distribution_problems(case)
    if case.seed < 0:
        out.append(f"seed={case.seed} must be >= 0")
    if tuple(sorted(case.options, key=lambda kv: kv[0])) != case.options:
        out.append("options must be sorted by name")
    return out


def validate(case: Case) -> Case:
    """``case`` if it is valid, else ``ValueError`` naming every problem."""
    found = problems(case)
    if found:
        raise ValueError("invalid Case: " + "; ".join(found))
    return case


def make_case(**fields) -> Case:
    """``Case(**fields)``, validated."""
    return validate(Case(**fields))


def parse_case(case_id: str) -> Case:
    """``Case.from_id(case_id)``, validated (what a user-given id goes through)."""
    return validate(Case.from_id(case_id))
