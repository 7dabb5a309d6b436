"""Skips that are not skips: a case outside what a backend declares (format, variant, option value)
is *not applicable* to it, counted per backend in one line (CLI, report.json, HTML), never a skip
record; a case it declares and then declines fails; ``compare`` reads reports from before."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path
from typing import Callable

import pytest

from moe_fq_parity import reference
from moe_fq_parity.cases import parse_case, suite
from moe_fq_parity.harness.backends import load
from moe_fq_parity.harness.checks.plan import LABEL, NotApplicable, applicable, declares, not_applicable
from moe_fq_parity.harness.core.contract import ContractError, check_backend
from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.harness.run.diff import diff_reports
from moe_fq_parity.reports.html import render_html
from moe_fq_parity.reports.merge import merge_not_applicable
from moe_fq_parity.reports.schema import validate

MODULE = "tests.harness.test_not_applicable"
CASES = "int8.*/per_expert/stacked/N4/16x48/ties@design/s0"
"""One case per int8 variant (cuda, eager, reciprocal, step) of the ci suite."""


class CudaOnly:
    """INT8 ``cuda`` only, declared; the reference computes it."""

    name = "cuda-only"
    formats = {"int8"}
    device = "cpu"
    variants = {"int8": ("cuda",)}
    options = {"int8": {"narrow_range": None}}

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        if variant not in (None, "cuda"):
            raise NotImplementedError(f"{self.name} implements the cuda variant only")
        per = reference.split_expert_amax(weights, amax)
        return [reference.fake_quant(w, a, fmt, **options) for w, a in zip(weights, per)]

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        per = reference.split_expert_amax(weights, amax)
        return [reference.ste_backward(w, a, g, mode) for w, a, g in zip(weights, per, grads)]


class DeclaresStepButDeclines(CudaOnly):
    """Declares ``step`` and then refuses it: a failure, not a skip."""

    name = "declares-step"
    variants = {"int8": ("cuda", "step")}


class Undeclared(CudaOnly):
    """No ``variants``: declining a non-default variant stays a skip with its reason (the old rule)."""

    name = "undeclared"
    variants = None  # type: ignore[assignment]
    options = None  # type: ignore[assignment]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Callable[[str], tuple[int, dict, str, str]]:
    """``runs(backend)``: the exit code, a fresh copy of report.json, report.html and the printed text
    of one run of ``backend`` on ``CASES``, made once per module (two tests read each of CudaOnly's
    and Undeclared's runs).  In this process: the plan is the parent's either way, and a worker
    start would cost more than the four cases."""
    base = tmp_path_factory.mktemp("na")
    done: dict[str, tuple[int, str, str, str]] = {}

    def run(backend: str) -> tuple[int, dict, str, str]:
        if backend not in done:
            out, printed = base / backend, io.StringIO()
            with contextlib.redirect_stdout(printed):
                rc = main(["run", "--suite", "ci", "--cases", CASES, "--backend", f"{MODULE}:{backend}", "--no-sections", "--no-progress",
                           "--in-process", "--out", str(out)])
            done[backend] = rc, (out / "report.json").read_text(), (out / "report.html").read_text(), printed.getvalue()
        rc, text, html, printed_text = done[backend]
        return rc, json.loads(text), html, printed_text

    return run


def test_triton_declares_its_variants_and_the_nightly_plans_accordingly():
    lb = load("triton")
    if not lb.available:
        pytest.skip(f"triton backend unavailable: {lb.why_not}")
    na = NotApplicable()
    nightly = suite("nightly")
    planned = [c for c in nightly if applicable([lb], c, ["forward"], na)]
    reasons = {r["reason"] for r in na.to_json()["triton"]["reasons"]}
    assert all(c.variant == lb.obj.variants[c.fmt][0] for c in planned)
    assert len(planned) + na.to_json()["triton"]["cases"] == len(nightly)
    for variant in ("eager", "reciprocal", "step", "div", "te_current", "modelopt_static"):
        assert any(f"not {variant!r}" in why for why in reasons), variant
    assert lb.obj.options["nvfp4"] == {"block_size": (16,), "tile_2d": None}


def test_cases_outside_the_declaration_are_counted_not_skipped(runs):
    rc, report, html, out = runs("CudaOnly")
    validate(report)
    assert rc == 0
    other = [r for r in report["records"] if r["case_id"].split("/")[0].split("+")[0] != "int8.cuda"]
    # the STE takes no variant: the backward checks of those cases still run (and pass)
    assert other and {r["check"] for r in other} == {"backward.pass_through", "backward.clipped"} and {r["verdict"] for r in other} == {"pass"}
    assert not any(r["verdict"] == "skip" and "variant" in r["message"] for r in report["records"])
    na = report["not_applicable"][f"{MODULE}:CudaOnly"]
    assert na["cases"] == 3 and na["records"] == 3 * 4  # eager, reciprocal, step x forward and the three invariants
    assert {r["reason"] for r in na["reasons"]} == {f"cuda-only implements the int8 variants ['cuda'], not {v!r}" for v in ("eager", "reciprocal", "step")}
    assert f"12 checks not applicable to their backend (not run, not skips): 12 on {MODULE}:CudaOnly (3 cases)" in out
    assert LABEL in html and "12 checks of 3 cases" in html


def test_a_declared_variant_that_is_declined_fails(runs):
    rc, report, _, _ = runs("DeclaresStepButDeclines")
    step = [r for r in report["records"] if r["case_id"].startswith("int8.step/")]
    assert rc == 1 and step and all(r["verdict"] == "fail" for r in step if r["check"].startswith(("forward", "invariant")))
    assert "declined a format it declares" in next(r for r in step if r["check"] == "forward")["message"]


def test_without_a_declaration_a_declined_variant_stays_a_skip(runs):
    rc, report, _, _ = runs("Undeclared")
    step = [r for r in report["records"] if r["case_id"].startswith("int8.step/") and r["check"] == "forward"]
    assert rc == 0 and step[0]["verdict"] == "skip" and not report["not_applicable"]


def test_plan_rules():
    be = CudaOnly()
    assert not_applicable(be, parse_case("fp8_e4m3.cuda/per_expert/stacked/N4/16x48/normal/s0")) == (
        "backend formats ['int8'] do not include fp8_e4m3")
    assert not_applicable(be, parse_case("int8.cuda+unsigned/per_channel/stacked/N4/16x48/ties@design/s0")) == (
        "cuda-only does not implement the int8 option unsigned")
    narrow = parse_case("int8.cuda+narrow/per_expert/stacked/N4/16x48/ties@design/s0")
    assert not_applicable(be, narrow) is None and declares(be, narrow)
    assert not declares(Undeclared(), narrow)


def test_a_malformed_declaration_breaks_the_contract():
    bad = CudaOnly()
    bad.variants = {"int8": ("cuda", "nope")}
    with pytest.raises(ContractError, match="unknown variants \\['nope'\\]"):
        check_backend(bad)
    bad.variants, bad.options = {"int8": ("cuda",)}, {"int8": {"colour": None}}
    with pytest.raises(ContractError, match="options\\['int8'\\]"):
        check_backend(bad)


def test_compare_reads_a_report_from_before_and_merge_sums_the_shards(runs):
    _, new, _, _ = runs("CudaOnly")
    _, old, _, _ = runs("Undeclared")
    for r in old["records"]:  # the same backend as before it declared its variants
        r["backend"] = new["records"][0]["backend"]
        r["key"] = f"{r['case_id']}|{r['backend']}|{r['check']}"
    old.pop("not_applicable", None)
    d = diff_reports(old, new)
    assert not d.regressions, d.regressions  # the backward passes of the step cases are still there
    assert any(r["verdict"] == "pass" and r["case_id"].startswith("int8.step/") for r in old["records"])
    assert d.totals["changes"].get("baseline skip not in the new report", 0) > 0
    assert any("skipped in the baseline, not in the new report" in c for c in d.changes)
    lost = json.loads(json.dumps(old))
    for r in lost["records"]:
        if r["case_id"].startswith("int8.step/"):
            r["verdict"] = "pass"  # a pass that disappears is coverage lost, as before
    assert any("missing in new report (coverage lost)" in r for r in diff_reports(lost, new).regressions)
    na = new["not_applicable"]
    twice = merge_not_applicable([na, na])
    (backend, v), = twice.items()
    assert v["records"] == 2 * na[backend]["records"] and v["reasons"][0]["cases"] == 2 * na[backend]["reasons"][0]["cases"]
    assert LABEL in render_html(new | {"not_applicable": twice})


def test_the_pytest_plugin_plans_the_same_way(tmp_path):
    import os
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs", "--pyargs", "moe_fq_parity.harness.run.parity_test",
                           "--parity-backend", f"{MODULE}:CudaOnly", "--parity-suite", "smoke", "-k", "forward and (int4 or int8) and not int4_group"],
                          cwd=tmp_path, env=dict(os.environ, PYTHONPATH=str(repo)), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    # the int4 cases are deselected (not skips) and counted in one line, as `run` counts them
    assert f"parity: 4 checks {LABEL.replace('this backend', 'their backend')} (not run, not skips): 4 on {MODULE}:CudaOnly (4 cases)" in proc.stdout
    assert "5 passed, 529 deselected" in proc.stdout.splitlines()[-1] and "skipped" not in proc.stdout, proc.stdout[-3000:]
