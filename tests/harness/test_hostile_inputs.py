"""Hostile inputs at every public entry point: a clear error naming the argument and the expected form,
or a documented defined result; never a deep traceback, a hang or a silently wrong report.

The table of what was tried, per entry point, with the outcome class is ``docs/hostile-inputs.md``;
the run lifecycle (compare, ``--out``, signals, backends that misbehave) is ``test_run_lifecycle.py``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_fq_parity import reference as R
from moe_fq_parity.harness.run.cli import main

REPO = Path(__file__).resolve().parents[2]
W = torch.randn(4, 32, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
A = W.float().abs().amax()


# --- reference API (and the kernel API, which must agree) ------------------------------------------

@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), -float("inf")])
def test_static_block_amax_follows_the_amax_policy(bad):
    ba = torch.ones(4, 2)
    ba[1, 1] = bad
    with pytest.raises(ValueError, match="block_amax: amax is"):
        R.fake_quant(W, A, "nvfp4", "modelopt_static", block_amax=ba)
    with pytest.raises(ValueError, match="block_amax: amax is"):
        R.fake_quant_experts([W], A.reshape(1), "nvfp4", "modelopt_static", block_amax=[ba])


@pytest.mark.parametrize("amax", [float("nan"), float("inf"), -1.0])
def test_bad_amax_values_are_value_errors(amax):
    with pytest.raises(ValueError, match="amax"):
        R.fake_quant(W, torch.tensor(amax), "int8")


@pytest.mark.parametrize("fmt", [f for f in R.FORMATS if R.format_spec(f).takes_amax])
def test_an_amax_is_checked_in_its_own_dtype(fmt):
    """fp64 amax: the sign and range are checked before the rounding to fp32 (``-1e-50`` and
    ``-1e-60`` round to ``-0.0``, which passes; a finite ``1e300`` rounds to inf), per tensor, per
    expert and per expert list; a valid fp64 amax gives the bits of its fp32 rounding."""
    f64 = torch.float64
    w2 = torch.stack([W, W])
    for amax, call, words in [
        (torch.tensor(-1e-50, dtype=f64), lambda a: R.fake_quant(W, a, fmt), r"amax is negative at index \(\) \(value -1e-50\)"),
        (torch.tensor([1, -1e-60], dtype=f64), lambda a: R.fake_quant(w2, a, fmt), r"amax is negative at index \(1,\) \(value -1e-60\)"),
        (torch.tensor([1, -1e-60], dtype=f64), lambda a: R.fake_quant_experts([W, W], a, fmt), r"amax is negative at index \(1,\)"),
        (torch.tensor(1e300, dtype=f64), lambda a: R.fake_quant(W, a, fmt), r"amax is 1e\+300 at index \(\) \(torch.float64\), beyond the largest fp32"),
    ]:
        with pytest.raises(ValueError, match=words):
            call(amax)
    ok = torch.tensor([1e-50, 2.5], dtype=f64)
    assert torch.equal(R.fake_quant(w2, ok, fmt).view(torch.int16), R.fake_quant(w2, ok.float(), fmt).view(torch.int16))


@pytest.mark.parametrize("fmt", R.FORMATS)
def test_meta_weights_and_a_float_amax_are_refused_by_every_format(fmt):
    """A meta tensor has no values to quantize: ``ValueError`` naming it (every format, stacked, list,
    straight-through), never a meta result or torch's ``.item()`` error; a Python float amax is a
    ``TypeError`` (a format without amax: ``pass amax=None``)."""
    takes = R.format_spec(fmt).takes_amax
    meta = torch.empty(2, 4, 32, dtype=torch.bfloat16, device="meta")
    amax = torch.ones(2, device="meta") if takes else None
    for call, words in [(lambda: R.fake_quant(meta, amax, fmt), "input is on the meta device"),
                        (lambda: R.fake_quant_experts(list(meta), amax, fmt), r"weights\[0\] is on the meta device"),
                        (lambda: R.ste_backward_experts(list(meta), amax, list(meta), "pass_through", fmt=fmt), r"weights\[0\] is on the meta"),
                        (lambda: R.ste_backward(meta, amax, meta, "clipped"), "input is on the meta device")]:
        with pytest.raises(ValueError, match=words):
            call()
    for call in (lambda: R.fake_quant(W, 1.0, fmt), lambda: R.fake_quant_experts([W], 1.0, fmt)):
        with pytest.raises(TypeError, match="torch.Tensor" if takes else "pass amax=None"):
            call()


@pytest.mark.parametrize("fmt, kwargs, err, words", [
    ("int8", {"unsigned": "False"}, TypeError, "unsigned must be a bool"),
    ("nvfp4", {"block_size": True}, TypeError, "block_size"),
    ("int8", {"variant": ""}, ValueError, "unknown variant ''"),
    (["int8"], {}, ValueError, "unknown format"),
    ("int9", {}, ValueError, "unknown format 'int9'"),
    ("int8", {"bogus": 1}, TypeError, "does not take option"),
])
def test_reference_validates_arguments(fmt, kwargs, err, words):
    kw = dict(kwargs)
    variant = kw.pop("variant", None)
    with pytest.raises(err, match=words):
        R.fake_quant(W, A, fmt, variant, **kw)
    with pytest.raises(err, match=words):
        R.fake_quant_experts([W], A.reshape(1), fmt, variant, **kw)


@pytest.mark.parametrize("amax, err", [(torch.zeros(0), ValueError), (None, TypeError), (torch.zeros(1), ValueError)])
def test_empty_expert_list_validates_like_any_other(amax, err):
    with pytest.raises(ValueError, match="unknown format 'int9'"):
        R.fake_quant_experts([], torch.zeros(0), "int9")
    if amax is not None and amax.numel() == 0:
        assert R.fake_quant_experts([], amax, "int8") == []
    else:
        with pytest.raises(err):
            R.fake_quant_experts([], amax, "int8")


def _kernel_probe(code: str) -> str:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=REPO, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_kernel_and_reference_agree_on_empty_lists_and_3d_per_channel():
    pytest.importorskip("triton")
    code = """
import torch
from moe_fq_parity import kernels as K, reference as R
w3 = torch.randn(2, 4, 32).to(torch.bfloat16)
cases = {
    "empty_none": lambda m: m.fake_quant_experts([], None, "int8"),
    "empty_int9": lambda m: m.fake_quant_experts([], torch.zeros(0), "int9"),
    "empty_ok": lambda m: m.fake_quant_experts([], torch.zeros(0), "int8"),
    "3d_per_channel": lambda m: m.fake_quant_experts([w3], torch.ones(1, 4), "int8"),
    "unsigned_str": lambda m: m.fake_quant_experts([w3.abs()], torch.ones(1), "int8", unsigned="False"),
}
for name, f in cases.items():
    got = []
    for m in (R, K):
        try:
            got.append(("ok", len(f(m))))
        except Exception as exc:
            got.append((type(exc).__name__,))
    print(name, got[0] == got[1], got)
"""
    lines = _kernel_probe(code).splitlines()
    assert len(lines) == 5 and all(" True " in ln for ln in lines), lines


# --- harness.dist command line -----------------------------------------------------------------------

@pytest.mark.parametrize("args, words", [
    (["--save", "tp3ep5"], "does not fit layout tp3ep5"),
    (["--save", "tp1ep16"], "not divisible by ep=16"),
    (["--load", "tp1ep3"], "not divisible by ep=3"),
    (["--max-world", "0"], "--max-world"),
    (["--json", "/nonexistent/x.json"], "--json"),
    (["--save", ","], "no layout"),
    (["--save", "tp2"], "layout id must look like"),
])
def test_dist_cli_rejects_bad_arguments_before_running(args, words, capsys):
    from moe_fq_parity.harness.sections.checkpoint.__main__ import main as dist_main

    with pytest.raises(SystemExit) as exc:
        dist_main(args)
    assert exc.value.code == 2
    assert words in capsys.readouterr().err


def test_dist_cli_unavailable_engine_exits_2(capsys, monkeypatch):
    import sys

    from moe_fq_parity.harness.sections.checkpoint.__main__ import main as dist_main
    from moe_fq_parity.harness.sections.checkpoint.engines import ENGINES

    # Make Megatron-Core unimportable whether or not the `megatron` extra is installed here.
    monkeypatch.setitem(sys.modules, "megatron", None)
    monkeypatch.setitem(sys.modules, "megatron.core", None)
    ok, why = ENGINES["megatron"].available("cpu")
    assert not ok and "pip install" in why
    assert dist_main(["--engine", "megatron", "--save", "tp1ep1", "--load", "tp1ep1"]) == 2
    err = capsys.readouterr().err
    assert "megatron is unavailable" in err and "pip install" in err


# --- CLI, compare, merge ----------------------------------------------------------------------------------

def test_out_on_an_existing_file_is_a_usage_error(tmp_path, capsys):
    f = tmp_path / "file"
    f.write_text("keep")
    assert main(["run", "--suite", "smoke", "--backend", "reference", "--no-progress", "--out", str(f)]) == 2
    assert "cannot write the report" in capsys.readouterr().err and f.read_text() == "keep"


@pytest.mark.parametrize("content", ["", "{", "[]", json.dumps({"schema_version": "9", "records": 3})])
def test_compare_and_merge_refuse_corrupt_or_foreign_reports(tmp_path, content, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    assert main(["compare", str(bad), str(bad)]) == 2
    assert "bad.json" in capsys.readouterr().err
    assert main(["merge", str(bad), "--out", str(tmp_path / "m")]) == 2
    assert "bad.json" in capsys.readouterr().err


def test_unknown_case_id_is_a_usage_error(tmp_path, capsys):
    rc = main(["run", "--case", "int9.cuda/per_expert/stacked/N4/8x40/outliers/s0", "--no-progress", "--out", str(tmp_path / "x")])
    assert rc == 2 and "int9" in capsys.readouterr().err
    assert not (tmp_path / "x" / "report.json").exists()


@pytest.mark.parametrize("option, words", [
    (["--parity-timeout", "-1"], "--parity-timeout"),
    (["--parity-nan-bits", "loose"], "--parity-nan-bits"),
    (["--parity-suite", "nope"], "--parity-suite"),
])
def test_pytest_options_are_validated(option, words):
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *option,
                          "tests/harness/test_parity.py"], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert out.returncode in (2, 4), out.stdout[-1500:] + out.stderr[-1500:]
    assert words in out.stdout + out.stderr
