"""The HTML report reads top down: failures first, then passes, skips folded per reason, and a
summary of what was not checked and why; in a real browser (headless Chromium at 1280x800,
``tests/reports/browser.py``), a nightly-sized and a smoke report show a person what they must
see on the first screen, and every planted layout bug is seen."""

from __future__ import annotations

import importlib.util
import os
import re
import struct
from pathlib import Path
from typing import Callable

import pytest

from moe_fq_parity.reports.html import render_html
from moe_fq_parity.reports.render import find_browser, screenshot
from moe_fq_parity.reports.schema import SCHEMA_VERSION
from moe_fq_parity.reports.writer import write_report

from .browser import VIEWPORT, Browser, Plant, find_chromium
from .sized_reports import sized_report

NOT_IMPL = "triton kernel does not implement int8 variant 'step'"
RAGGED = "layout invariant needs experts of one shape"


def _rec(case: str, verdict: str, message: str = "", check: str = "forward", backend: str = "triton") -> dict:
    return {"key": f"{case}|{backend}|{check}", "case_id": case, "backend": backend, "check": check, "verdict": verdict, "fmt": "int8", "n": 4,
            "numel": 100, "mode": "strict", "message": message, "max_ulp": 0 if verdict != "fail" else 9,
            "counts": {"exact": 100 if verdict != "fail" else 90, "ulp1": 0, "tie_flip": 0, "error": 0 if verdict != "fail" else 10},
            "histogram": [], "per_expert": [], "offenders": [], "perf": None, "repro": f"moe-fq-parity run --case {case}", "duration_s": 0.0}


def _report() -> dict:
    records = [_rec(f"int8.cuda/c{k}", "pass") for k in range(3)]
    records += [_rec(f"int8.cuda/f{k}", "fail", "10 of 100 elements differ") for k in range(2)]
    records += [_rec(f"int8.step/s{k}", "skip", NOT_IMPL) for k in range(5)]
    records += [_rec(f"int8.cuda/r{k}", "skip", RAGGED, check="invariant.layout") for k in range(2)]
    meta = {"git_commit": None, "torch": "t", "triton": None, "python": "3", "device": "cpu", "copy_gbps": None, "suite": "ci", "seed": 1,
            "mode": "strict", "started": "now", "finished": "later", "source": "cli", "checks": ["forward", "invariant.layout"],
            "backends": [{"spec": "triton", "name": "triton", "available": True, "reason": ""},
                         {"spec": "te", "name": "te", "available": False, "reason": "Transformer Engine needs a CUDA GPU"}]}
    return {"schema_version": SCHEMA_VERSION, "complete": True, "error": None, "meta": meta, "records": records, "sections": [
        {"name": "moe", "title": "MoE", "verdict": "pass", "columns": [], "notes": "",
         "rows": [{"id": "moe/x", "verdict": "skip", "message": "device cpu is not CUDA"}]}], "baseline": None}


def _text(html: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", html))


def test_failures_first_then_passes_then_one_line_per_skip_reason():
    html = render_html(_report())
    fwd = html[html.index('id="check-forward"'):html.index('id="check-invariant.layout"')]
    assert "(2 failed, 3 passed, 5 skipped)" in fwd
    first_fail, passes, skips = fwd.index("int8.cuda/f0"), fwd.index("3 passing rows"), fwd.index("5 skipped</span>")
    assert first_fail < passes < skips
    assert '<tr class="skip"' not in html  # no skipped record is a table row
    assert _text(fwd).count(NOT_IMPL.replace("'", "&#39;")) == 1  # five skips, one counted line
    group = fwd[fwd.rindex("<details", 0, skips):]
    assert group.startswith('<details class="skipgroup">') and all(f"int8.step/s{k}" in group for k in range(5))


def test_summary_says_what_was_not_checked_and_why():
    html = render_html(_report())
    summary = _text(html[html.index('id="not-checked"'):html.index("ULP histograms")])
    assert "backend te did not run: Transformer Engine needs a CUDA GPU" in summary
    assert "check perf: not timed: timing is off on CPU unless --perf" in summary
    assert "check backward.clipped: not requested (--checks)" in summary
    assert f"5 records on triton (5 cases; forward): {NOT_IMPL}".replace("'", "&#39;") in summary
    assert f"2 records on triton (2 cases; invariant.layout): {RAGGED}" in summary
    assert "section moe: 1 row skipped: device cpu is not CUDA" in summary
    assert summary.index("5 records") < summary.index("2 records")  # largest first


def test_everything_checked_says_so():
    rep = _report()
    rep["records"] = [r for r in rep["records"] if r["verdict"] != "skip"]
    rep["meta"]["backends"] = rep["meta"]["backends"][:1]
    rep["meta"]["checks"] = []
    rep["sections"] = []
    assert "Everything selected was checked" in render_html(rep)


def _needs_a_browser(selenium: bool = True) -> None:
    """Skip where Chromium (or Selenium) is missing, with what installs it; in CI (``CI`` set, as
    ``.ci/run`` runs) fail instead: CI installs them, and a browser test that skips there checks nothing."""
    missing = []
    if (find_chromium() if selenium else find_browser()) is None:
        missing.append("Chromium and its driver: apt-get install -y chromium chromium-driver")
    if selenium and importlib.util.find_spec("selenium") is None:
        missing.append("Selenium: pip install -e '.[test]'")
    if missing:
        if os.environ.get("CI"):
            pytest.fail(f"CI runs the browser tests (.ci/run installs what they need), but this host lacks {'; '.join(missing)}")
        pytest.skip(f"needs {'; '.join(missing)}")


def test_report_with_failures_and_folded_skips_renders_in_headless_chromium(tmp_path):
    """``python -m moe_fq_parity.reports.render``'s screenshot (Chromium alone, no driver)."""
    _needs_a_browser(selenium=False)
    _, html_path = write_report(tmp_path, _report())
    shot = screenshot(html_path, tmp_path / "shot.png", height=1400)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


LONG = ("backend refused options {'variant': 'step'}: NotImplementedError: kernels implements variants ('cuda',) of int8, not 'step' "
        "(raised in /work/venv/lib/python3.11/site-packages/moe_fq_parity/harness/backends/triton_backend.py:88) " + "x" * 300)


def _failing_report() -> dict:
    rep = _report()
    rep["records"] += [_rec("int8.cuda/f0", "fail", "3 of 100 elements differ: 3 are tie flips", check="invariant.recalibrate")]
    rep["records"] += [_rec(f"int8.step/l{k}", "skip", LONG) for k in range(4)]
    rep["records"] += [_rec("int8.cuda/c0", "pass", check="backward.clipped")]
    for r in rep["records"]:
        r["key"] = f"{r['case_id']}|{r['backend']}|{r['check']}"
        if r["verdict"] == "pass" and r["check"] == "forward":
            r["histogram"] = [100, 0, 0, 0, 0, 0, 0, 0, 0]
    rep["records"][0]["histogram"] = []  # a forward pass without outputs to compare (a rejection the spec requires)
    rep["sections"].append({"name": "external", "title": "External", "verdict": "fail", "columns": [], "notes": "", "rows": [
        {"id": "external/modelopt/int8/variants", "verdict": "fail", "message": "matches no variant", "repro": "python -m x"},
        {"id": "external/te/fp8/variants", "verdict": "skip", "message": "Transformer Engine is not installed"},
        {"id": "external/modelopt-eager/int8/variants", "verdict": "pass", "message": ""}]})
    rep["not_applicable"] = {"triton": {"records": 2800, "cases": 470, "reasons": [
        {"reason": "triton implements the int8 variants ['cuda'], not 'eager'", "records": 342, "cases": 57}]}}
    return rep


def test_a_failing_report_shows_what_failed_before_anything_else():
    html = render_html(_failing_report())
    body = html[html.index("<body>"):]
    top = body[body.index('id="failures"'):body.index("<h2>Summary</h2>")]
    assert body.index('id="failures"') < body.index("<h2>Summary</h2>") < body.index("ULP histograms") < body.index('id="check-forward"')
    text = _text(top)
    assert "3 failing records in 2 cases" in text and "1 failing section row" in text
    # one cause, two checks: the case is listed once, with both of its failing checks
    assert top.count('<td class="mono">int8.cuda/f0</td>') == 1
    assert "forward : 10 of 100 elements differ" in text and "invariant.recalibrate : 3 of 100 elements differ" in text
    assert "external/modelopt/int8/variants" in text and "matches no variant" in text and "python -m x" in text
    assert 'href="#int8.cuda/f0|triton|invariant.recalibrate"' in top  # each check links to its record row


def test_counts_styled_by_value_and_section_skips_shown():
    html = render_html(_failing_report())
    summary = html[html.index("<h2>Summary</h2>"):html.index('id="not-checked"')]
    check_rows = re.findall(r"<tr><td>([\w.]+)</td><td class=\"num (\w*)\">(\d+)</td>", summary)
    assert ("invariant.recalibrate", "zero", "0") in check_rows and ("forward", "pass", "3") in check_rows, check_rows
    assert not re.search(r'class="num pass">0<', summary)  # a zero is never bold green
    ext = _text(summary[summary.index('"#section-external"'):])
    assert re.search(r"External fail 1 1 1 ", ext[:60]), ext[:60]  # pass, fail, skip


def test_not_checked_groups_long_reasons_without_paths():
    html = render_html(_failing_report())
    summary = _text(html[html.index('id="not-checked"'):html.index("ULP histograms")])
    line = summary[summary.index("4 records on triton (4 cases; forward): backend refused options"):]
    assert "/work/venv" not in summary and "triton_backend.py:88)" in line
    assert line.index("\u2026") < 300  # cut, the whole text in the title


def test_not_applicable_is_one_counted_line_apart_from_skips():
    html = render_html(_failing_report())
    na = _text(html[html.index('id="not-applicable"'):html.index('id="not-checked"')])
    assert "2,800 checks of 470 cases on triton: not applicable to this backend" in na
    assert "57 cases: triton implements the int8 variants ['cuda'], not 'eager'".replace("'", "&#39;") in na
    assert "2800" not in _text(html[html.index('id="not-checked"'):])


def test_histogram_says_what_it_counts():
    html = render_html(_failing_report())
    text = _text(html[html.index("ULP histograms"):html.index("Bandwidth")])
    assert "14 forward records (3 pass, 2 fail, 9 skip): the 2 that compared outputs are counted here" in text, text[:400]
    assert "the other 12 had no outputs to compare" in text


# --- in a real browser: what a person sees on the first screen (tests/reports/browser.py) ---------


@pytest.fixture(scope="module")
def browser():
    _needs_a_browser()
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def pages(tmp_path_factory) -> Callable[[str], tuple[dict, Path]]:
    """``pages(size)``: the nightly-sized report of a run with 3 failing cases, or the passing smoke
    report of a default ``moe-fq-parity run`` (``sized_reports``), and its HTML page; each built
    once, when a test first asks (xdist may give this module's tests to several workers)."""
    made: dict[str, tuple[dict, Path]] = {}

    def page(size: str) -> tuple[dict, Path]:
        if size not in made:
            report = sized_report(size, failing=3 if size == "nightly" else 0)
            html = tmp_path_factory.mktemp(size) / "report.html"
            html.write_text(render_html(report))  # as the report writer renders it (the JSON it would write is this report)
            made[size] = (report, html)
        return made[size]

    return page


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    return struct.unpack(">II", data[16:24])


def _shots(tmp_path: Path) -> Path:
    """Where the screenshots go: ``$MOE_FQ_PARITY_SHOTS`` to keep them (to look at them), else the test's folder."""
    keep = os.environ.get("MOE_FQ_PARITY_SHOTS")
    return Path(keep) if keep else tmp_path


@pytest.mark.parametrize("size", ["smoke", "nightly"])  # then the nightly plant: each page is loaded twice, not more
def test_the_first_screen_shows_what_a_person_needs(browser, pages, size, tmp_path):
    report, html = pages(size)
    shot = _shots(tmp_path) / f"first-screen-{size}.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    problems = browser.look(html, report, shot)
    assert not problems, "\n".join(problems)
    assert _png_size(shot) == VIEWPORT


PLANTED = [
    # (the bug, the report it is planted in, the plant, what the browser check must say)
    ("failures moved below everything", "nightly", Plant(css="body { display: flex; flex-direction: column; } #failures { order: 1; }"),
     ["what failed (#failures h2) is not on the first screen", "the passing rows (top"]),
    ("verdict hidden", "smoke", Plant(css="h1 .badge { display: none; }"), ["the verdict (h1 .badge) is not on the page"]),
    ("a table that never wraps", "smoke", Plant(css="td, th { white-space: nowrap; } td.msg { max-width: none; }"), ["is wider than the window"]),
    ("tiny table text", "smoke", Plant(css="table, code, .mono { font-size: 8px; }"), ["has 8.0 px text"]),
    ("cells that cut their text", "smoke", Plant(css="td { max-width: 2.5em; overflow: hidden; white-space: nowrap; }"),
     ["cuts off the text of a cell"]),
    ("a page wider than the window", "smoke", Plant(html='<div style="width: 1900px">wide</div>'), ["the page scrolls sideways"]),
    ("a console error", "smoke", Plant(script="console.error('planted')"), ["console error", "planted"]),
    ("the atlas pushed below its section's first screen", "nightly", Plant(css="#section-atlas + p { min-height: 900px; }"),
     ["the disagreement atlas's first pair", "is not on the first screen of #section-atlas"]),
]
"""One planted layout bug per check of ``Browser.look``; a new check adds its bug here."""


@pytest.mark.parametrize("plant", PLANTED, ids=[p[0] for p in PLANTED])
def test_a_planted_layout_bug_is_seen(browser, pages, plant):
    """Each check of the first screen fails on the page with its bug planted (and passes without it,
    ``test_the_first_screen_shows_what_a_person_needs``)."""
    _, size, bug, says = plant
    report, html = pages(size)
    problems = browser.look(html, report, plant=bug)
    assert all(any(s in p for p in problems) for s in says), problems
    assert not browser.driver.execute_script("return document.querySelectorAll('[data-planted]').length"), "the plant stayed in the page"


def test_the_sized_reports_carry_the_sections_real_columns():
    """``sized_reports`` lays its section rows out as the sections do (their ``COLUMNS``, read from
    the section modules): a column added there is a column in the browser tests' tables."""
    from .sized_reports import SECTION_FILES, SECTIONS, section_columns

    assert {name: list(SECTIONS[name][2]) for name in SECTION_FILES} == {name: section_columns(name) for name in SECTION_FILES}
