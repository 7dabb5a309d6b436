"""The pytest plugin's bad inputs: every one is a one-line usage error at session start (exit 4,
nothing written), and a report written under pytest says what pytest saw.

Each test runs pytest in this process (``pytest.main``: no interpreter or torch start-up) on the
ready parity test of ``harness.run.parity_test``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.run.cli import main as cli_main
from moe_fq_parity.harness.run.runner import out_lock
from moe_fq_parity.reports.schema import validate

READY = "moe_fq_parity.harness.run.parity_test"
B = "tests.harness.plugin_backends:"
ONE_CASE = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"
ONE_K = "int8 and stacked and outliers and not limits"
"""A ``-k`` expression selecting exactly the tests of ``ONE_CASE`` in the smoke suite."""


@pytest.fixture
def run_pytest(monkeypatch, capsys, tmp_path):
    """``run_pytest(*args, env={})`` -> ``(exit code, stdout, stderr)`` of a pytest session in this process."""
    for key in list(__import__("os").environ):
        if key.startswith("PARITY_"):
            monkeypatch.delenv(key)

    def run(*args: str, env: dict[str, str] | None = None) -> tuple[int, str, str]:
        for k, v in (env or {}).items():
            monkeypatch.setenv(k, v)
        capsys.readouterr()
        rc = pytest.main(["-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), "--pyargs", READY, *args])
        out, err = capsys.readouterr()
        for k in env or {}:
            monkeypatch.delenv(k)
        return int(rc), out, err

    return run


def _usage_error(rc: int, err: str, *needles: str) -> str:
    """The one ``ERROR:`` line of a usage error (pytest's exit 4) containing every needle."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == pytest.ExitCode.USAGE_ERROR, (rc, err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("ERROR: "), err[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


UNAVAILABLE = [("Unavailable", "the vendor library is not installed"), ("AvailableRaises", "probe exploded")]
if not torch.cuda.is_available():
    UNAVAILABLE.append(("OnCuda", "device 'cuda' is not usable here"))


@pytest.mark.parametrize("name,why", UNAVAILABLE)
def test_named_backend_that_cannot_run_is_a_usage_error(run_pytest, tmp_path, name, why):
    """A backend named on the command line or in ``PARITY_BACKENDS`` that cannot run here fails the
    session at its start (the CLI's exit 2), instead of 54 skips and exit 0; no report is written."""
    rc, out, err = run_pytest("--parity-backend", B + name, "--parity-suite", "smoke", "--parity-report", str(tmp_path / "rep"))
    _usage_error(rc, err, B + name, why)
    assert not (tmp_path / "rep" / "report.json").exists()
    rc, out, err = run_pytest("--parity-suite", "smoke", env={"PARITY_BACKENDS": f"reference,{B}{name}"})
    _usage_error(rc, err, B + name, why)


def test_default_backends_that_cannot_run_still_skip(run_pytest):
    """Not named (the default built-ins): an unavailable one is skipped with its reason, as before."""
    rc, out, err = run_pytest("--parity-suite", "smoke", "-k", "outliers and int8 and reference and forward", "--collect-only")
    assert rc == 0, out[-2000:] + err[-2000:]


@pytest.mark.parametrize("args,env,needle", [
    (("--parity-backend", ""), {}, "--parity-backend / PARITY_BACKENDS: an empty backend name"),
    (("--parity-backend", "reference,"), {}, "--parity-backend / PARITY_BACKENDS: an empty backend name"),
    ((), {"PARITY_BACKENDS": ""}, "PARITY_BACKENDS is set but empty"),
    ((), {"PARITY_BACKENDS": ","}, "--parity-backend / PARITY_BACKENDS: an empty backend name"),
    ((), {"PARITY_MODE": "x"}, "--parity-mode / PARITY_MODE: one of strict"),
    ((), {"PARITY_SEED": "abc"}, "PARITY_SEED: expected an integer, got 'abc'"),
    ((), {"PARITY_SEED": ""}, "PARITY_SEED is set but empty"),
    (("--parity-timeout", "1e10"), {}, "--parity-timeout / PARITY_TIMEOUT: seconds from 0"),
    ((), {"PARITY_TIMEOUT": "inf"}, "PARITY_TIMEOUT"),
    ((), {"PARITY_NAN_BITS": "x"}, "PARITY_NAN_BITS"),
    ((), {"PARITY_SUITE": "nope"}, "PARITY_SUITE"),
    ((), {"PARITY_IN_PROCESS": "maybe"}, "--parity-in-process / PARITY_IN_PROCESS: expected 1 or 0, got 'maybe'"),
    (("--parity-gpu-share-mib", "-1"), {}, "--parity-gpu-share-mib / PARITY_GPU_SHARE_MIB: -1 MiB: give 0"),
    ((), {"PARITY_GPU_SHARE_MIB": "lots"}, "--parity-gpu-share-mib / PARITY_GPU_SHARE_MIB: expected an integer number of MiB, got 'lots'"),
    # the command line's values go through the same checks (not argparse's usage text)
    (("--parity-seed", "abc"), {}, "--parity-seed / PARITY_SEED: expected an integer, got 'abc'"),
    (("--parity-mode", "1ulp"), {}, "--parity-mode / PARITY_MODE: one of strict, 1-ulp expected, got '1ulp'"),
    (("--parity-timeout", "soon"), {}, "--parity-timeout / PARITY_TIMEOUT: expected seconds as a number, got 'soon'"),
    (("--parity-nan-bits", "x"), {}, "--parity-nan-bits / PARITY_NAN_BITS: one of any, strict expected, got 'x'"),
    (("--parity-gpu-share-mib", "lots"), {}, "--parity-gpu-share-mib / PARITY_GPU_SHARE_MIB: expected an integer number of MiB, got 'lots'"),
    (("--parity-suite", "smok"), {}, "--parity-suite / PARITY_SUITE: unknown suite 'smok'; known: smoke, ci"),
    (("--parity-backend", "reference,nosuch"), {}, "--parity-backend nosuch: unknown backend 'nosuch': use one of reference"),
    (("--parity-report", ""), {}, "--parity-report / PARITY_REPORT: an empty folder name"),
])
def test_bad_option_or_environment_value_is_a_one_line_usage_error(run_pytest, args, env, needle):
    """Every setting is checked when the session starts, by the CLI's own checks
    (``harness.run.runner.validate_config``): never a ``KeyError``/``OverflowError`` in every check
    or an INTERNALERROR, and never the built-ins in place of an empty backend list."""
    suite = () if "PARITY_SUITE" in env else ("--parity-suite", "smoke")  # the command line wins over PARITY_*
    rc, out, err = run_pytest(*suite, "-k", "outliers and int8", *args, env=env)
    _usage_error(rc, err, needle)


def test_parity_report_naming_a_file_is_a_usage_error(run_pytest, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("keep me")
    rc, out, err = run_pytest("--parity-backend", "reference", "--parity-suite", "smoke", "--parity-report", str(target))
    _usage_error(rc, err, "--parity-report", str(target))
    assert target.read_text() == "keep me"


def test_parity_report_honours_the_run_lock(run_pytest, tmp_path):
    """Another run (CLI or pytest) writing to the same folder: a usage error, the folder untouched."""
    rep = tmp_path / "rep"
    with out_lock(rep):
        rc, out, err = run_pytest("--parity-backend", "reference", "--parity-suite", "smoke", "--parity-report", str(rep))
        _usage_error(rc, err, "another run", str(rep))
    assert sorted(p.name for p in rep.iterdir()) == []  # nothing written; the holder's lock file goes with its run


def test_merge_out_honours_the_run_lock(tmp_path, capsys):
    """``merge --out`` into a folder another run holds: exit 2 naming the folder, no report written.  The
    shards only feed the merge: their forward checks, in process (no worker to start)."""
    cases = ["--no-sections", "--no-progress", "--backend", "reference", "--suite", "ci", "--cases", "int8.cuda/per_expert/*/N4/8x40/*",
             "--checks", "forward", "--in-process"]
    for i in (1, 2):
        assert cli_main(["run", *cases, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    merged = tmp_path / "merged"
    with out_lock(merged):
        capsys.readouterr()
        rc = cli_main(["merge", str(tmp_path / "s1" / "report.json"), str(tmp_path / "s2" / "report.json"), "--out", str(merged)])
        err = capsys.readouterr().err
    assert rc == 2 and "another run" in err and str(merged) in err, err
    assert not (merged / "report.json").exists()


def test_bad_k_expression_writes_no_report(run_pytest, tmp_path):
    """pytest's usage error after collection (``-k`` that does not parse, exit 4) writes nothing: an
    earlier report in the folder stays as it was."""
    rep = tmp_path / "rep"
    rc, out, err = run_pytest("--parity-backend", "reference", "--parity-suite", "smoke", "--parity-report", str(rep), "-k", "int8 and (")
    assert rc == pytest.ExitCode.USAGE_ERROR, out[-2000:] + err[-2000:]
    assert not (rep / "report.json").exists() and not (rep / "report.html").exists()
    rc, out, err = run_pytest("--parity-backend", "reference", "--parity-suite", "smoke", "--parity-report", str(rep), "-k", "no_such_test")
    assert rc == pytest.ExitCode.NO_TESTS_COLLECTED and not (rep / "report.json").exists()


def test_report_counts_a_parity_test_that_failed_before_its_check_recorded(run_pytest, tmp_path):
    """A parity test that fails in pytest without a failing record (here: building the case's inputs
    raises, in process: a worker records that as the check's failure itself) is a failing record of
    the report, with the pytest error and the repro command; the report is never a complete pass
    beside failed tests."""
    rep = tmp_path / "rep"
    rc, out, err = run_pytest("--parity-backend", B + "OnMeta", "--parity-suite", "smoke", "--parity-report", str(rep),
                              "-k", f"{ONE_K} and forward", "--parity-in-process")
    assert rc == pytest.ExitCode.TESTS_FAILED and "1 failed" in out, out[-3000:]
    report = json.loads((rep / "report.json").read_text())
    validate(report)
    fails = [r for r in report["records"] if r["verdict"] == "fail"]
    assert [(r["case_id"], r["backend"], r["check"]) for r in fails] == [(ONE_CASE, B + "OnMeta", "forward")], report["records"]
    assert "the test failed in pytest" in fails[0]["message"] and fails[0]["repro"].startswith("moe-fq-parity run --case " + ONE_CASE)


def test_report_of_a_run_stopped_by_maxfail_is_incomplete(run_pytest, tmp_path):
    rep = tmp_path / "rep"
    rc, out, err = run_pytest("--parity-backend", B + "OnMeta", "--parity-suite", "smoke", "--parity-report", str(rep), "-x",
                              "-k", "int8 and forward")
    assert rc == pytest.ExitCode.TESTS_FAILED, out[-3000:]
    report = json.loads((rep / "report.json").read_text())
    assert report["complete"] is False and "stopped" in report["error"], report["error"]


def test_report_of_a_passing_run_is_complete(run_pytest, tmp_path):
    rep = tmp_path / "rep"
    rc, out, err = run_pytest("--parity-backend", B + "Reference", "--parity-suite", "smoke", "--parity-report", str(rep),
                              "-k", ONE_K)
    assert rc == 0, out[-3000:]
    report = json.loads((rep / "report.json").read_text())
    validate(report)
    assert report["complete"] is True and report["error"] is None and {r["verdict"] for r in report["records"]} <= {"pass", "skip"}
    assert any(r["verdict"] == "pass" for r in report["records"])


def test_a_backend_spec_names_an_instance_a_class_or_a_factory():
    """What the README says of ``pkg.mod:obj``: an instance is used as it is; a class, or a function
    taking no argument, is called once with no argument."""
    from moe_fq_parity.harness.backends import load

    from tests.harness import plugin_backends as pb

    loaded = {name: load(B + name) for name in ("INSTANCE", "Reference", "make_reference")}
    assert all(lb.available for lb in loaded.values()), {n: lb.why_not for n, lb in loaded.items()}
    assert loaded["INSTANCE"].obj is pb.INSTANCE
    assert type(loaded["Reference"].obj) is pb.Reference and loaded["Reference"].obj is not pb.INSTANCE
    assert type(loaded["make_reference"].obj) is pb.Reference
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert "an instance is used as it is; a class, or a function taking no argument, is called once with no argument" in readme


def test_collect_only_lists_the_tests_of_a_named_backend_that_cannot_run(run_pytest):
    """Listing runs no backend: ``--collect-only`` is no usage error (the run itself is)."""
    rc, out, err = run_pytest("--parity-backend", B + "Unavailable", "--parity-suite", "smoke", "--collect-only", "-k", ONE_K)
    assert rc == 0 and f"{ONE_CASE}-{B}Unavailable-forward]" in out, out[-2000:] + err[-2000:]


def test_report_of_a_users_test_failing_after_a_passing_check_is_incomplete(tmp_path, capsys, monkeypatch):
    """A failure the records cannot say (the user's own assertion after a passing check): the report
    is not complete and names the failed test."""
    for key in [k for k in __import__("os").environ if k.startswith("PARITY_")]:
        monkeypatch.delenv(key)
    (tmp_path / "test_mine.py").write_text(
        "def test_mine(parity_check):\n    assert parity_check('forward').verdict == 'pass'\n    assert False, 'my own check'\n")
    rep = tmp_path / "rep"
    rc = pytest.main(["-p", "no:cacheprovider", "-q", "--rootdir", str(tmp_path), str(tmp_path / "test_mine.py"), "--parity-backend",
                      "reference", "--parity-suite", "smoke", "--parity-report", str(rep), "-k", ONE_K])
    out = capsys.readouterr().out
    assert rc == pytest.ExitCode.TESTS_FAILED and "1 failed" in out, out[-3000:]
    report = json.loads((rep / "report.json").read_text())
    assert [r["verdict"] for r in report["records"]] == ["pass"]
    assert report["complete"] is False and "1 parity tests failed in pytest without a failing record" in report["error"], report["error"]
    assert f"test_mine.py::test_mine[{ONE_CASE}-reference] (call): AssertionError: my own check" in report["error"], report["error"]
