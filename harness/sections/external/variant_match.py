"""Which reference variant does a backend match bit for bit?  Run every variant, count, list.

For one backend and one format, every reference variant (``reference.variants(fmt)``; for a format
whose scales come from tiles every variant with every bool option set, ``cases.upstream_blocks
.variant_calls``, named like ``deepseek+fp32_scale``) is evaluated on the same inputs as the backend (``harness.sections.external.match_cases``) and compared
element by element with ``harness.core.ulp.compare`` (value equality: ``+0 == -0``, NaN == NaN; the
classes exact / ulp1 / tie_flip / error) and ``harness.core.bits.bits_equal`` (bit equality; NaN
payloads counted apart).  A variant *matches* when no element differs: in value, or in the sign
of a zero.  NaN payloads are not part of the match (the reference writes the canonical NaN
``0x7FFF``; torch's CPU casts keep sign and payload): ``nan_bits`` counts them.

Exact ties: where a variant's pre-rounding value is *exactly* the midpoint of two grid values
(``exact_tie``), IEEE arithmetic rounds it to even; an implementation whose quotient is not
correctly rounded (Triton's fp32 ``/`` is ``div.full.f32`` on NVIDIA GPUs) may land one ulp off and
round the other way.  Those mismatches are counted (``tie_flips``) and listed apart
(``tie_offenders``, every one of them); a variant whose only mismatches are exact-tie flips is
``matched_up_to_ties``, never ``matched``.

Near ties under an approximate division: a quotient within ``APPROX_DIVISION_ULPS`` fp32 ulps of the
correctly rounded one can cross a rounding boundary whenever the reference's pre-rounding value lies
that close to it, not only at exact ties.  ``division_flips`` counts the mismatches (exact ties
apart) whose pre-rounding value is within that many ulps of a boundary *and* whose output is the
other side's grid value (``ulp.other_side``, to 1 output ULP); any other mismatch stays one.  A
variant whose every mismatch is an exact-tie or a division flip is ``matched_up_to_division``; only
a backend that declares the format in ``approximate_division`` may pass on it (``section.variants_row``).

Run it: ``python -m moe_fq_parity.harness.sections.external.variant_match --backend modelopt-eager --format fp8_e4m3``;
``--backend torchao`` runs every member of the family ``FAMILIES["torchao"]`` (its four MX scale
modes and its NVFP4) on the same cases.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict, dataclass, field
from typing import Any, Optional, Sequence

import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.contract import backend_device
from moe_fq_parity.harness.core.equality import MAX_OFFENDERS, offenders_at
from moe_fq_parity.harness.core.records import Offender
from moe_fq_parity.harness.core.bits import bits_equal
from moe_fq_parity.harness.core.ulp import CLASSES, Comparison, compare, near_tie, other_side, ulp_distance
from moe_fq_parity.harness.sections.cli_args import at_least, json_path
from moe_fq_parity.reference.nvfp4 import nvfp4_tie_probe
from moe_fq_parity.cases.upstream_blocks import call_name, variant_calls
from moe_fq_parity.reports.schema import dumps

from . import FAMILIES, probes
from .registry import load_backend
from .match_cases import MX_RANDOM_BLOCKS, MX_SHUFFLES, Case, build_cases
from .upstreams import RULES

DEFAULT_CAP = MAX_OFFENDERS
"""Offenders listed per variant and case by default (all are counted): the harness's one cap."""
TIE_CAP = 1 << 16
"""Exact-tie flips listed per variant and case (all are counted): every one of them is the finding
(the upstream kernel's deviation from IEEE), so this list is not capped like offenders are."""
APPROX_DIVISION_ULPS = 2
"""Error bound of an approximate fp32 division in ulps of the quotient: PTX's ``div.full.f32`` (what
Triton's fp32 ``/`` compiles to on NVIDIA GPUs) is documented to 2 ulp over its full range.  With the
reference's pre-rounding value ``p = RN(q)`` within 1/2 ulp of the exact quotient ``q`` and the
kernel's ``q'`` within 2 ulp of ``q``, ``q'`` can reach a rounding boundary ``b`` only when ``p`` lies
at most 2 ulps from ``b``."""


@dataclass(frozen=True)
class VariantResult:
    """Backend vs one reference variant on one case."""

    variant: str
    numel: int
    mismatches: int
    """Elements that differ in value (``counts`` minus exact) plus sign-of-zero differences."""
    counts: dict[str, int]
    max_ulp: int
    bit_mismatches: int
    nan_bits: int
    signed_zero: int
    offenders: tuple[Offender, ...] = field(default=())
    tie_flips: int = 0
    """Mismatches (of ``mismatches``) at elements whose pre-rounding value is an exact grid tie."""
    tie_offenders: tuple[Offender, ...] = field(default=())
    """Every tie flip (up to ``TIE_CAP``), in index order."""
    division_flips: int = 0
    """Mismatches (of ``mismatches``, exact-tie flips apart) within ``APPROX_DIVISION_ULPS`` of a
    rounding boundary whose output is the other side's grid value (module docstring)."""
    division_offenders: tuple[Offender, ...] = field(default=())
    """Every division flip (up to ``TIE_CAP``), in index order."""

    @property
    def matches(self) -> bool:
        return self.mismatches == 0


@dataclass(frozen=True)
class CaseResult:
    """All variants on one case; ``error`` holds the backend's exception text if it raised."""

    case: str
    numel: int
    near_tie: int
    variants: tuple[VariantResult, ...]
    error: str = ""
    declined: str = ""
    """The backend raised ``NotImplementedError`` (the contract's way to decline a case): not counted."""


@dataclass(frozen=True)
class FormatMatch:
    """One backend, one format: per case, per variant."""

    backend: str
    fmt: str
    options: dict[str, Any]
    cases: tuple[CaseResult, ...]

    @property
    def errors(self) -> tuple[str, ...]:
        return tuple(f"{c.case}: {c.error}" for c in self.cases if c.error)

    @property
    def declined(self) -> tuple[str, ...]:
        return tuple(f"{c.case}: {c.declined}" for c in self.cases if c.declined)

    def mismatches(self, variant: str) -> Optional[int]:
        """Total value mismatches against ``variant`` (``None`` if a case errored)."""
        if self.errors:
            return None
        return sum(v.mismatches for c in self.cases for v in c.variants if v.variant == variant)

    @property
    def variant_names(self) -> tuple[str, ...]:
        """The reference rules compared (variants, or variant+option names), in order."""
        return tuple(name for name, _ in reference_calls(self.fmt, self.options))

    @property
    def matched(self) -> tuple[str, ...]:
        """Variants with zero value mismatches over every case."""
        return tuple(v for v in self.variant_names if self.mismatches(v) == 0)

    def tie_flips(self, variant: str) -> Optional[int]:
        """Of ``mismatches(variant)``, those at exact grid ties (``None`` if a case errored)."""
        if self.errors:
            return None
        return sum(v.tie_flips for c in self.cases for v in c.variants if v.variant == variant)

    @property
    def matched_up_to_ties(self) -> tuple[str, ...]:
        """Variants not matched whose every mismatch is an exact-tie flip."""
        return tuple(v for v in self.variant_names if v not in self.matched and self.mismatches(v) is not None
                     and self.mismatches(v) == self.tie_flips(v))

    def division_flips(self, variant: str) -> Optional[int]:
        """Of ``mismatches(variant)``, the near-tie flips an approximate division explains, exact ties
        apart (``None`` if a case errored)."""
        if self.errors:
            return None
        return sum(v.division_flips for c in self.cases for v in c.variants if v.variant == variant)

    @property
    def matched_up_to_division(self) -> tuple[str, ...]:
        """Variants neither matched nor matched up to exact ties whose every mismatch is an exact-tie or
        a division flip (``APPROX_DIVISION_ULPS``)."""
        return tuple(v for v in self.variant_names if v not in self.matched and v not in self.matched_up_to_ties
                     and self.mismatches(v) is not None and self.mismatches(v) == self.tie_flips(v) + self.division_flips(v))

    @property
    def numel(self) -> int:
        return sum(c.numel for c in self.cases)

    @property
    def near_tie(self) -> int:
        return sum(c.near_tie for c in self.cases)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["matched"] = list(self.matched)
        d["matched_up_to_ties"] = list(self.matched_up_to_ties)
        d["totals"] = {v: self.mismatches(v) for v in self.variant_names}
        d["tie_flip_totals"] = {v: self.tie_flips(v) for v in self.variant_names}
        d["matched_up_to_division"] = list(self.matched_up_to_division)
        d["division_flip_totals"] = {v: self.division_flips(v) for v in self.variant_names}
        d["upstream_rules"] = {v: list(upstream_rules(self.fmt, v, self.options)) for v in self.matched}
        return d


def reference_calls(fmt: str, options: dict) -> list[tuple[str, dict]]:
    """``(name, options)`` of every reference rule a backend is compared with: each variant with ``options``,
    and for a format whose scales come from tiles each variant with every set of its bool options
    (``variant_calls``: FP8 block-wise ``fp32_scale``), named ``variant+option``."""
    if reference.format_spec(fmt).tiles is None:
        return [(v, dict(options)) for v in reference.variants(fmt)]
    return [(call_name(v, o), o) for v, o in variant_calls(fmt, options)]


def upstream_rules(fmt: str, name: str, options: dict) -> tuple[str, ...]:
    """The upstream rules (``upstreams.RULES`` ids) the reference rule ``name`` of ``fmt`` claims for the layout of ``options``."""
    def layout(o) -> dict:  # the options that are not the rule's own bool choices: tile_2d, sizes
        return {k: v for k, v in o.items() if k == "tile_2d" and v or not isinstance(v, bool)}

    return tuple(r.id for r in RULES if r.fmt == fmt and call_name(r.variant, dict(r.options)) == name and layout(r.options) == layout(options))


def _run_backend(backend: object, case: Case, fmt: str, options: dict) -> torch.Tensor:
    dev = backend_device(backend)
    amax = None if case.amax is None else case.amax.to(dev)
    outs = backend.fake_quant([w.to(dev) for w in case.weights], amax, fmt, **options)
    return torch.cat([o.detach().reshape(-1).cpu() for o in outs])


def _reference(case: Case, fmt: str, variant: str, options: dict) -> tuple[torch.Tensor, torch.Tensor, Any]:
    """Flat output, pre-round values and grid rounding of one variant (stacked when possible)."""
    if case.stacked is not None:
        tr = reference.fake_quant_traced(case.stacked, case.stacked_amax, fmt, variant, **options)
        return tr.out.reshape(-1), tr.pre_round.reshape(-1), tr.grid_round
    outs, pres, grid = [], [], None
    for w, a in zip(case.weights, reference.split_expert_amax(case.weights, case.amax, fmt=fmt)):
        tr = reference.fake_quant_traced(w, a, fmt, variant, **options)
        outs.append(tr.out.reshape(-1))
        pres.append(tr.pre_round.reshape(-1))
        grid = tr.grid_round
    return torch.cat(outs), torch.cat(pres), grid


def exact_tie(pre: torch.Tensor, grid_round: Any) -> torch.Tensor:
    """True where the fp32 ``pre`` is exactly halfway between two adjacent grid values: its fp32
    neighbours round to different grid values whose mean is ``pre`` (the mean of two grid values
    of these formats is exact in fp32)."""
    lo = grid_round(torch.nextafter(pre, torch.full_like(pre, -float("inf"))))
    hi = grid_round(torch.nextafter(pre, torch.full_like(pre, float("inf"))))
    return torch.isfinite(pre) & (lo != hi) & ((lo + hi) * 0.5 == pre)


def _offenders_at(case: Case, idx: torch.Tensor, expected: torch.Tensor, got: torch.Tensor, pre: torch.Tensor,
                  ulp: list[int], cls: list[str]) -> tuple[Offender, ...]:
    """``records.Offender`` s at flat indices ``idx`` of the case's concatenated experts."""
    ends = torch.tensor([w.numel() for w in case.weights], dtype=torch.int64).cumsum(0)
    parts = torch.searchsorted(ends, idx, right=True).tolist()
    return offenders_at(parts, idx, [w.shape for w in case.weights], expected, got, cls, ulp, inputs=case.flat_input(),
                        pre_round=pre, amax=case.elem_amax)


def _offenders(case: Case, expected: torch.Tensor, got: torch.Tensor, pre: torch.Tensor, comp: Comparison, cap: int) -> tuple[Offender, ...]:
    """The first ``cap`` differing elements: value mismatches in index order, then zero-sign ones."""
    zero_sign = torch.nonzero((expected == 0) & (got == 0) & (torch.signbit(expected) != torch.signbit(got))).reshape(-1)
    idx = torch.cat([comp.mismatch_index, zero_sign])[:max(cap, 0)]
    n_val = comp.mismatch_index.numel()
    ulp = [int(comp.mismatch_ulp[k]) if k < n_val else 0 for k in range(idx.numel())]
    cls = [CLASSES[int(comp.mismatch_class[k])] if k < n_val else "signed_zero" for k in range(idx.numel())]
    return _offenders_at(case, idx, expected, got, pre, ulp, cls)


def _listed(case: Case, expected: torch.Tensor, got: torch.Tensor, pre: torch.Tensor, comp: Comparison, where: torch.Tensor,
            cls: str) -> tuple[int, tuple[Offender, ...]]:
    """The mismatches of ``comp`` selected by ``where`` (over ``comp.mismatch_index``): their count and
    the first ``TIE_CAP`` of them as offenders of class ``cls``."""
    k = torch.nonzero(where).reshape(-1)
    sel = comp.mismatch_index[k][:TIE_CAP]
    ulp = [int(u) for u in comp.mismatch_ulp[k][:TIE_CAP].tolist()]
    return int(where.sum()), _offenders_at(case, sel, expected, got, pre, ulp, [cls] * sel.numel())


def division_flip(pre: torch.Tensor, inputs: torch.Tensor, got: torch.Tensor, grid_round: Any) -> torch.Tensor:
    """True where a mismatching element is what a quotient off by at most ``APPROX_DIVISION_ULPS``
    gives: ``pre`` within that many fp32 ulps of a rounding boundary and ``got`` the other side's
    output (``ulp.other_side``, to 1 output ULP).  Exact ties are counted by ``exact_tie``, not here."""
    near = torch.isfinite(pre) & (inputs != 0) & near_tie(pre, grid_round, window=APPROX_DIVISION_ULPS) & ~exact_tie(pre, grid_round)
    other = other_side(pre, inputs, grid_round, got.dtype, window=APPROX_DIVISION_ULPS)
    close = torch.isfinite(other) & torch.isfinite(got)
    dist = torch.where(close, ulp_distance(torch.where(close, other, torch.zeros_like(other)), torch.where(close, got, torch.zeros_like(got))),
                       torch.full(got.shape, 2, dtype=torch.int64))
    return near & close & (dist <= 1)


def _tie_flips(case: Case, expected: torch.Tensor, got: torch.Tensor, pre: torch.Tensor, grid_round: Any,
               comp: Comparison) -> tuple[tuple[int, tuple[Offender, ...]], tuple[int, tuple[Offender, ...]]]:
    """Value mismatches at exact ties, and the division flips (``division_flip``): for each, their
    count and the first ``TIE_CAP`` of them."""
    idx = comp.mismatch_index
    if idx.numel() == 0:
        return (0, ()), (0, ())
    at_tie = exact_tie(pre[idx], grid_round)
    by_division = division_flip(pre[idx], case.flat_input()[idx].float(), got.reshape(-1)[idx], grid_round)
    return (_listed(case, expected, got, pre, comp, at_tie, "exact_tie"),
            _listed(case, expected, got, pre, comp, by_division, "division_flip"))


def match_case(backend: object, case: Case, fmt: str, *, cap: int = DEFAULT_CAP, **options) -> CaseResult:
    """Compare the backend with every reference variant on one case."""
    try:
        got = _run_backend(backend, case, fmt, options)
    except NotImplementedError as exc:
        return CaseResult(case.name, 0, 0, (), declined=f"{exc}"[:300])
    except Exception as exc:  # noqa: BLE001 - recorded, not swallowed: the row fails with it
        return CaseResult(case.name, case.numel, 0, (), error=f"{type(exc).__name__}: {exc}"[:500])
    results, ties = [], torch.zeros(case.numel, dtype=torch.bool)
    for v, call in reference_calls(fmt, options):
        expected, pre, grid_round = _reference(case, fmt, v.split("+")[0], call)
        ties |= near_tie(pre, grid_round) & torch.isfinite(pre)
        comp = compare(expected, got, pre, grid_round)
        same = bits_equal(expected, got)
        (n_ties, tie_list), (n_div, div_list) = _tie_flips(case, expected, got, pre, grid_round, comp)
        results.append(VariantResult(
            variant=v, numel=case.numel, mismatches=case.numel - comp.counts["exact"] + comp.signed_zero, counts=comp.counts, max_ulp=comp.max_ulp,
            bit_mismatches=int((~same).sum()), nan_bits=int((~same & torch.isnan(expected) & torch.isnan(got)).sum()),
            signed_zero=comp.signed_zero, offenders=_offenders(case, expected, got, pre, comp, cap),
            tie_flips=n_ties, tie_offenders=tie_list, division_flips=n_div, division_offenders=div_list,
        ))
    return CaseResult(case.name, case.numel, int(ties.sum()), tuple(results))


def match_variants(
    backend: object, fmt: str, *, seed: int = 0, n_ties: int = 200, n_split: int = 4, cap: int = DEFAULT_CAP,
    cases: Optional[Sequence[Case]] = None, mx_shuffles: int = MX_SHUFFLES, mx_random_blocks: int = MX_RANDOM_BLOCKS,
    **options,
) -> FormatMatch:
    """Run ``backend`` and every reference variant of ``fmt`` over the cases and compare.

    * ``seed``, ``n_ties``, ``n_split``, ``mx_shuffles``, ``mx_random_blocks``: passed to ``match_cases.build_cases`` (calibrated case
      only for a format in the backend's ``calibrated_only``);
    * ``cap``: offenders listed per variant and case (all are counted);
    * ``cases``: precomputed cases (to share them between backends);
    * ``options``: format options passed to both sides (``narrow_range``, ``unsigned``, ``block_size``).
    """
    if cases is None:
        only = fmt in getattr(backend, "calibrated_only", ())
        cases = build_cases(fmt, seed=seed, n_ties=n_ties, n_split=n_split, calibrated_only=only,
                            mx_shuffles=mx_shuffles, mx_random_blocks=mx_random_blocks, **options)
    name = getattr(backend, "name", type(backend).__name__)
    return FormatMatch(name, fmt, dict(options), tuple(match_case(backend, c, fmt, cap=cap, **options) for c in cases))


def summary_lines(m: FormatMatch, *, offenders: int = 0) -> list[str]:
    """Human-readable lines: per case and variant, value mismatches (bit-level differences apart)."""
    up = f"; up to exact-tie flips: {', '.join(f'{v} ({m.tie_flips(v)} flips)' for v in m.matched_up_to_ties)}" if m.matched_up_to_ties else ""
    up += ("; up to approximate-division flips: "
           + ", ".join(f"{v} ({m.tie_flips(v)} exact-tie, {m.division_flips(v)} near-tie)" for v in m.matched_up_to_division)
           if m.matched_up_to_division else "")
    named = [f"{v} = {' / '.join(upstream_rules(m.fmt, v, m.options))}" for v in m.matched if upstream_rules(m.fmt, v, m.options)]
    rules = f" (upstream rules: {'; '.join(named)})" if named else ""
    lines = [f"{m.backend} {m.fmt} {m.options or ''}: matched {list(m.matched) or 'none'}{up}{rules} ({m.numel} elements, {m.near_tie} near ties)"]
    for c in m.cases:
        if c.error:
            lines.append(f"  {c.case}: backend raised {c.error}")
            continue
        if c.declined:
            lines.append(f"  {c.case}: declined: {c.declined}")
            continue
        per = ", ".join(f"{v.variant}={v.mismatches} (max {v.max_ulp} ulp; bits {v.bit_mismatches}, nan-bits {v.nan_bits}, "
                        f"-0 {v.signed_zero}, exact-tie flips {v.tie_flips}, division flips {v.division_flips})" for v in c.variants)
        lines.append(f"  {c.case} [{c.numel} el, {c.near_tie} near ties]: {per}")
        for v in c.variants:
            for o in v.offenders[:offenders]:
                lines.append(f"    vs {v.variant}: expert {o.expert} [{o.row}, {o.col}] amax {o.amax_bits} x {o.input_bits} "
                             f"expected {o.expected_bits} got {o.got_bits} ({o.cls}, {o.ulp} ulp, pre_round {o.pre_round!r})")
    def flips(variant: str, listed: Any) -> list[str]:
        return [f"    {c.case} expert {o.expert} [{o.row}, {o.col}] ({o.cls}): amax {o.amax!r} x {o.input!r} ({o.input_bits}) "
                f"|x|/scale = {abs(o.pre_round)!r} expected {o.expected!r} got {o.got!r}"
                for c in m.cases for r in c.variants if r.variant == variant for o in listed(r)]

    for v in m.matched_up_to_ties:
        lines.append(f"  exact-tie flips vs {v} (IEEE rounds the tie to even; the backend went the other way):")
        lines += flips(v, lambda r: r.tie_offenders)
    for v in m.matched_up_to_division:
        lines.append(f"  flips within {APPROX_DIVISION_ULPS} fp32 ulps of a rounding boundary vs {v} (an approximate division's quotient crossed it):")
        lines += flips(v, lambda r: r.tie_offenders + r.division_offenders)
    return lines


def tie_probe(backend: object) -> dict[str, Any]:
    """Run ``reference.nvfp4.nvfp4_tie_probe`` through ``backend`` (one fp32 block ``[bamax, x, 0...]``
    with global amax ``g``): the IEEE answer, the backend's, and which way it rounded the tie."""
    p = nvfp4_tie_probe()
    w = torch.zeros(1, 16, dtype=torch.float32)
    w[0, 0], w[0, 1] = p["block_amax"], p["x"]
    dev = backend_device(backend)
    got = backend.fake_quant([w.to(dev)], torch.tensor([p["global_amax"]], device=dev), "nvfp4")[0].cpu()
    y = float(got[0, 1])
    way = "to even (IEEE)" if y == p["y_ieee"] else "away from even" if y == p["y_quotient_above"] else "neither neighbour"
    return {**p, "y_backend": y, "y_backend_hex": probes.hex_bits(got[0, 1:2])[0], "rounded": way}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """CLI: print the match of one backend per format; ``--json`` writes every record."""
    p = argparse.ArgumentParser(prog="python -m moe_fq_parity.harness.sections.external.variant_match", description=__doc__.split("\n")[0])
    p.add_argument("--backend", required=True, help="a backend name (moe-fq-parity list: modelopt, modelopt-eager, te, te-current, "
                   "torchao, torchao-ceil, torchao-even, torchao-rceil, the built-ins), module:object, or a family "
                   "(" + "; ".join(f"{k}: {' '.join(v)}" for k, v in FAMILIES.items()) + ")")
    p.add_argument("--format", dest="fmt", action="append", choices=reference.FORMATS, help="format (repeatable); default: all the backend runs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--n-ties", type=at_least(1), default=200)
    p.add_argument("--n-split", type=at_least(0), default=4)
    p.add_argument("--mx-shuffles", type=at_least(0), default=MX_SHUFFLES, help="MX-style formats: permutations in blocks/all_bf16")
    p.add_argument("--mx-random-blocks", type=at_least(0), default=MX_RANDOM_BLOCKS,
                   help="MX-style formats: blocks per random case (a multiple of 8)")
    p.add_argument("--cap", type=at_least(0), default=DEFAULT_CAP)
    p.add_argument("--show", type=at_least(0), default=4, help="offenders printed per variant and case")
    p.add_argument("--narrow-range", action="store_true", help="INT formats: narrow range")
    p.add_argument("--json", type=json_path, help="write the full records (offenders included) to this file")
    p.add_argument("--tie-probe", action="store_true",
                   help="NVFP4: also run the exact-tie probe (reference.nvfp4.nvfp4_tie_probe) and print what the backend gives")
    args = p.parse_args(argv)
    if args.mx_shuffles < 0 or args.mx_random_blocks < 0 or args.mx_random_blocks % 8:
        p.error("--mx-shuffles must be >= 0 and --mx-random-blocks a non-negative multiple of 8")
    names = FAMILIES.get(args.backend, (args.backend,))
    results: list[dict[str, Any]] = []
    shared: dict[str, list[Case]] = {}
    for name in names:
        try:
            backend, why = load_backend(name)
        except ValueError as exc:  # malformed or unknown: a usage error
            p.error(f"--backend: {exc}")
        if backend is None:
            print(f"error: {name}: unavailable: {why}", file=sys.stderr)
            if len(names) > 1 and name != names[0]:
                continue
            return 2
        foreign = [f for f in args.fmt or () if f not in backend.formats]
        if foreign and len(names) == 1:
            p.error(f"--format: {getattr(backend, 'name', name)} does not run {foreign}; it runs {sorted(backend.formats)}")
        for fmt in args.fmt or sorted(backend.formats):
            if len(names) > 1 and fmt not in backend.formats:
                print(f"{getattr(backend, 'name', name)} {fmt}: not run: {name} has no {fmt} path")
                continue
            probe = getattr(backend, "format_available", None)
            fok, fwhy = probe(fmt) if callable(probe) else (True, "")
            if not fok:
                print(f"{getattr(backend, 'name', name)} {fmt}: not run here: {fwhy}")
                continue
            opts = {"narrow_range": True} if args.narrow_range and reference.format_spec(fmt).option("narrow_range") else {}
            cases = None
            if fmt not in getattr(backend, "calibrated_only", ()) and not opts:
                if fmt not in shared:
                    shared[fmt] = build_cases(fmt, seed=args.seed, n_ties=args.n_ties, n_split=args.n_split,
                                              mx_shuffles=args.mx_shuffles, mx_random_blocks=args.mx_random_blocks)
                cases = shared[fmt]
            m = match_variants(backend, fmt, seed=args.seed, n_ties=args.n_ties, n_split=args.n_split, cap=args.cap,
                               cases=cases, mx_shuffles=args.mx_shuffles, mx_random_blocks=args.mx_random_blocks, **opts)
            print("\n".join(summary_lines(m, offenders=args.show)))
            results.append(m.to_json())
            if args.tie_probe and fmt == "nvfp4":
                probe_result = tie_probe(backend)
                print("tie probe: " + ", ".join(f"{k}={v!r}" for k, v in probe_result.items()))
                results.append({"backend": getattr(backend, "name", name), "tie_probe": probe_result})
    if args.json:
        with open(args.json, "w") as fh:
            fh.write(dumps(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
