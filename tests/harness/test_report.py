"""Reports: schema, escaping, pictures, atomic writes, sections, Chromium rendering."""

from __future__ import annotations

import base64
import json

import pytest

from moe_fq_parity.harness.core.records import CheckRecord, Offender
from moe_fq_parity.harness.sections.processes import run_section
from moe_fq_parity.reports.html import render_html
from moe_fq_parity.reports.render import find_browser, screenshot
from moe_fq_parity.reports.schema import validate
from moe_fq_parity.reports.writer import ReportWriter, atomic_write_text

EVIL = '<script>alert("x")</script>'


def _meta() -> dict:
    return {"git_commit": None, "torch": "t", "triton": None, "python": "3", "device": "cpu", "copy_gbps": 100.0, "suite": "smoke",
            "backends": [{"spec": "b", "name": "b", "available": True, "reason": ""}], "seed": 1, "mode": "strict",
            "started": "now", "finished": None, "source": "cli"}


def _record(**kw) -> dict:
    base = dict(case_id=f"int8.cuda/per_expert/stacked/N4/8x40/normal/s0{EVIL}", backend="b", check="forward", verdict="fail", fmt="int8",
                n=4, numel=100, message=EVIL, max_ulp=3, counts={"exact": 90, "ulp1": 5, "tie_flip": 3, "error": 2},
                histogram=(90, 5, 5, 0, 0, 0, 0, 0, 0),
                offenders=(Offender(0, 1, 2, 0.5, float("nan"), float("inf"), 63.5, None, "error"),))
    return CheckRecord(**(base | kw)).to_json()


def test_record_json_is_the_dataclass_tree_in_field_order_and_aliases_nothing():
    """``CheckRecord.to_json`` (built field by field) against ``dataclasses.asdict``, the tree it
    replaces: the same keys in the same order and the same values, ``key`` last, tuples as lists;
    the dicts it returns are copies (changing one leaves the record as it was)."""
    from dataclasses import asdict

    from moe_fq_parity.harness.core.records import ExpertStats, Perf

    perf = Perf(time_us=10.0, gbps=50.0, pct_of_copy=None, timer="cuda_event", samples_us=(10.0, 11.5), bytes_moved=500, host_us=3.0)
    rec = CheckRecord.from_json(_record(per_expert=(ExpertStats(0, 40, 1.5, 3, {"exact": 37, "error": 3}), ExpertStats(1, 0, None, 0, {})),
                                        perf=perf, peak_bytes=7, outcome="crash"))
    want = asdict(rec)
    want["histogram"], want["perf"]["samples_us"] = list(rec.histogram), list(perf.samples_us)
    want["per_expert"], want["offenders"] = [asdict(e) for e in rec.per_expert], [asdict(o) for o in rec.offenders]
    want["key"] = rec.key
    got = rec.to_json()
    assert json.dumps(got) == json.dumps(want)  # order-sensitive: the report's text does not change
    assert CheckRecord.from_json(got) == rec
    got["counts"]["exact"] = -1
    got["per_expert"][0]["counts"]["exact"] = -1
    assert rec.counts["exact"] == 90 and rec.per_expert[0].counts["exact"] == 37


def test_report_is_valid_escaped_and_has_real_pictures(tmp_path):
    from moe_fq_parity.harness.core.records import Perf

    w = ReportWriter(tmp_path, _meta())
    perf = Perf(time_us=10.0, gbps=50.0, pct_of_copy=50.0, timer="perf_counter", samples_us=(10.0,), bytes_moved=500)
    w.add([_record(), _record(check="perf", verdict="pass", message="", perf=perf, n=8)])
    w.finish(complete=True)
    report = json.loads(w.json_path.read_text())
    validate(report)
    assert report["records"][0]["offenders"][0]["expected"] == "nan"
    html = w.html_path.read_text()
    assert EVIL not in html and "&lt;script&gt;" in html
    pngs = [p.split('"')[0] for p in html.split("data:image/png;base64,")[1:]]
    assert len(pngs) >= 3  # aggregate histogram, per-case histogram, bandwidth vs N
    assert all(base64.b64decode(p)[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert html.index("fail") < html.index("passing rows") and "http://" not in html.replace("http://www.w3.org", "")


def test_schema_rejects_a_broken_report(tmp_path):
    w = ReportWriter(tmp_path, _meta())
    w.add([_record()])
    w.finish(complete=True, html=False)
    report = json.loads(w.json_path.read_text())
    report["records"][0]["verdict"] = "maybe"
    with pytest.raises(Exception, match="maybe"):
        validate(report)


def test_atomic_write_keeps_the_old_file_on_failure(tmp_path):
    path = tmp_path / "report.json"
    atomic_write_text(path, "old")

    with pytest.raises(TypeError):
        atomic_write_text(path, 123)  # type: ignore[arg-type]
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_incremental_writes_mark_incomplete(tmp_path):
    w = ReportWriter(tmp_path, _meta(), interval_s=0)
    w.write_json()
    w.add([_record(verdict="pass", message="")])
    mid = json.loads(w.json_path.read_text())
    assert not mid["complete"] and len(mid["records"]) == 1


def test_section_runner_failures_are_contained():
    assert run_section("x", "tests.harness.no_such:run", "smoke", 1, "cpu").verdict == "skip"
    assert run_section("x", "tests.harness.fake_sections:nothing", "smoke", 1, "cpu").verdict == "skip"
    bad = run_section("x", "json:dumps", "smoke", 1, "cpu")
    assert bad.verdict == "fail" and "raised" in bad.rows[0].message
    assert run_section("ok", "tests.harness.fake_sections:passing", "smoke", 1, "cpu").verdict == "pass"


@pytest.mark.skipif(find_browser() is None, reason="no Chromium (apt-get install -y chromium)")
def test_renders_in_headless_chromium(tmp_path):
    w = ReportWriter(tmp_path, _meta())
    w.add([_record()])
    w.finish(complete=True)
    shot = screenshot(w.html_path, tmp_path / "shot.png", height=1200)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000


def test_render_html_needs_only_the_json(tmp_path):
    report = {"schema_version": "1.0", "complete": False, "error": "boom", "meta": _meta(), "records": [], "sections": [], "baseline": None}
    html = render_html(report)
    assert "Incomplete run" in html and "No forward records" in html


def test_histogram_ticks_are_plain_text_powers_of_ten():
    """The ULP histograms' log axis is labelled ``0``, ``10⁰`` ... ``10⁶`` in plain text (no TeX
    parse per label); values between powers get no label."""
    from moe_fq_parity.reports.plots import _power_of_ten_label

    assert [_power_of_ten_label(v) for v in (0.0, 1.0, 10.0, 1e3, 1e6, 5.0, 20.0)] == ["0", "10⁰", "10¹", "10³", "10⁶", "", ""]
