"""CLI: run / compare / list, exit codes, incremental and incomplete reports."""

from __future__ import annotations

import copy
import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from moe_fq_parity.harness.run.cli import main
from moe_fq_parity.reports.schema import validate

REPO = Path(__file__).resolve().parents[2]
BROKEN = "tests.harness.broken_backends"
ONE = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _run(tmp_path: Path, *args: str) -> tuple[int, dict]:
    out = tmp_path / "out"
    rc = main(["run", "--no-progress", "--no-sections", "--out", str(out), *args])
    return rc, json.loads((out / "report.json").read_text())


@pytest.fixture(scope="module")
def forward_one(tmp_path_factory) -> Path:
    """The folder of one in-process run of the reference on ``ONE``, forward only: the report that
    three tests below compare, doctor or guard (each reads its own copy)."""
    out = tmp_path_factory.mktemp("forward_one") / "out"
    assert main(["run", "--no-progress", "--no-sections", "--in-process", "--backend", "reference", "--case", ONE, "--checks", "forward",
                 "--out", str(out)]) == 0
    return out


def test_default_run_works_from_a_fresh_directory(tmp_path):
    """Defaults: suite smoke, all built-in backends, ./parity-report (sections are other modules' cost)."""
    proc = subprocess.run([str(Path(sys.executable).with_name("moe-fq-parity")), "run", "--no-sections"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parity smoke" in proc.stderr  # the progress bar
    report = json.loads((tmp_path / "parity-report" / "report.json").read_text())
    validate(report)
    assert report["complete"] and report["meta"]["suite"] == "smoke" and report["sections"] == []
    assert {b["spec"] for b in report["meta"]["backends"]} == {"reference", "triton", "eager-loop"}
    assert (tmp_path / "parity-report" / "report.html").stat().st_size > 10_000


def test_report_says_where_the_time_went(tmp_path, capsys):
    rc, report = _run(tmp_path, "--backend", "reference", "--case", ONE)
    assert rc == 0
    phases = report["meta"]["phase_s"]
    from moe_fq_parity.harness.run.runner import PHASES

    assert set(phases) == set(PHASES) and all(v >= 0 for v in phases.values())
    assert phases["inputs"] + phases["reference"] + phases["checks"] <= phases["total"]
    assert phases["backend_calls"] <= phases["checks"] and phases["checks"] > 0
    assert "time: inputs" in capsys.readouterr().err


def test_named_cases_run_without_the_suite_sections(tmp_path, capsys):
    """``--case`` runs those cases only: no report section (they are per suite) fails the run."""
    out = tmp_path / "o"
    assert main(["run", "--no-progress", "--backend", "reference", "--case", ONE, "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["sections"] == [] and report["meta"]["suite"] == "custom"
    assert main(["run", "--no-progress", "--case", ONE, "--sections", "moe", "--out", str(tmp_path / "p")]) == 2
    assert "--sections run with a suite" in capsys.readouterr().err and not (tmp_path / "p" / "report.json").exists()


def test_failing_backend_exits_nonzero_and_repro_reruns_the_case(tmp_path):
    rc, report = _run(tmp_path, "--backend", f"{BROKEN}:OneUlpHigh", "--case", ONE, "--checks", "forward")
    assert rc == 1 and report["records"][0]["verdict"] == "fail"
    repro = report["records"][0]["repro"]
    assert repro.startswith("moe-fq-parity run ")
    args = shlex.split(repro)[1:]
    assert args[0] == "run" and "--case" in args
    rc2 = main(args + ["--no-progress", "--no-sections", "--out", str(tmp_path / "again")])
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert rc2 == 1 and again["records"][0]["key"] == report["records"][0]["key"] and again["records"][0]["counts"] == report["records"][0]["counts"]


def test_bad_backend_spec_is_a_clear_usage_error(tmp_path, capsys):
    assert main(["run", "--backend", "nosuch.mod:X", "--out", str(tmp_path)]) == 2
    assert "cannot import module 'nosuch.mod'" in capsys.readouterr().err


def test_explicit_unavailable_backend_is_not_a_pass(tmp_path):
    """A named backend runs, or the run is refused before any work (``BAD_SELECTIONS``: exit 2, no report)."""
    from moe_fq_parity.harness.backends import load

    if not load("triton").available:
        assert main(["run", "--no-progress", "--no-sections", "--backend", "reference,triton", "--case", ONE, "--out", str(tmp_path / "o")]) == 2
        assert not (tmp_path / "o").exists()
        return
    rc, report = _run(tmp_path, "--backend", "reference,triton", "--case", ONE)
    bad = [(r["key"], r["message"]) for r in report["records"] if r["verdict"] == "fail"]
    assert not bad and rc == 0


def test_interrupted_run_leaves_an_incomplete_report(tmp_path, monkeypatch):
    from moe_fq_parity.harness.run import chunks

    calls = {"n": 0}
    real = chunks.run_case_checks

    def dies(*a, **k):
        calls["n"] += 1
        if calls["n"] == 20:  # one call per check and case: in the fourth case, after three were written
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(chunks, "run_case_checks", dies)
    rc, report = _run(tmp_path, "--backend", "reference", "--suite", "smoke", "--in-process")  # the patch lives in this process
    validate(report)
    assert rc == 130 and not report["complete"] and "interrupted" in report["error"] and len(report["records"]) > 0
    assert "Incomplete run" in (tmp_path / "out" / "report.html").read_text()
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.endswith(".tmp")]


def test_compare_flags_regressions(tmp_path, capsys, forward_one):
    old = json.loads((forward_one / "report.json").read_text())
    base = tmp_path / "old.json"
    base.write_text(json.dumps(old))
    same = tmp_path / "same.json"
    same.write_text(json.dumps(old))
    assert main(["compare", str(base), str(same)]) == 0
    worse = copy.deepcopy(old)
    rec = worse["records"][0]
    rec["counts"] = {"exact": rec["numel"] - 1, "ulp1": 1, "tie_flip": 0, "error": 0}
    first = rec["per_expert"][0]["counts"]  # the experts' counts add up to the record's (else refused)
    first.update(exact=first["exact"] - 1, ulp1=first.get("ulp1", 0) + 1)
    rec["max_ulp"] = 1
    rec["mode"] = "1-ulp"  # a pass with a 1-ULP element (under strict that record would contradict itself: refused)
    rec["perf"] = None
    new = tmp_path / "new.json"
    new.write_text(json.dumps(worse))
    assert main(["compare", str(base), str(new)]) == 1
    assert "exact -> not exact" in capsys.readouterr().out
    rec["verdict"] = "fail"
    new.write_text(json.dumps(worse))
    assert main(["compare", str(base), str(new)]) == 1
    assert "pass -> fail" in capsys.readouterr().out


def test_compare_flags_slowdown(tmp_path):
    from moe_fq_parity.harness.run.diff import diff_reports

    perf = {"time_us": 100.0, "gbps": 1.0, "pct_of_copy": None, "timer": "perf_counter", "samples_us": [100.0], "bytes_moved": 100}
    rec = {"key": "k", "verdict": "pass", "counts": {"exact": 1}, "perf": perf, "max_ulp": 0, "message": ""}
    slower = dict(rec, perf=dict(perf, time_us=125.0))
    old, new = {"records": [rec], "sections": []}, {"records": [slower], "sections": []}
    assert diff_reports(old, new).regressions and not diff_reports(old, new, slowdown=0.5).regressions


def test_baseline_regression_fails_the_run(tmp_path, forward_one):
    good = json.loads((forward_one / "report.json").read_text())
    base = tmp_path / "base.json"
    good["records"][0]["backend"] = f"{BROKEN}:OneUlpHigh"
    good["records"][0]["key"] = f"{ONE}|{BROKEN}:OneUlpHigh|forward"
    base.write_text(json.dumps(good))
    rc, report = _run(tmp_path, "--backend", f"{BROKEN}:OneUlpHigh", "--case", ONE, "--checks", "forward", "--baseline", str(base))
    assert rc == 1 and report["baseline"]["regressions"]
    assert "Against the baseline" in (tmp_path / "out" / "report.html").read_text()


def test_sections_run_by_default_and_fail_the_run(tmp_path, monkeypatch, capsys):
    from moe_fq_parity.harness import sections as sr

    monkeypatch.setattr(sr, "SECTION_RUNNERS", {"ok": "tests.harness.fake_sections:passing", "bad": "tests.harness.fake_sections:failing",
                                                "gone": "tests.harness.no_such_module:run"})
    out = tmp_path / "out"
    rc = main(["run", "--no-progress", "--backend", "reference", "--suite", "smoke", "--cases", ONE, "--checks", "forward", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert [r["case_id"] for r in report["records"]] == [ONE]
    assert rc == 1 and [s["verdict"] for s in report["sections"]] == ["pass", "fail", "skip"]
    assert "No module named" in report["sections"][2]["rows"][0]["message"]
    assert all(s["seconds"] >= 0 for s in report["sections"])  # each section's own time ...
    err = capsys.readouterr().err
    assert "(ok 0.0, bad 0.0, gone 0.0)" in err  # ... also on the time line
    assert "section ok: pass, 1 rows in" in err and "section bad: fail, 1 rows in" in err  # progress, one line per section
    html = (out / "report.html").read_text()
    assert "Section: fake passing section" in html and "&lt;b&gt;not bold&lt;/b&gt;" in html
    assert "<th>seconds</th>" in html and f'<td class="num">{report["sections"][0]["seconds"]:.1f}</td>' in html


def test_a_run_cut_off_in_its_sections_keeps_the_finished_ones(tmp_path, monkeypatch):
    from moe_fq_parity.harness import sections as sr

    monkeypatch.setattr(sr, "SECTION_RUNNERS", {"ok": "tests.harness.fake_sections:passing", "cut": "tests.harness.fake_sections:interrupted"})
    monkeypatch.setattr(sr, "PARALLEL_MIN_CPUS", 1 << 30)  # in this process: the fake Ctrl-C interrupts the run itself
    out = tmp_path / "out"
    rc = main(["run", "--no-progress", "--backend", "reference", "--suite", "smoke", "--cases", ONE, "--checks", "forward", "--out", str(out)])
    report = json.loads((out / "report.json").read_text())
    assert rc == 130 and not report["complete"] and "interrupted" in report["error"]
    assert [s["name"] for s in report["sections"]] == ["ok"] and report["meta"]["phase_s"]["sections"] >= 0


def test_list(capsys, monkeypatch, request):
    """Suites, cases, formats and backends.  Every backend row's columns start where the others' do
    (the longest name sets the width), and an unavailable backend names its install command once
    (here Model-Optimizer and torchao made unimportable)."""
    from moe_fq_parity.harness.backends import NAMES, modelopt_backend, modelopt_int4_block, modelopt_mx_backend, torchao_backend

    for mod in (modelopt_backend, modelopt_mx_backend, modelopt_int4_block, torchao_backend):
        monkeypatch.setattr(mod, "try_import", lambda module: (None, f"import {module} failed: ModuleNotFoundError: No module named {module!r}"))
    torchao_backend._torchao.cache_clear()  # its probe is cached: an earlier test's answer would stand, and this one's must not stay
    request.addfinalizer(torchao_backend._torchao.cache_clear)
    assert main(["list", "--suite", "ultra"]) == 0
    out = capsys.readouterr().out
    rows = out.split("backends:")[1].splitlines()[1:]
    assert [r.split()[0] for r in rows] == list(NAMES)
    kinds = {r.index(" built-in ") if " built-in " in r else r.index(" external ") for r in rows}
    states = {r.index(" available") if " available" in r else r.index(" unavailable") for r in rows}
    assert len(kinds) == 1 and len(states) == 1, "\n".join(rows)
    unavailable = [r for r in rows if r.split()[0].startswith(("modelopt", "torchao"))]
    assert len(unavailable) == 9 and all("unavailable" in r and r.count("pip install") == 1 for r in unavailable), "\n".join(unavailable)
    assert "fp8_e4m3.cuda/per_expert/stacked/N32/5120x8192/outliers/s0" in out and "backends:" in out
    assert "mxfp8.floor/from_data/stacked/N32/5120x8192/outliers@none/s0" in out
    formats = out.split("formats:")[1].split("suite ")[0]
    from moe_fq_parity.reference import FORMATS, variants
    for fmt in FORMATS:
        line = next(line for line in formats.splitlines() if line.strip().startswith(f"{fmt}:"))
        assert f"variants {', '.join(variants(fmt))}" in line
    assert "amax none (amax=None" in formats and "1x32 or 32x32 (tile_2d)" in formats and "1x128 or 128x128" in formats


def test_unknown_case_id_and_empty_selection(tmp_path, capsys):
    assert main(["run", "--case", "garbage", "--out", str(tmp_path)]) == 2  # a usage error, like every bad argument
    assert "not a case id" in capsys.readouterr().err
    assert main(["run", "--cases", "no-such-*", "--out", str(tmp_path)]) == 2


def test_out_that_would_overwrite_the_baseline_is_refused_before_any_work(tmp_path, capsys, forward_one):
    """``--baseline D/report.json --out D`` (or a symlink to either) would replace the baseline with
    the new report: a usage error before anything runs, the baseline byte for byte as it was."""
    import os
    import shutil

    out = tmp_path / "out"
    shutil.copytree(forward_one, out)
    base = out / "report.json"
    before = base.read_bytes()
    (tmp_path / "link.json").symlink_to(base)
    (tmp_path / "outlink").symlink_to(out, target_is_directory=True)
    for baseline, target in ((base, out), (tmp_path / "link.json", out), (base, tmp_path / "outlink"),
                             (Path(os.path.relpath(base)), Path(os.path.relpath(tmp_path / "out" / "." / ".." / "out")))):
        capsys.readouterr()
        rc = main(["run", "--no-progress", "--no-sections", "--backend", "reference", "--case", ONE, "--baseline", str(baseline),
                   "--out", str(target)])
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert rc == 2 and len(err) == 1 and err[0].startswith("error: --out") and "--baseline" in err[0], (baseline, target, err)
        assert base.read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["report.html", "report.json"]  # no lock left, nothing else written


def test_merge_out_that_would_overwrite_a_shard_report_is_refused(tmp_path, capsys):
    cases = ["--no-sections", "--no-progress", "--in-process", "--backend", "reference", "--suite", "ci", "--cases", "int8.cuda/per_expert/*/N4/8x40/*",
             "--checks", "forward"]
    for i in (1, 2):
        assert main(["run", *cases, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    first = tmp_path / "s1" / "report.json"
    before = first.read_bytes()
    capsys.readouterr()
    assert main(["merge", str(first), str(tmp_path / "s2" / "report.json"), "--out", str(tmp_path / "s1")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "would overwrite the shard report" in err and first.read_bytes() == before, err


PLUGIN_B = "tests.harness.plugin_backends:"
BAD_SELECTIONS = [
    # (arguments, what the one error line must name)
    (["--formats", "int8,mxfp9"], ["--formats", "'mxfp9'", "known: int8"]),
    (["--formats", "int9"], ["--formats", "'int9'", "nvfp4"]),
    (["--formats", "int8", "--formats", "nvfp5"], ["--formats", "'nvfp5'"]),
    (["--formats", ""], ["--formats", "empty"]),
    (["--formats", "int8,"], ["--formats", "empty"]),
    (["--backend", "reference,nosuch"], ["unknown backend 'nosuch'", "eager-loop"]),
    (["--backend", ""], ["--backend", "empty"]),
    (["--backend", PLUGIN_B + "Unavailable"], ["--backend " + PLUGIN_B + "Unavailable", "the vendor library is not installed"]),
    (["--checks", "forward,fwd"], ["--checks", "'fwd'", "backward.clipped"]),
    (["--checks", ""], ["--checks", "empty"]),
    (["--case", "garbage"], ["--case", "garbage"]),
    (["--cases", "no-such-*"], ["--cases", "'no-such-*'", "suite smoke"]),
    (["--formats", "int8,nvfp4", "--cases", "int8.*"], ["--formats nvfp4", "int8.*"]),
    (["--case", ONE, "--formats", "fp8_e4m3"], ["--formats fp8_e4m3", "--case ids"]),
    (["--case", ONE, "--cases", "*N8*"], ["--cases '*N8*'", "--case ids"]),
    (["--case", ONE, "--case", ONE.replace("N4", "N2"), "--cases", "*N4*"], ["--case " + ONE.replace("N4", "N2"), "left out by --cases"]),
    (["--suite", "smok"], ["--suite", "'smok'", "nightly"]),
    (["--mode", "1ulp"], ["--mode", "'1ulp'", "strict"]),
    (["--seed", "abc"], ["--seed", "'abc'"]),
    (["--workers", "0"], ["--workers", "'0'"]),
    (["--sections", "moe,nope"], ["--sections", "'nope'", "selftest"]),
    (["--shard", "3/2"], ["--shard", "'3/2'"]),
    (["--share-cpus", "0"], ["--share-cpus", "0"]),
]


@pytest.mark.parametrize("args,needles", BAD_SELECTIONS, ids=[" ".join(a) or "empty" for a, _ in BAD_SELECTIONS])
def test_every_bad_selection_is_one_error_line_before_any_work(tmp_path, capsys, args, needles):
    """Every value of every selection option is checked before anything runs: a value that is not a
    format, backend, check, case id or suite, or that selects nothing, is named in one line with the
    valid ones (exit 2); a misspelled format in a list is never dropped while the others run, and
    ``--out`` is not even created."""
    out = tmp_path / "out"
    quick = [] if "--sections" in args else ["--no-sections"]  # where a bad value is missed, the run stays short
    try:
        rc = main(["run", "--no-progress", "--out", str(out), *quick, *args])
    except SystemExit as exc:  # argparse's own errors
        rc = exc.code
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: "), (rc, err[-3:])
    assert all(n in err[0] for n in needles), err[0]
    assert not out.exists()
