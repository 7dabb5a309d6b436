"""Hypothesis strategies generating small ``Case`` records for fuzzing.

Large shapes come from the catalogue; these strategies keep cases small so each example runs in
milliseconds on the CPU.  All arguments are keyword-only and validated up front
(``hypothesis.errors.InvalidArgument`` naming the bad parameter); an argument never applies silently
to nothing.

Example::

    @given(case=cases(formats=("fp8_e4m3",), max_n=4))
    def test_fp8(case): ...
"""

from __future__ import annotations

from typing import Iterable, Optional, Sequence

from hypothesis import strategies as st
from hypothesis.errors import InvalidArgument

from moe_fq_parity.reference import FORMATS, format_spec, variants

from .case import AMAX_POLICIES, DTYPES, GRANULARITIES, LAYOUTS, Case
from .distributions import DISTRIBUTIONS
from .rules import make_case


def _subset(name: str, given: Iterable[str], known: Sequence[str]) -> tuple[str, ...]:
    vals = tuple(given)
    if isinstance(given, str) or not vals:
        raise InvalidArgument(f"{name} must be a non-empty sequence of names, got {given!r}")
    bad = [v for v in vals if v not in known]
    if bad:
        raise InvalidArgument(f"{name} has unknown entries {bad}; known: {tuple(known)}")
    return vals


def _positive(name: str, value: int, minimum: int = 1) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise InvalidArgument(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@st.composite
def _draw_case(draw, *, formats, all_variants, granularities, layouts, dists, amax_policies, dtypes, max_n, max_rows, max_cols, max_seed, options) -> Case:
    fmt = draw(st.sampled_from(formats))
    spec = format_spec(fmt)
    variant = draw(st.sampled_from(variants(fmt) if all_variants else variants(fmt)[:1]))
    gran_ok = [g for g in granularities if g in spec.amax_granularities]
    gran = draw(st.sampled_from(gran_ok or [next(g for g in GRANULARITIES if g in spec.amax_granularities)]))
    layout_ok = [lay for lay in layouts if not (gran == "per_channel" and lay == "ragged")]
    layout = draw(st.sampled_from(layout_ok or ["stacked"]))
    n = draw(st.integers(1, max_n))
    shape = (draw(st.integers(1, max_rows)), draw(st.integers(1, max_cols)))
    no_amax = gran == "from_data"  # a format without amax: policy "none", no designed-amax distribution
    dist_ok = [d for d in dists if DISTRIBUTIONS[d].applies_to(fmt) and not (no_amax and DISTRIBUTIONS[d].design_only)]
    dist = draw(st.sampled_from(dist_ok or ["normal"]))
    designed = DISTRIBUTIONS[dist].designs_amax
    if no_amax:
        amax_ok = ["none"]
    elif DISTRIBUTIONS[dist].design_only:
        amax_ok = ["design"]
    else:
        amax_ok = [a for a in amax_policies if a not in ("design", "none") or (a == "design" and designed)] or ["max"]
    amax = draw(st.sampled_from(amax_ok))
    empty = 0
    if layout != "stacked" and gran in ("per_expert", "from_data") and n > 1:
        empty = draw(st.integers(0, n - 1))
    opts: list[tuple[str, object]] = []
    for opt in spec.options_for(variant) if options else ():
        if opt.code is None:
            continue  # not a case option (e.g. a tensor)
        if opt.type is bool and draw(st.booleans()):
            opts.append((opt.name, True))
        elif opt.fuzz_values and draw(st.booleans()):
            opts.append((opt.name, draw(st.sampled_from(opt.fuzz_values))))
    return make_case(
        fmt=fmt, variant=variant, granularity=gran, layout=layout, n=n, shape=shape, dist=dist, amax=amax,
        dtype=draw(st.sampled_from(dtypes)), empty=empty, seed=draw(st.integers(0, max_seed)),
        options=tuple(sorted(opts, key=lambda kv: kv[0])),
    )


def cases(
    *,
    formats: Sequence[str] = FORMATS,
    all_variants: bool = True,
    granularities: Sequence[str] = GRANULARITIES,
    layouts: Sequence[str] = LAYOUTS,
    dists: Optional[Sequence[str]] = None,
    amax_policies: Sequence[str] = AMAX_POLICIES,
    dtypes: Sequence[str] = ("bf16",),
    max_n: int = 6,
    max_rows: int = 24,
    max_cols: int = 40,
    max_seed: int = 2**16,
    options: bool = True,
) -> st.SearchStrategy[Case]:
    """Strategy for valid small ``Case`` records.

    * ``formats``: formats to draw from (subset of ``reference.FORMATS``).
    * ``all_variants``: draw every reference variant (``False``: the default variant only).
    * ``granularities``, ``layouts``, ``dtypes``: subsets of the ``cases.case`` constants.
    * ``dists``: distribution names (default: all); ``amax_policies``: amax policy names.
      Distributions built for a designed amax (``ties``, ``outties``) always use ``design``; formats
      without amax (MX, FP8 block-wise) always draw granularity ``from_data`` and policy ``none``.
    * ``max_n``, ``max_rows``, ``max_cols``: upper bounds of N and of the per-expert shape (>= 1).
    * ``max_seed``: upper bound of the case seed index (>= 0).
    * ``options``: also draw the format's case options (registry ``Option``s with a code: bools,
      and ints from their ``fuzz_values``: ``narrow_range``, ``unsigned``, ``block_size``).
    """
    if not isinstance(all_variants, bool):
        raise InvalidArgument(f"all_variants must be a bool, got {all_variants!r}")
    if not isinstance(options, bool):
        raise InvalidArgument(f"options must be a bool, got {options!r}")
    return _draw_case(
        formats=_subset("formats", formats, FORMATS),
        all_variants=all_variants,
        granularities=_subset("granularities", granularities, GRANULARITIES),
        layouts=_subset("layouts", layouts, LAYOUTS),
        dists=_subset("dists", dists if dists is not None else tuple(DISTRIBUTIONS), tuple(DISTRIBUTIONS)),
        amax_policies=_subset("amax_policies", amax_policies, AMAX_POLICIES),
        dtypes=_subset("dtypes", dtypes, DTYPES),
        max_n=_positive("max_n", max_n),
        max_rows=_positive("max_rows", max_rows),
        max_cols=_positive("max_cols", max_cols),
        max_seed=_positive("max_seed", max_seed, 0),
        options=options,
    )
