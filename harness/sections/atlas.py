"""The disagreement atlas: where the upstream rules of each block-scaled format part, class by class.

For each format whose scales come from tiles (``cases.upstream_blocks``: MX, FP8 block-wise, NVFP4,
INT4 group-wise), on each of its tiles (1-D, and square with ``tile_2d``), every registered variant
with every bool option set (``cases.upstream_blocks.variant_calls``: FP8 block-wise ``fp32_scale``) is
run on the adversarial classes, and every pair of them is compared class by class under the harness's
equality (``harness.core.equality.same_bits``: NaN equals NaN; ``+0`` against ``-0`` is a difference).
One row per pair that differs somewhere: per class the differing tiles and elements (``"3t/41e"``; an
empty cell: equal on every tile of the class; ``"rejects"``: one side refuses the class's input), and
in ``fields["examples"]`` one smallest differing tile per class with the elements that differ
(input, both outputs, as hex bits).  Pairs equal on every class are counted in one ``agree`` row per
format and tile.  Formats with an amax (NVFP4's global amax) are compared under each amax policy of
``harness.sections.external.upstreams.AMAX_POLICIES``.

Nothing here names a variant: a variant or option added to the registry appears in the atlas with no
other change.  The atlas runs with the ``nightly`` and ``ultra`` suites (about 30 s of CPU); smaller
suites get one skipped row saying so.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Optional

import torch

from moe_fq_parity import reference
from moe_fq_parity.cases import parse_suite
from moe_fq_parity.cases.upstream_blocks import CLASSES, BlockClass, block_classes, call_name, variant_calls
from moe_fq_parity.harness.core.equality import same_bits

from . import Section, SectionRow
from .external.upstreams import AMAX_POLICIES

NAME, TITLE = "atlas", "Disagreement atlas: where the upstream rules differ"
SUITES = ("nightly", "ultra")
"""The suites the atlas runs with."""
EXAMPLE_ELEMENTS = 8
"""Differing elements listed in a class's example tile."""
COLUMNS = ["format", "tile", "amax", "a", "b", "tiles", *CLASSES]


def atlas_formats() -> list[str]:
    """Registered formats whose scales come from tiles: no amax (scales from the data) or a block scale."""
    out = []
    for f in reference.FORMATS:
        spec = reference.format_spec(f)
        if spec.tiles is not None and (not spec.takes_amax or spec.block is not None):
            out.append(f)
    return out


def tile_options(fmt: str) -> list[dict]:
    """The tile layouts of ``fmt``: 1-D, and square when it has ``tile_2d``."""
    return [{}] + ([{"tile_2d": True}] if reference.format_spec(fmt).option("tile_2d") is not None else [])


@dataclass
class _Run:
    name: str
    outs: dict[str, Optional[torch.Tensor]]
    """Class -> output, ``None`` where the variant rejects the class's input."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int16) if t.element_size() == 2 else t.view(torch.int32)


def _hex(v: torch.Tensor) -> str:
    return f"0x{int(_bits(v.reshape(1))[0]) & 0xFFFF:04X}"


def _runs(fmt: str, options: dict, classes: list[BlockClass], policy: Optional[str]) -> list[_Run]:
    runs = []
    for variant, opts in variant_calls(fmt, options):
        outs: dict[str, Optional[torch.Tensor]] = {}
        for cls in classes:
            amax = None if policy is None else AMAX_POLICIES[policy](cls.x)
            try:
                outs[cls.name] = reference.fake_quant(cls.x, amax, fmt, variant, **opts)
            except ValueError:
                if reference.format_spec(fmt).rejects_nan_for(variant) and not bool(torch.isfinite(cls.x).all()):
                    outs[cls.name] = None  # the variant refuses non-finite input
                    continue
                raise
        runs.append(_Run(call_name(variant, opts), outs))
    return runs


def _pair(cls: BlockClass, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, Optional[dict[str, Any]]]:
    """(differing tiles, differing elements, the example) of one class."""
    differ = ~same_bits(a, b)
    if not bool(differ.any()):
        return 0, 0, None
    r, c = cls.tile
    e, rows, cols = a.shape
    tiles = differ.reshape(e, rows // r, r, cols // c, c).permute(0, 1, 3, 2, 4).reshape(e, rows // r, cols // c, r * c)
    per_tile = tiles.sum(dim=-1)
    n_tiles = int((per_tile > 0).sum())
    flat = torch.where(per_tile > 0, per_tile, torch.full_like(per_tile, r * c + 1)).reshape(-1)
    k = int(torch.argmin(flat))  # the tile with the fewest differences: the smallest example
    ei, rem = divmod(k, (rows // r) * (cols // c))
    tr, tc = divmod(rem, cols // c)
    xs = cls.x[ei, tr * r:(tr + 1) * r, tc * c:(tc + 1) * c]
    ya, yb = a[ei, tr * r:(tr + 1) * r, tc * c:(tc + 1) * c], b[ei, tr * r:(tr + 1) * r, tc * c:(tc + 1) * c]
    where = torch.nonzero(differ[ei, tr * r:(tr + 1) * r, tc * c:(tc + 1) * c])[:EXAMPLE_ELEMENTS].tolist()
    amax = float(xs.float().abs().nan_to_num(nan=0.0).max())
    example = {"expert": ei, "tile": [tr, tc], "tile_amax": repr(amax),
               "elements": [{"at": [i, j], "x": _hex(xs[i, j]), "a": _hex(ya[i, j]), "b": _hex(yb[i, j])} for i, j in where]}
    return n_tiles, int(differ.sum()), example


def _rows(fmt: str, options: dict, seed: int) -> list[SectionRow]:
    classes = block_classes(fmt, options, seed=seed)
    tile = classes[0].tile
    tile_s = f"{tile[0]}x{tile[1]}"
    policies = tuple(AMAX_POLICIES) if reference.format_spec(fmt).takes_amax else (None,)
    rows = []
    for policy in policies:
        runs = _runs(fmt, options, classes, policy)
        agree = []
        for i, ra in enumerate(runs):
            for rb in runs[i + 1:]:
                cells, examples, total = {}, {}, 0
                for cls in classes:
                    a, b = ra.outs[cls.name], rb.outs[cls.name]
                    if a is None or b is None:
                        cells[cls.name] = "rejects" if (a is None) != (b is None) else ""
                        continue
                    t, n, ex = _pair(cls, a, b)
                    total += t
                    cells[cls.name] = f"{t}t/{n}e" if t else ""
                    if ex is not None:
                        examples[cls.name] = ex
                if not total and not any(v == "rejects" for v in cells.values()):
                    agree.append(f"{ra.name}={rb.name}")
                    continue
                fields = {"format": fmt, "tile": tile_s, "amax": policy or "-", "a": ra.name, "b": rb.name, "tiles": total,
                          **{c: cells.get(c, "-") for c in CLASSES}, "examples": examples}
                first = next(iter(examples.items()), None)
                msg = ""
                if first is not None:
                    cname, ex = first
                    msg = f"{cname}: expert {ex['expert']} tile {ex['tile']} (amax {ex['tile_amax']}): " + ", ".join(
                        f"{e['at']} x={e['x']} {ra.name}={e['a']} {rb.name}={e['b']}" for e in ex["elements"][:3])
                rows.append(SectionRow(f"{fmt}/{tile_s}/{policy or '-'}/{ra.name}~{rb.name}", "pass", fields, message=msg))
        pairs = len(runs) * (len(runs) - 1) // 2
        rows.append(SectionRow(f"{fmt}/{tile_s}/{policy or '-'}/agree", "pass",
                               {"format": fmt, "tile": tile_s, "amax": policy or "-", "a": f"{len(agree)} of {pairs} pairs", "b": "agree",
                                "tiles": 0, **{c: "" for c in CLASSES}, "examples": {}},
                               message=("equal on every class: " + ", ".join(agree)) if agree else
                               (f"one rule ({runs[0].name}): nothing to compare" if len(runs) == 1 else "no two rules agree on every class")))
    return rows


def run(suite: str, seed: int, device: str) -> Section:
    """Section runner (``harness.sections.SECTION_RUNNERS["atlas"]``); CPU only, whatever ``device``."""
    if parse_suite(suite) not in SUITES:
        return Section(NAME, TITLE, COLUMNS, [SectionRow(NAME, "skip", message=f"the atlas runs with --suite {' or '.join(SUITES)}")])
    t0 = time.perf_counter()
    rows: list[SectionRow] = []
    for fmt in atlas_formats():
        for opts in tile_options(fmt):
            rows += _rows(fmt, opts, seed)
    notes = (f"Each row: two rules (variant and options) of one format and tile that differ on some class; per class "
             f"'Tt/Ee' = T tiles and E elements differ, empty = equal, 'rejects' = one side refuses that input; the message "
             f"shows the smallest differing tile of the first such class (all in the JSON's fields.examples). 'agree' rows count the "
             f"pairs equal everywhere. Classes: {', '.join(CLASSES)} (cases.upstream_blocks); seed {seed}; {time.perf_counter() - t0:.1f} s.")
    return Section(NAME, TITLE, COLUMNS, rows, notes)


def host_only(device: str) -> bool:
    """The atlas uses no GPU."""
    return True
