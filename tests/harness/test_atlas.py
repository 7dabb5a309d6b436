"""The disagreement atlas (``harness.sections.atlas``): rows per pair of rules that differ, class by class,
with the smallest differing tile; a rule registered at run time appears with no other change; its
rows follow the report schema."""

from __future__ import annotations

import copy

import jsonschema
import pytest

from moe_fq_parity import reference
from moe_fq_parity.harness.sections import atlas
from moe_fq_parity.reference import fp8_block
from moe_fq_parity.reference.formats import E4M3_GRID, FormatSpec, TileScaling
from moe_fq_parity.reference.granularity import FROM_DATA
from moe_fq_parity.reports.schema import schema


@pytest.fixture
def toy():
    """A block format of two rules registered at test time: TE's 1x128 rule and DeepGEMM's."""
    spec = FormatSpec("toyblock", E4M3_GRID, {"tea": fp8_block.fp8_block_te, "gemm": fp8_block.fp8_block_deepgemm}, "tea",
                      options=(reference.format_spec("fp8_block").option("fp32_scale"),),
                      amax_granularities=frozenset({FROM_DATA}), tiles=TileScaling(128, None, "fp32 or pow2"))
    reference.register_format(spec)
    try:
        yield spec.name
    finally:
        reference.unregister_format(spec.name)


def _by_id(rows):
    return {r.id: r for r in rows}


def test_a_registered_rule_is_in_the_atlas_with_its_pairs(toy):
    assert toy in atlas.atlas_formats() and atlas.tile_options(toy) == [{}]
    rows = _by_id(atlas._rows(toy, {}, seed=0))
    names = ["tea", "tea+fp32_scale", "gemm", "gemm+fp32_scale"]
    pairs = {f"{toy}/1x128/-/{a}~{b}" for i, a in enumerate(names) for b in names[i + 1:]}
    assert set(rows) == pairs | {f"{toy}/1x128/-/agree"}
    # TE's and DeepGEMM's pow2 rules part on the amax floor (denormal tiles), inf and NaN tiles
    r = rows[f"{toy}/1x128/-/tea~gemm"].fields
    assert r["inf"] and r["nan"] and r["denormal"] and r["tiles"] > 0
    ex = r["examples"]["nan"]
    assert ex["elements"] and all(e["a"] != e["b"] for e in ex["elements"])
    assert rows[f"{toy}/1x128/-/agree"].fields["a"] == "0 of 6 pairs"


def test_the_example_is_the_smallest_differing_tile(toy):
    cls = next(c for c in atlas.block_classes(toy) if c.name == "boundary")
    a = reference.fake_quant(cls.x, None, toy, "tea")
    b = a.clone()
    b[2, 5, 7] = 1.0  # one tile with one difference, another with three
    b[0, 1, 0:3] = 2.0
    tiles, elements, ex = atlas._pair(cls, a, b)
    assert (tiles, elements) == (2, 4)
    assert ex["expert"] == 2 and ex["tile"] == [5, 0] and [e["at"] for e in ex["elements"]] == [[0, 7]]
    assert atlas._pair(cls, a, a.clone()) == (0, 0, None)


def test_rows_follow_the_report_schema_and_a_broken_row_is_refused(toy):
    rows = atlas._rows(toy, {}, seed=0)
    section = atlas.Section(atlas.NAME, atlas.TITLE, atlas.COLUMNS, rows).to_json()
    defs = schema()["$defs"]
    validate = lambda s: jsonschema.validate(s, {"$ref": "#/$defs/section", "$defs": defs})  # noqa: E731
    validate(section)
    broken = copy.deepcopy(section)
    del broken["rows"][0]["fields"]["tiles"]
    with pytest.raises(jsonschema.ValidationError, match="tiles"):
        validate(broken)
    broken = copy.deepcopy(section)
    broken["rows"][0]["fields"]["nan"] = "many"
    with pytest.raises(jsonschema.ValidationError, match="many"):
        validate(broken)


def test_small_suites_get_one_skip_row():
    sec = atlas.run("smoke", 0, "cpu")
    assert [r.verdict for r in sec.rows] == ["skip"] and "nightly" in sec.rows[0].message


def test_fp8_block_atlas_names_every_upstream_rule_pair():
    """On the real registry: DeepSeek's and DeepGEMM's pow2 rules differ only where their amax differs
    (NaN skipped or propagated; an inf tile), TE's fp32 and pow2 rules on the boundaries."""
    rows = _by_id(atlas._rows("fp8_block", {}, seed=0))
    ds_dg = rows["fp8_block/1x128/-/deepseek~deepgemm"].fields
    assert {c for c in atlas.CLASSES if ds_dg[c]} == {"inf", "nan"}
    assert rows["fp8_block/1x128/-/te~te+fp32_scale"].fields["boundary"]
    assert len(rows) == 15 + 1  # 6 rules: 15 pairs, and the agree row
