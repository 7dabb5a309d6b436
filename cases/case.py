"""The ``Case``: a small declarative record naming one parity experiment, and its stable id.

A case id reads like a path and is the same key everywhere (pytest id, JSON key, HTML anchor)::

    {fmt}.{variant}[+opt..]/{granularity}/{layout}/N{n}/{out}x{in}[.{dtype}][+e{empty}]/{dist}[@{amax}]/s{seed}

e.g. ``fp8_e4m3.cuda/per_expert/stacked/N32/5120x8192/outliers/s0`` or
``int8.cuda+narrow/per_channel/ragged/N4/40x33+e1/ties@design/s1``.  ``dtype`` is omitted for bf16,
``@amax`` for the calibrated default ``max``.  ``Case.from_id`` parses an id back, so any case
(catalogue or fuzz-generated) can be rerun exactly from its id.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from moe_fq_parity.reference import FORMATS, variants

GRANULARITIES = ("per_expert", "per_channel")
LAYOUTS = ("list", "stacked", "ragged")
DTYPES = ("bf16", "fp16", "fp32")
AMAX_POLICIES = ("max", "clip", "tiny", "zero", "design")
"""``max``: calibrated max |x| (finite values); ``clip``: a data value below the max, so values
clip and some equal amax; ``tiny``: amax around 2**-24; ``zero``: amax 0 on every other expert;
``design``: the amax the distribution constructed (tie distributions)."""

OPTION_CODES = {"narrow": ("narrow_range", True), "unsigned": ("unsigned", True)}
"""Id suffix -> backend option; ``bs{k}`` in the id means ``block_size=k``."""


@dataclass(frozen=True)
class Case:
    """One experiment: what to quantize, how, and with which data.

    * ``fmt``/``variant``: a format of ``reference.FORMATS`` and one of ``reference.variants(fmt)``.
    * ``granularity``: ``per_expert`` (amax ``[N]``) or ``per_channel`` (amax ``[N, out]``).
    * ``layout``: ``list`` (N separate tensors), ``stacked`` (views of one ``[N, out, in]``),
      ``ragged`` (experts of different shapes).
    * ``n``, ``shape``: number of experts and the (largest) per-expert ``(out, in)``.
    * ``dtype``: ``bf16``/``fp16``/``fp32``; ``empty``: how many experts have 0 rows.
    * ``dist``: a name from ``cases.distributions.DISTRIBUTIONS``; ``amax``: an ``AMAX_POLICIES`` name.
    * ``seed``: the case's seed index (the data seed is ``global seed + crc32(id)``).
    * ``options``: sorted ``(name, value)`` backend options (``narrow_range``, ``unsigned``, ``block_size``).
    """

    fmt: str
    variant: str
    granularity: str
    layout: str
    n: int
    shape: tuple[int, int]
    dist: str
    amax: str = "max"
    dtype: str = "bf16"
    empty: int = 0
    seed: int = 0
    options: tuple[tuple[str, object], ...] = field(default=())

    def __post_init__(self) -> None:
        from .distributions import DISTRIBUTIONS, supports

        problems = []
        if self.fmt not in FORMATS:
            problems.append(f"fmt={self.fmt!r} not in {FORMATS}")
        elif self.variant not in variants(self.fmt):
            problems.append(f"variant={self.variant!r} not in {variants(self.fmt)}")
        if self.granularity not in GRANULARITIES:
            problems.append(f"granularity={self.granularity!r} not in {GRANULARITIES}")
        if self.fmt == "nvfp4" and self.granularity != "per_expert":
            problems.append("nvfp4 takes a per-expert global amax only")
        if self.layout not in LAYOUTS:
            problems.append(f"layout={self.layout!r} not in {LAYOUTS}")
        if self.n < 1:
            problems.append(f"n={self.n} must be >= 1")
        if len(self.shape) != 2 or min(self.shape) < 1:
            problems.append(f"shape={self.shape} must be two positive ints")
        if self.dtype not in DTYPES:
            problems.append(f"dtype={self.dtype!r} not in {DTYPES}")
        if not 0 <= self.empty < self.n:
            problems.append(f"empty={self.empty} must be in [0, n)")
        if self.empty and self.layout == "stacked":
            problems.append("a stacked layout cannot hold empty experts")
        if self.granularity == "per_channel" and (self.layout == "ragged" or self.empty):
            problems.append("per_channel amax [N, out] needs every expert to have the same rows (no ragged/empty)")
        if self.amax not in AMAX_POLICIES:
            problems.append(f"amax={self.amax!r} not in {AMAX_POLICIES}")
        if self.dist not in DISTRIBUTIONS:
            problems.append(f"dist={self.dist!r} not in {sorted(DISTRIBUTIONS)}")
        elif (why := supports(self)) is not None:
            problems.append(why)
        if self.seed < 0:
            problems.append(f"seed={self.seed} must be >= 0")
        for name, value in self.options:
            if name not in ("narrow_range", "unsigned", "block_size"):
                problems.append(f"unknown option {name!r}")
            elif name == "block_size" and (self.fmt != "nvfp4" or not isinstance(value, int) or value < 1):
                problems.append(f"block_size={value!r} needs nvfp4 and a positive int")
            elif name in ("narrow_range", "unsigned") and (not self.fmt.startswith("int") or value is not True):
                problems.append(f"{name} applies to int formats only and is written only when True")
        if tuple(sorted(self.options, key=lambda kv: kv[0])) != self.options:
            problems.append("options must be sorted by name")
        if problems:
            raise ValueError("invalid Case: " + "; ".join(problems))

    @property
    def id(self) -> str:
        """The stable, readable id (see the module docstring)."""
        head = f"{self.fmt}.{self.variant}" + "".join(f"+{_option_code(k, v)}" for k, v in self.options)
        shape = f"{self.shape[0]}x{self.shape[1]}" + ("" if self.dtype == "bf16" else f".{self.dtype}")
        shape += f"+e{self.empty}" if self.empty else ""
        dist = self.dist + ("" if self.amax == "max" else f"@{self.amax}")
        return f"{head}/{self.granularity}/{self.layout}/N{self.n}/{shape}/{dist}/s{self.seed}"

    @property
    def option_dict(self) -> dict[str, object]:
        """Backend options (plus ``variant``) as keyword arguments."""
        return dict(self.options)

    @property
    def numel(self) -> int:
        """Elements over all experts (ragged and empty experts accounted)."""
        from .shapes import expert_shapes

        return sum(o * i for o, i in expert_shapes(self))

    def with_seed(self, seed: int) -> "Case":
        return replace(self, seed=seed)

    @classmethod
    def from_id(cls, case_id: str) -> "Case":
        """Parse an id written by ``Case.id`` (raises ``ValueError`` naming what does not parse)."""
        m = _ID_RE.fullmatch(case_id)
        if not m:
            raise ValueError(f"not a case id: {case_id!r}; expected {_ID_FORMAT}")
        options = []
        for code in filter(None, (m["opts"] or "").split("+")):
            if code in OPTION_CODES:
                options.append(OPTION_CODES[code])
            elif re.fullmatch(r"bs\d+", code):
                options.append(("block_size", int(code[2:])))
            else:
                raise ValueError(f"unknown option code {code!r} in {case_id!r}")
        return cls(
            fmt=m["fmt"],
            variant=m["variant"],
            granularity=m["gran"],
            layout=m["layout"],
            n=int(m["n"]),
            shape=(int(m["out"]), int(m["inn"])),
            dtype=m["dtype"] or "bf16",
            empty=int(m["empty"] or 0),
            dist=m["dist"],
            amax=m["amax"] or "max",
            seed=int(m["seed"]),
            options=tuple(sorted(options, key=lambda kv: kv[0])),
        )


def _option_code(name: str, value: object) -> str:
    if name == "block_size":
        return f"bs{value}"
    return next(code for code, (n, _) in OPTION_CODES.items() if n == name)


_ID_FORMAT = "{fmt}.{variant}[+opt..]/{granularity}/{layout}/N{n}/{out}x{in}[.{dtype}][+e{empty}]/{dist}[@{amax}]/s{seed}"
_ID_RE = re.compile(
    r"(?P<fmt>[a-z0-9_]+)\.(?P<variant>[a-z0-9_]+)(?P<opts>(\+[a-z0-9]+)*)"
    r"/(?P<gran>[a-z_]+)/(?P<layout>[a-z]+)/N(?P<n>\d+)"
    r"/(?P<out>\d+)x(?P<inn>\d+)(\.(?P<dtype>[a-z0-9]+))?(\+e(?P<empty>\d+))?"
    r"/(?P<dist>[a-z0-9_]+)(@(?P<amax>[a-z]+))?/s(?P<seed>\d+)"
)
