"""The benchmark's columns: every format the kernel implements, with the options that select kernel
code of their own, launched the way the benchmark launches them (``benchmarks.measure.KernelRunner``)
and checked the way it checks them (``matches_reference``), under the interpreter on CPU hosts."""

from __future__ import annotations

import pytest
import torch

from moe_fq_parity.benchmarks.cases import FORMATS
from moe_fq_parity.benchmarks.measure import KernelRunner, matches_reference
from moe_fq_parity.kernels.formats import FORMATS as KERNEL_FORMATS


def test_every_kernel_format_and_its_own_code_paths_is_a_column() -> None:
    keys = [b.key for b in FORMATS]
    assert {b.fmt for b in FORMATS} == set(KERNEL_FORMATS) and len(keys) == len(set(keys))
    assert {"nvfp4+2d", "fp8_block+2d", "fp8_block+fp32s", "mxfp8+2d", "mxfp4+2d"} <= set(keys)
    assert [b.key for b in FORMATS if b.takes_amax] == ["int8", "int4", "fp8_e4m3", "nvfp4", "nvfp4+2d"]


@pytest.mark.parametrize("bf", FORMATS, ids=[b.key for b in FORMATS])
def test_the_benchmark_launch_gives_the_reference_bits(bf, device, gen) -> None:
    ws = [(torch.randn(64, 128, generator=gen) * s).to(torch.bfloat16).to(device) for s in (0.01, 1.0, 30.0)]
    amax = torch.stack([w.float().abs().amax() for w in ws]) * 0.9
    runner = KernelRunner([(ws, amax)])
    runner.fwd(bf)[0]()
    outs = runner.outs[0][1]
    assert matches_reference(bf, ws, amax, outs)
    outs[-1].view(torch.int16).view(-1)[5] ^= 1  # one bit of the last expert: the check must see it
    assert not matches_reference(bf, ws, amax, outs)


def test_the_sweep_times_every_configuration_and_keeps_only_exact_ones(device, monkeypatch) -> None:
    """``bench --sweep`` on small experts (a stand-in timer: each launch runs once): every planned
    configuration of the chosen columns gives a row with its time, ceiling and bit check; the
    fastest configuration is the best only if its output is exact, and one whose launch fails is a
    row with its error, not the end of the sweep."""
    from moe_fq_parity.benchmarks import profiling

    kinds = "int8,mxfp8+2d,bwd_clipped"
    calls = []

    def timer(fns):  # per forward row: the kernel's time, then (after the bit check) the ceiling's
        for fn in fns:
            fn()
        calls.append(len(fns))
        if len(calls) == 3:  # int8's second configuration
            raise RuntimeError("launch refused")
        return 0.5 if len(calls) == 4 else 1.0  # int8's third configuration: the fastest, and made wrong below

    real = profiling.matches_reference
    monkeypatch.setattr(profiling, "matches_reference",
                        lambda bf, ws, amax, outs: real(bf, ws, amax, outs) and not (bf.key == "int8" and len(calls) == 4))  # fmt: skip
    rows, best = profiling.sweep(1.0, kinds, case=(2, (16, 256)), l2=(2, (16, 256)), timer=timer, device=device)
    plan = profiling.sweep_plan(kinds)
    assert [(r["kind"], r["config_name"]) for r in rows] == [(k, n) for k, n, _ in plan]
    assert rows[1]["error"] == "RuntimeError: launch refused"
    assert rows[2]["ms"] == 0.5 and rows[2]["exact"] is False
    assert all(r["exact"] for r in rows if r is not rows[2] and "error" not in r), [r for r in rows if not r.get("exact")]
    assert all("ceiling_pct" in r for r in rows if r.get("exact") and r["kind"] != "bwd_clipped")
    assert best["int8"] == plan[0][2]  # not the wrong, faster one
    assert set(best) == {"int8", "mxfp8+2d", "bwd_clipped"}


def test_the_profile_measures_every_column_and_the_copy(device, monkeypatch) -> None:
    """``bench --profile`` on small experts with a stand-in timer (each launch runs once and takes
    "1 ms"): a ceiling for every column, each timed on its own format's launch, and for the Triton
    copy through the same tiling, and compiled-kernel facts (or, under the interpreter, why there
    are none)."""
    from moe_fq_parity.benchmarks import profiling
    from moe_fq_parity.kernels.formats import parse_spec

    timed, launched = [], []
    real = profiling.launch.fwd_list
    monkeypatch.setattr(profiling.launch, "fwd_list",
                        lambda table, ws, flat, view, spec, **kw: launched.append(spec) or real(table, ws, flat, view, spec, **kw))  # fmt: skip

    def timer(fns):
        launched.clear()
        for fn in fns:
            fn()
        timed.append(list(launched))
        return 1.0

    out = profiling.profile_formats(1.0, n=3, shape=(16, 256), case=(2, (16, 256)), timer=timer, device=device)
    assert set(out) == {b.key for b in FORMATS} | {"triton_copy"}
    assert timed[: len(FORMATS)] == [[parse_spec(b.fmt, None, b.options)] for b in FORMATS]
    assert timed[len(FORMATS)] == []  # the copy: no fake-quant launch
    nominal = 4 * 3 * 16 * 256
    assert all(out[k]["ceiling_gbps"] == nominal / 1e6 and out[k]["ceiling_pct_of_hbm_copy"] == 100.0 * nominal / 1e6 for k in out)
    for b in FORMATS:
        assert ("n_regs" in out[b.key]) == (device == "cuda") or "compiled_facts_error" in out[b.key], out[b.key]
