"""Report section ``external``: which reference variant each external backend matches, per format.

For every backend of ``harness.backends.registry.BACKENDS`` that can run here, and every format it runs:

* a ``variants`` row per format (INT: wide and narrow range): the reference variants it matches
  bit for bit, the mismatch count against each, and the variant it is expected to match
  (``EXPECTED``).  The row passes when the expected variant is among the matched ones; it fails
  when the reference has no such variant or the backend differs from it (first offenders in the
  message, all of them in ``python -m moe_fq_parity.harness.sections.external.variant_match``).
  One exception, declared by the backend and never assumed: for a format in the backend's
  ``approximate_division`` (Model-Optimizer's Triton NVFP4 kernel divides with ``div.full.f32``),
  a variant whose only mismatches are exact-tie flips (``variant_match.exact_tie``) or flips within
  the division's error bound of a rounding boundary (``variant_match.division_flip``) passes, and
  the row says how many flips there were (``tie_flips``; every one in ``variant_match --show``);
* STE rows (both modes, per expert and per channel), the clip-rule fingerprint
  (``checks.clip_rule_row``: which ``reference.CLIP_RULES`` the clipped backward follows) and
  calibration rows, where the backend has them.

A backend that cannot run here gives one ``skip`` row with its reason; a format it cannot run
here, one ``skip`` row per format.

``prepare()`` (called by ``harness.sections.processes.start_sections`` in the section's own process while
the run's cases still run) builds or loads Model-Optimizer's CUDA extensions there
(``harness.backends.modelopt_backend.prepare_extensions``, without initialising CUDA), so a first run on a host
compiles them beside the cases instead of inside the section; the notes say, per extension,
whether it was compiled or loaded, in which phase and how long it took.
"""

from __future__ import annotations

import time
from typing import Any, Optional

import torch

from moe_fq_parity import reference
from moe_fq_parity.cases.catalogue import parse_suite, suite_table
from moe_fq_parity.harness.backends.modelopt_backend import BUILDS, modelopt_version, prepare_extensions
from moe_fq_parity.harness.backends.registry import BACKENDS
from moe_fq_parity.harness.backends.te_backend import te_version
from moe_fq_parity.harness.backends.torchao_backend import torchao_version
from moe_fq_parity.harness.core.contract import backend_available
from moe_fq_parity.harness.core.repro import variant_match_command
from moe_fq_parity.harness.sections import Section, SectionRow

from .checks import calibration_rows, clip_rule_row, ste_rows
from .match_cases import MX_RANDOM_BLOCKS, MX_SHUFFLES, Case, build_cases
from .registry import resolve
from .variant_match import APPROX_DIVISION_ULPS, FormatMatch, match_variants

SUITE_SIZES: dict[str, dict[str, int]] = suite_table({
    "smoke": {"n_ties": 40, "n_split": 2, "mx_shuffles": 0, "mx_random_blocks": 512},
    "ci": {"n_ties": 100, "n_split": 3, "mx_shuffles": 1, "mx_random_blocks": 2048},
    "nightly": {"n_ties": 2000, "n_split": 8, "mx_shuffles": MX_SHUFFLES, "mx_random_blocks": MX_RANDOM_BLOCKS},
    "ultra": {"n_ties": 2000, "n_split": 8, "mx_shuffles": MX_SHUFFLES, "mx_random_blocks": MX_RANDOM_BLOCKS},
}, what="external SUITE_SIZES")
"""Near-tie constructions and variant-splitting amax per suite; for the formats without amax (MX),
the ``blocks/all_bf16`` permutations and the random blocks (``match_cases.mx_cases``: the boundary and
special-block cases are complete in every suite).  MX elements per format: smoke ~0.2M, ci ~0.37M,
nightly ~1.2M (``variant_match``'s defaults)."""

EXPECTED: dict[tuple[str, str], str] = {
    **{("modelopt", f): "cuda" for f in ("int8", "int4", "fp8_e4m3")},
    ("modelopt", "nvfp4"): "modelopt_static",
    **{("modelopt-eager", f): "eager" for f in ("int8", "int4", "fp8_e4m3")},
    ("te", "fp8_e4m3"): "cuda",
    ("te-current", "fp8_e4m3"): "te_current",
    ("te", "nvfp4"): "te",
    ("torchao", "nvfp4"): "torchao",
    **{("modelopt-mx", f): "modelopt" for f in ("mxfp8", "mxfp4")},
    ("modelopt-int4-block", "int4_group"): "eager",
    **{(f"torchao-{m}" if m != "floor" else "torchao", f): f"torchao_{m}" for m in ("floor", "ceil", "even") for f in ("mxfp8", "mxfp4")},
    **{("torchao-rceil", f): "torchao_rceil" for f in ("mxfp8", "mxfp4")},
}
"""The reference variant each external path is expected to match (docs/measured.md §5-§8 and the
variants' docstrings).  ``te`` FP8 is handed the ``cuda`` scale (tiny amax as 1) by its adapter;
``te-current`` computes ``RN(448/amax)`` itself with no tiny-amax rule, which is ``cuda`` only for
amax > 2**-24 (the ``per_case`` column shows the split: ``calibrated`` vs ``calibrated_tiny``).
torchao's four MX modes are expected to match ``torchao_<mode>`` (``reference.mx``: FLOOR/CEIL/EVEN differ
from the OCP-named variants on Inf and code-0 blocks; the RCEIL CPU path divides by the element max
where ``te`` multiplies by its rounded reciprocal, which differs for MXFP4 at the fp32 subnormal
edge); Model-Optimizer's MXFP4 matches ``modelopt``, whose MXFP4 element rule is its
``mxfp4_tensor.py`` (ties toward zero, ``+0`` written as ``-0``)."""

COLUMNS = ["backend", "format", "options", "version", "expected", "matched", "mismatches", "tie_flips", "per_case", "elements", "near_ties"]


def _options(fmt: str) -> list[dict[str, Any]]:
    return [{}, {"narrow_range": True}] if reference.format_spec(fmt).option("narrow_range") else [{}]


def _repro(name: str, fmt: str, seed: int, sizes: dict[str, int], options: dict[str, Any]) -> str:
    mx = None if reference.format_spec(fmt).takes_amax else (sizes.get("mx_shuffles", MX_SHUFFLES), sizes.get("mx_random_blocks", MX_RANDOM_BLOCKS))
    return variant_match_command(name, fmt, seed, sizes["n_ties"], sizes["n_split"], narrow_range=bool(options.get("narrow_range")), mx_sizes=mx)


def variants_row(m: FormatMatch, expected: Optional[str], repro: str, *, approximate_division: bool = False,
                 version: str = "-") -> SectionRow:
    """The ``variants`` row of one backend and format (see the module docstring); ``version``: the
    installed version of the upstream package the backend runs."""
    opt = ",".join(f"{k}={v}" for k, v in sorted(m.options.items())) or "default"
    rid = f"external/{m.backend}/{m.fmt}/variants" + ("" if opt == "default" else f"/{opt}")
    fields = {
        "backend": m.backend, "format": m.fmt, "options": opt, "version": version, "expected": expected or "-",
        "matched": ", ".join(m.matched) or "none",
        "mismatches": "; ".join(f"{v}={m.mismatches(v)}" for v in m.variant_names),
        "tie_flips": "; ".join(f"{v}={m.tie_flips(v)}" + (f" (+{m.division_flips(v)} near)" if m.division_flips(v) else "")
                               for v in m.variant_names if m.tie_flips(v) or m.division_flips(v)) or "0",
        "per_case": "; ".join(f"{c.case}: {', '.join(v.variant for v in c.variants if v.matches) or 'none'}"
                              for c in m.cases if not (c.error or c.declined)),
        "elements": m.numel, "near_ties": m.near_tie,
    }
    matched = [", ".join(m.matched)] if m.matched else []
    if m.matched_up_to_ties:
        matched.append("up to exact-tie flips: " + ", ".join(m.matched_up_to_ties))
    if m.matched_up_to_division:
        matched.append("up to approximate-division flips: " + ", ".join(m.matched_up_to_division))
    fields["matched"] = " | ".join(matched) or "none"
    if m.declined:
        fields["declined"] = " | ".join(m.declined)[:300]
    if m.errors:
        return SectionRow(rid, "fail", fields, repro, "backend raised: " + " | ".join(m.errors)[:400])
    if expected is not None and expected not in m.variant_names:
        return SectionRow(rid, "fail", fields, repro,
                          f"the reference has no variant {expected!r} (known: {list(m.variant_names)}); {_first(m, None)}")
    ok = expected in m.matched if expected is not None else bool(m.matched)
    if not ok and approximate_division and expected in m.matched_up_to_ties:
        return SectionRow(rid, "pass", fields, repro,
                          f"{m.tie_flips(expected)} exact E2M1 ties rounded away from even (the kernel's approximate "
                          f"fp32 division); every other element matches {expected}")
    if not ok and approximate_division and expected in m.matched_up_to_division:
        return SectionRow(rid, "pass", fields, repro,
                          f"{m.tie_flips(expected)} exact and {m.division_flips(expected)} near E2M1 ties (within "
                          f"{APPROX_DIVISION_ULPS} fp32 ulps) rounded to the other side (the kernel's approximate fp32 "
                          f"division); every other element matches {expected}")
    return SectionRow(rid, "pass" if ok else "fail", fields, repro, "" if ok else _first(m, expected))


def _first(m: FormatMatch, variant: Optional[str]) -> str:
    """The first offenders against ``variant`` (or the closest variant), as text."""
    if variant is None:
        variant = min(m.variant_names, key=lambda v: m.mismatches(v) or 0)
    out = []
    for c in m.cases:
        for v in c.variants:
            if v.variant == variant:
                out += [f"{c.case}: amax {o.amax_bits} x {o.input_bits} -> {o.got_bits}, {variant} {o.expected_bits} ({o.cls})" for o in v.offenders[:2]]
    return f"vs {variant}: " + "; ".join(out[:6]) if out else f"vs {variant}: no offenders listed"


def _version(obj: object) -> str:
    """The installed version of the upstream package behind an external backend."""
    probe = getattr(obj, "upstream_version", None)
    return (probe() or "not installed") if callable(probe) else "-"


def backend_rows(name: str, spec: str, seed: int, sizes: dict[str, int], device: str, cache: dict) -> list[SectionRow]:
    """All rows of one external backend (``spec``: its ``module:object``)."""
    obj = resolve(spec)
    ok, why = backend_available(obj)
    if ok and device == "cpu" and getattr(obj, "device", "cpu") != "cpu":
        ok, why = False, f"section run with device=cpu; {name} runs on {obj.device}"
    if not ok:
        return [SectionRow(f"external/{name}", "skip", {"backend": name, "version": _version(obj)}, message=why)]
    rows: list[SectionRow] = []
    for fmt in [f for f in reference.FORMATS if f in obj.formats]:
        fok, fwhy = obj.format_available(fmt) if hasattr(obj, "format_available") else (True, "")
        if not fok:
            rows.append(SectionRow(f"external/{name}/{fmt}", "skip", {"backend": name, "format": fmt, "version": _version(obj)}, message=fwhy))
            continue
        for opts in _options(fmt):
            only = fmt in getattr(obj, "calibrated_only", ())
            key = (fmt, only, tuple(sorted(opts.items())))
            if key not in cache:
                cache[key] = build_cases(fmt, seed=seed, calibrated_only=only, **sizes, **opts)
            cases: list[Case] = cache[key]
            m = match_variants(obj, fmt, cases=cases, **opts)
            rows.append(variants_row(m, EXPECTED.get((name, fmt)), _repro(name, fmt, seed, sizes, opts),
                                     approximate_division=fmt in getattr(obj, "approximate_division", ()),
                                     version=_version(obj)))
        if hasattr(obj, "ste_backward"):
            rows += ste_rows(obj, fmt, seed, f"external/{name}")
            if reference.format_spec(fmt).block is None:
                rows.append(clip_rule_row(obj, fmt, seed, f"external/{name}"))
    rows += calibration_rows(obj, seed, f"external/{name}")
    return rows


PREPARED: list[str] = []
"""What ``prepare()`` did in this process (empty when it was not called)."""


def prepare() -> None:
    """Before the section's turn: build or load the Model-Optimizer CUDA extensions (see the module
    docstring); never initialises CUDA, never raises (a failed build is reported by the rows)."""
    t0 = time.perf_counter()
    try:
        done = prepare_extensions()
    except Exception as exc:  # noqa: BLE001 - the section's rows report what cannot run
        done = f"failed: {type(exc).__name__}: {exc}"[:200]
    PREPARED.append(f"{done} [{time.perf_counter() - t0:.1f} s]")


def run(suite: str, seed: int, device: str) -> Section:
    """Section runner (``harness.sections.SECTION_RUNNERS["external"]``)."""
    sizes = SUITE_SIZES[parse_suite(suite)]
    cache: dict = {}
    rows: list[SectionRow] = []
    for name, spec in BACKENDS.items():
        rows += backend_rows(name, spec, seed, sizes, device, cache)
    notes = (f"nvidia-modelopt {modelopt_version() or 'not installed'}; transformer_engine {te_version() or 'not importable'}; "
             f"torchao {torchao_version() or 'not installed'}; "
             f"torch {torch.__version__}; 'modelopt' = CUDA extension (INT, FP8) and Triton (NVFP4) path, "
             f"'modelopt-eager' = its eager torch code on CPU; suite {suite}: {sizes}")
    if BUILDS:
        notes += "; Model-Optimizer CUDA extensions: " + ", ".join(str(b) for b in BUILDS.values())
    elif PREPARED:
        notes += f"; prepare: {PREPARED[-1]}"
    return Section("external", "External implementations vs reference variants", COLUMNS, rows, notes)
