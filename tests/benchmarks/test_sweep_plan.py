"""The tile sweep's plan: every bench column and the backward, each default first, then each
configuration change that changes it (no duplicates); unknown columns refused with the known ones."""

from __future__ import annotations

from dataclasses import replace

import pytest

from moe_fq_parity.benchmarks.cases import BY_KEY, FORMATS
from moe_fq_parity.benchmarks.profiling import SWEEP_CHANGES, sweep_plan
from moe_fq_parity.kernels.formats import parse_spec
from moe_fq_parity.kernels.launch import BWD_CONFIG, fwd_config


def test_every_column_and_the_backward_default_first_without_duplicates() -> None:
    plan = sweep_plan()
    columns = [b.key for b in FORMATS] + ["bwd_clipped"]
    assert list(dict.fromkeys(k for k, _, _ in plan)) == columns
    for key in columns:
        rows = [(name, cfg) for k, name, cfg in plan if k == key]
        base = BWD_CONFIG if key == "bwd_clipped" else fwd_config(parse_spec(BY_KEY[key].fmt, None, BY_KEY[key].options))
        assert rows[0] == ("default", base)
        assert len({cfg for _, cfg in rows}) == len(rows), key
        assert [name for name, _ in rows[1:]] == [name for name, ch in SWEEP_CHANGES if replace(base, **ch) != base], key


def test_kinds_select_columns_and_unknown_ones_are_refused() -> None:
    assert {k for k, _, _ in sweep_plan("mxfp8,bwd_clipped")} == {"mxfp8", "bwd_clipped"}
    with pytest.raises(ValueError, match="unknown \\['int9'\\].*mxfp8"):
        sweep_plan("int9,mxfp8")
