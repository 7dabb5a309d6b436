"""The ``Case``: a plain, frozen record naming one parity experiment, and its stable id.

A case id reads like a path and is the same key everywhere (pytest id, JSON key, HTML anchor)::

    {fmt}.{variant}[+opt..]/{granularity}/{layout}/N{n}/{out}x{in}[.{dtype}][+e{empty}]/{dist}[@{amax}]/s{seed}

e.g. ``fp8_e4m3.cuda/per_expert/stacked/N32/5120x8192/outliers/s0`` or
``int8.cuda+narrow/per_channel/ragged/N4/40x33+e1/ties@design/s1``.  ``dtype`` is omitted for bf16,
``@amax`` for the calibrated default ``max``; options are written with their registry codes
(``reference.formats.Option.code``: ``+narrow``, ``+unsigned``, ``+bs32``).  ``Case.from_id``
parses an id back, so any case (catalogue or fuzz-generated) can be rerun exactly from its id.

Constructing a ``Case`` checks nothing: whether a record is a valid experiment is decided by
``cases.rules`` (``validate``, ``make_case``, ``parse_case``), and ``make_inputs`` validates every
case before building its data.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from moe_fq_parity.reference.formats import Option, case_options

from .shapes import expert_shapes

GRANULARITIES = ("per_expert", "per_channel", "from_data")
"""``from_data``: the format takes no amax (``amax=None``); its scales come from the data per tile."""
LAYOUTS = ("list", "stacked", "ragged")
DTYPES = ("bf16", "fp16", "fp32")
AMAX_POLICIES = ("max", "clip", "tiny", "zero", "design", "none")
"""``max``: calibrated max |x| (finite values); ``clip``: a data value below the max, so values
clip and some equal amax; ``tiny``: amax around 2**-24; ``zero``: amax 0 on every other expert;
``design``: the amax the distribution constructed (tie distributions); ``none``: no amax at all
(granularity ``from_data``, and only there)."""


@dataclass(frozen=True)
class Case:
    """One experiment: what to quantize, how, and with which data (a plain record; ``cases.rules``
    says whether it is valid).

    * ``fmt``/``variant``: a format of ``reference.FORMATS`` and one of ``reference.variants(fmt)``.
    * ``granularity``: ``per_expert`` (amax ``[N]``), ``per_channel`` (amax ``[N, out]``) or
      ``from_data`` (amax ``None``: MX, FP8 block-wise; amax policy ``none``).
    * ``layout``: ``list`` (N separate tensors), ``stacked`` (views of one ``[N, out, in]``),
      ``ragged`` (experts of different shapes).
    * ``n``, ``shape``: number of experts and the (largest) per-expert ``(out, in)``.
    * ``dtype``: ``bf16``/``fp16``/``fp32``; ``empty``: how many experts have 0 rows.
    * ``dist``: a name from ``cases.distributions.DISTRIBUTIONS``; ``amax``: an ``AMAX_POLICIES`` name.
    * ``seed``: the case's seed index (the data seed is ``global seed + crc32(id)``).
    * ``options``: sorted ``(name, value)`` format options that a case id can write (those with a
      registry code: ``narrow_range``, ``unsigned``, ``block_size``).
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
    def expert_shapes(self) -> list[tuple[int, int]]:
        """``(out_i, in_i)`` of every expert (``cases.shapes.expert_shapes``)."""
        return expert_shapes(self.layout, self.n, self.shape, self.empty)

    @property
    def numel(self) -> int:
        """Elements over all experts (ragged and empty experts accounted)."""
        return sum(o * i for o, i in self.expert_shapes)

    def with_seed(self, seed: int) -> "Case":
        return replace(self, seed=seed)

    @classmethod
    def from_id(cls, case_id: str) -> "Case":
        """Parse an id written by ``Case.id`` into a record (``ValueError`` naming what does not
        parse); ``cases.rules.parse_case`` also validates it."""
        m = _ID_RE.fullmatch(case_id)
        if not m:
            raise ValueError(f"not a case id: {case_id!r}; expected {_ID_FORMAT}")
        options = [_parse_option_code(code, case_id) for code in filter(None, (m["opts"] or "").split("+"))]
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
    """``+{code}`` for a bool option (written only when ``True``), ``+{code}{value}`` for an int."""
    opt = case_options().get(name)
    if opt is None:
        return f"{name}={value}"  # not a case option: written as is, so the id shows it (and rules reject it)
    return opt.code if opt.type is bool else f"{opt.code}{value}"


def _parse_option_code(code: str, case_id: str) -> tuple[str, object]:
    opts: list[Option] = list(case_options().values())
    for opt in opts:
        if opt.type is bool and code == opt.code:
            return opt.name, True
        if opt.type is int and (m := re.fullmatch(re.escape(opt.code) + r"(\d+)", code)):
            return opt.name, int(m[1])
    raise ValueError(f"unknown option code {code!r} in {case_id!r}; known: {sorted(o.code for o in opts)}")


_ID_FORMAT = "{fmt}.{variant}[+opt..]/{granularity}/{layout}/N{n}/{out}x{in}[.{dtype}][+e{empty}]/{dist}[@{amax}]/s{seed}"
_ID_RE = re.compile(
    r"(?P<fmt>[a-z0-9_]+)\.(?P<variant>[a-z0-9_]+)(?P<opts>(\+[a-z0-9]+)*)"
    r"/(?P<gran>[a-z_]+)/(?P<layout>[a-z]+)/N(?P<n>\d+)"
    r"/(?P<out>\d+)x(?P<inn>\d+)(\.(?P<dtype>[a-z0-9]+))?(\+e(?P<empty>\d+))?"
    r"/(?P<dist>[a-z0-9_]+)(@(?P<amax>[a-z]+))?/s(?P<seed>\d+)"
)
