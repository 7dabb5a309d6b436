"""The case catalogue and its suites.

* ``smoke``   -- a handful of small cases per format (ties, near ties per channel in fp32, the
  ``limits`` amax) and specials: seconds on a CPU, and every built-in mutant dies on them.
* ``ci``      -- the CPU tier: every format x variant x distribution x amax policy x layout on small
  (often odd) shapes, N in {4, 8, 16}, plus experts larger than the kernel's tiles in both
  dimensions (``CI_LARGE``); sized for ~2 minutes on 2 cores with the Triton interpreter.
* ``ultra``   -- the Ultra cases: upstream production N=32 ``[5120, 8192]`` bf16 and the routed
  Ultra fc1/fc2 shapes at N = 512 experts / EP 32.
* ``nightly`` -- everything (GPU): ``ci`` plus N in {4..128} sweeps, Nemotron Nano/Super/Ultra routed
  shapes (N from experts / EP), ragged and empty experts at large N, and ``ultra``.

Case order is fixed (catalogue order), so pytest ids and xdist scheduling are stable.  The suites
loop over the registered formats (``reference.FORMATS``) and ask the registry and the distributions
what applies (granularities, options, which distributions a format takes); every case they build
must then pass ``cases.rules``: a rejection is a bug in the catalogue (a typo), raised as
``CatalogueError``, never a silently smaller suite.
"""

from __future__ import annotations

import fnmatch
from enum import Enum
from itertools import product
from typing import Callable, Iterable, Mapping, TypeVar

from moe_fq_parity.reference import FORMATS, format_spec, variants

from . import block_scaled
from .amax import LIMIT_AMAX
from .case import GRANULARITIES, Case
from .distributions import DISTRIBUTIONS
from .rules import make_case
from .shapes import NEMOTRON, NEMOTRON_EXPERTS, N_VALUES, ODD_SHAPES, ULTRA_PRODUCTION

SLOW_NUMEL = 1 << 22
"""Cases above 4M elements (or with N >= 128) are marked ``slow``."""
GPU_NUMEL = 1 << 26
"""Cases above 64M elements are marked ``gpu`` (too large for the CPU tier)."""


def _default(fmt: str) -> str:
    return variants(fmt)[0]


class CatalogueError(AssertionError):
    """A suite builds a case that ``cases.rules`` rejects: a bug in the catalogue (e.g. a typo)."""


def _granularities(fmt: str) -> tuple[str, ...]:
    """The case granularities the format takes, in ``GRANULARITIES`` order."""
    return tuple(g for g in GRANULARITIES if g in format_spec(fmt).amax_granularities)


def _applies(dist: str, fmt: str) -> bool:
    """Whether the distribution builds data for the format (the one rejection a suite expects); an
    unknown name goes on to the rules, which reject it loudly."""
    return dist not in DISTRIBUTIONS or DISTRIBUTIONS[dist].applies_to(fmt)


def _amax_formats() -> list[str]:
    """The registered formats that take an amax (the generic loops); ``cases.block_scaled`` adds the
    formats with scales from the data and the 2D tiles."""
    return [f for f in FORMATS if format_spec(f).takes_amax]


def _taking(option: str) -> list[str]:
    """The registered formats whose default variant takes ``option``."""
    return [f for f in FORMATS if option in {o.name for o in format_spec(f).options_for()}]


def _entry(**kw) -> list[Case]:
    """One catalogue entry, ``[make_case(**kw)]``; a case the rules reject raises ``CatalogueError``."""
    try:
        return [make_case(**kw)]
    except ValueError as exc:
        raise CatalogueError(f"the catalogue built an invalid case from {kw}: {exc}") from exc


def _block_scaled(name: str) -> list[Case]:
    """``cases.block_scaled``'s entries for suite ``name``, validated like every entry."""
    return [c for kw in block_scaled.SUITE_HOOKS[name]() for c in _entry(**kw)]


def _unique(cases: Iterable[Case]) -> tuple[Case, ...]:
    seen: dict[str, Case] = {}
    for c in cases:
        seen.setdefault(c.id, c)
    return tuple(seen.values())


def smoke() -> tuple[Case, ...]:
    """Per format: one small stacked case, its ties case, its ``limits`` amax case and, where the
    format takes per-channel amax, an fp32 per-channel near-tie case (fp32 output shows every
    one-ulp difference of an op order); plus a ragged special case.  Small (21k elements) and
    enough to kill every built-in mutant (``moe-fq-parity selftest --suite smoke``)."""
    out: list[Case] = []
    for fmt in _amax_formats():
        v = _default(fmt)
        out += _entry(fmt=fmt, variant=v, granularity="per_expert", layout="stacked", n=4, shape=(8, 40), dist="outliers")
        out += _entry(fmt=fmt, variant=v, granularity="per_expert", layout="list", n=4, shape=(8, 40), dist="ties", amax="design")
        out += _entry(fmt=fmt, variant=v, granularity="per_expert", layout="stacked", n=len(LIMIT_AMAX), shape=(8, 40), dist="outliers", amax="limits")
        if "per_channel" in _granularities(fmt) and _applies("neartie", fmt):
            out += _entry(fmt=fmt, variant=v, granularity="per_channel", layout="stacked", n=4, shape=(8, 40), dtype="fp32", dist="neartie",
                          amax="design")  # fmt: skip
    out += _entry(fmt="int8", variant="cuda", granularity="per_expert", layout="ragged", n=4, shape=(7, 33), empty=1, dist="special", amax="design")
    return _unique(out + _block_scaled("smoke"))


_CI_DISTS = (("normal", "max"), ("normal", "clip"), ("outliers", "max"), ("spread", "max"), ("ties", "design"),
             ("outties", "design"), ("neartie", "design"), ("edges", "design"), ("special", "design"), ("nan", "max"), ("zeros", "max"),
             ("arange", "max"), ("spread", "tiny"), ("outliers", "zero"), ("outliers", "limits"))


_CI_PER_CHANNEL = ("ties", "neartie", "edges", "special")
"""Distributions ``ci`` also runs per channel (besides the ``limits`` amax policy)."""
_CI_N = {"limits": len(LIMIT_AMAX)}
"""Experts of a ``ci`` case per amax policy (default 4): ``limits`` gives every value to an expert."""


CI_LARGE = (9, 2548)
"""The ``ci`` experts that span several kernel tiles in both dimensions on a GPU: 2548 columns are
more than the widest tile of any kernel configuration (2048), and for the 512-wide tiles the kernel
picks for such rows, 9 rows are more than any configuration's tile rows (INT 2, FP8 and NVFP4 4,
backward 8, from its 1,024-4,096-element tiles); 22,932 elements, more than the largest tile
(4,096).  2548 is no multiple of 16 (a short NVFP4 block) nor of 512 (a partial column tile); 9
rows leave a partial row tile.  ``tests/cases`` checks this against ``kernels/launch.py``'s
configurations.  (The interpreter's 65,536-element tiles hold such an expert whole: multi-tile
programs under the interpreter are ``tests/kernels``' job.)"""


def _large(fmt: str) -> list[Case]:
    """Cases whose experts run many programs each (``CI_LARGE``): stacked ``N = 2`` with the format's
    last amax granularity (per channel where it takes one), and ragged ``N = 4`` per expert (an
    empty expert, and experts of different tile counts: the programs past a small expert's tiles
    have nothing to do).  One stacked case per format: these experts cost as much as the rest of
    the format's ``ci`` cases."""
    v, out = _default(fmt), []
    out += _entry(fmt=fmt, variant=v, granularity=_granularities(fmt)[-1], layout="stacked", n=2, shape=CI_LARGE, dist="outliers")
    out += _entry(fmt=fmt, variant=v, granularity="per_expert", layout="ragged", n=4, shape=CI_LARGE, empty=1, dist="outliers")
    return out


def ci() -> tuple[Case, ...]:
    """The CPU tier (see the module docstring)."""
    out: list[Case] = list(smoke())
    for fmt in _amax_formats():
        v = _default(fmt)
        for (dist, amax), gran in product(_CI_DISTS, _granularities(fmt)):
            if (gran == "per_channel" and dist not in _CI_PER_CHANNEL and amax != "limits") or not _applies(dist, fmt):
                continue
            out += _entry(fmt=fmt, variant=v, granularity=gran, layout="stacked", n=_CI_N.get(amax, 4), shape=(16, 48), dist=dist, amax=amax)
        for layout, (n, shape, empty) in (("list", (8, (33, 47), 1)), ("ragged", (16, (7, 13), 2))):
            out += _entry(fmt=fmt, variant=v, granularity="per_expert", layout=layout, n=n, shape=shape, empty=empty, dist="outliers")
        out += _large(fmt)
        for var in variants(fmt)[1:]:
            for dist, amax in (("ties", "design"), ("neartie", "design"), ("outliers", "max"), ("special", "design")):
                if not _applies(dist, fmt):
                    continue
                out += _entry(fmt=fmt, variant=var, granularity="per_expert", layout="stacked", n=4, shape=(16, 48), dist=dist, amax=amax)
        for dtype in ("fp16", "fp32"):
            out += _entry(fmt=fmt, variant=v, granularity="per_expert", layout="list", n=4, shape=(16, 40), dtype=dtype, dist="ties", amax="design")
    for fmt in _taking("narrow_range"):
        for opt, dist in product((("narrow_range", True),), ("ties", "edges")):
            out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="stacked", n=4, shape=(16, 48), dist=dist, amax="design",
                          options=(opt,))
        if fmt in _taking("unsigned"):
            out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_channel", layout="stacked", n=4, shape=(16, 48), dist="ties", amax="design",
                          options=(("unsigned", True),))
    for fmt in _taking("block_size"):
        out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="list", n=4, shape=(16, 72), dist="ties", amax="design",
                      options=(("block_size", 32),))
    return _unique(out + _block_scaled("ci"))


def _nemotron_cases() -> list[Case]:
    out: list[Case] = []
    ep = {"nano": 4, "super": 16, "ultra": 32}
    for model, shapes in NEMOTRON.items():
        n = NEMOTRON_EXPERTS[model] // ep[model]
        for (_, shape), fmt in product(shapes.items(), _amax_formats()):
            out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="stacked", n=n, shape=shape, dist="outliers")
        for fmt in _amax_formats():
            out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="stacked", n=n, shape=shapes["fc1"], dist="ties", amax="design")
    return out


def ultra() -> tuple[Case, ...]:
    """Upstream Ultra production case (N=32, [5120, 8192] bf16) and the routed Ultra shapes."""
    n, shape = ULTRA_PRODUCTION
    out: list[Case] = []
    for fmt in _amax_formats():
        out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="stacked", n=n, shape=shape, dist="outliers")
    n_routed = NEMOTRON_EXPERTS["ultra"] // 32
    for (_, s), fmt in product(NEMOTRON["ultra"].items(), _amax_formats()):
        out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="stacked", n=n_routed, shape=s, dist="outliers")
    return _unique(out + _block_scaled("ultra"))


def nightly() -> tuple[Case, ...]:
    """Everything (see the module docstring)."""
    out: list[Case] = list(ci())
    for fmt, n in product(_amax_formats(), N_VALUES):
        out += _entry(fmt=fmt, variant=_default(fmt), granularity="per_expert", layout="stacked", n=n, shape=(512, 1024), dist="normal")
    for fmt, var in ((f, v) for f in _amax_formats() for v in variants(f)):
        for (dist, amax), gran, shape in product(_CI_DISTS, _granularities(fmt), ODD_SHAPES[2:]):
            if not _applies(dist, fmt):
                continue
            out += _entry(fmt=fmt, variant=var, granularity=gran, layout="stacked", n=8, shape=shape, dist=dist, amax=amax)
        out += _entry(fmt=fmt, variant=var, granularity="per_expert", layout="ragged", n=64, shape=(256, 200), empty=5, dist="outliers")
    out += _nemotron_cases()
    out += ultra()
    return _unique(out + _block_scaled("nightly"))


class Suite(str, Enum):
    """The suites: the one list of suite names.  Every per-suite table (cases here; the MoE, dist,
    external and self-test sections' sizes) is keyed by these members through ``suite_table``, and
    compares and hashes equal to the plain name (``Suite.CI == "ci"``)."""

    SMOKE = "smoke"
    CI = "ci"
    NIGHTLY = "nightly"
    ULTRA = "ultra"

    def __str__(self) -> str:
        return self.value


SUITE_NAMES: tuple[str, ...] = tuple(s.value for s in Suite)

_T = TypeVar("_T")


def parse_suite(name: object) -> Suite:
    """``Suite(name)``, or ``ValueError`` naming the argument and the known suites."""
    try:
        return Suite(name)
    except ValueError:
        raise ValueError(f"unknown suite {name!r}; known: {list(SUITE_NAMES)}") from None


def suite_table(table: Mapping[str, _T], *, what: str, partial: bool = False) -> dict[Suite, _T]:
    """``table`` keyed by ``Suite`` members; ``ValueError`` on a key that is no suite, or (unless
    ``partial``) a suite missing, so a per-suite table cannot drift from the suite list."""
    unknown = [k for k in table if k not in SUITE_NAMES]
    missing = [s for s in SUITE_NAMES if s not in table]
    if unknown or (missing and not partial):
        raise ValueError(f"{what}: keys must be the suites {list(SUITE_NAMES)}; unknown {unknown}, missing {missing}")
    return {Suite(k): v for k, v in table.items()}


SUITES: dict[Suite, Callable[[], tuple[Case, ...]]] = suite_table(
    {"smoke": smoke, "ci": ci, "nightly": nightly, "ultra": ultra}, what="cases.catalogue.SUITES")


def suite(name: str) -> tuple[Case, ...]:
    """Cases of suite ``name`` (``ValueError`` naming the known suites otherwise)."""
    return SUITES[parse_suite(name)]()


def select(cases: Iterable[Case], *, patterns: Iterable[str] = (), formats: Iterable[str] = ()) -> tuple[Case, ...]:
    """Cases whose id matches any glob of ``patterns`` (all when empty) and whose format is in ``formats``."""
    pats, fmts = list(patterns), set(formats)
    return tuple(
        c for c in cases
        if (not pats or any(fnmatch.fnmatchcase(c.id, p) for p in pats)) and (not fmts or c.fmt in fmts)
    )


def marks(case: Case) -> tuple[str, ...]:
    """pytest markers a case carries: ``slow`` (large or N >= 128), ``gpu`` (too large for a CPU)."""
    numel = case.n * case.shape[0] * case.shape[1]
    out = []
    if numel > SLOW_NUMEL or case.n >= 128:
        out.append("slow")
    if numel > GPU_NUMEL:
        out.append("gpu")
    return tuple(out)
