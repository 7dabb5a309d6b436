"""Layers run one way: the harness imports ``reports``; ``reports`` never imports the harness.

The shared vocabulary (check names, verdicts, histogram edges, ``overall_verdict``) lives in
``reports.schema``; the harness takes it from there.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.layers import package_imports, within

REPORTS = Path(__file__).resolve().parents[2] / "reports"


def test_no_reports_module_imports_the_harness_in_its_source():
    offenders = [str(i) for i in package_imports(REPORTS, "moe_fq_parity.reports") if within(i.module, ("moe_fq_parity.harness",))]
    assert not offenders, offenders


def test_importing_and_using_reports_loads_no_harness_module():
    """Rendering, merging and reading a report in a fresh interpreter never imports the harness."""
    code = (
        "import sys\n"
        "from moe_fq_parity.reports import html, merge, plots, render, schema, writer\n"
        "r = {'schema_version': schema.SCHEMA_VERSION, 'complete': True, 'error': None, 'records': [], 'sections': [], 'baseline': None,\n"
        "     'meta': {'suite': 's', 'mode': 'strict', 'seed': 1, 'device': 'cpu', 'started': 'now', 'finished': None, 'backends': []}}\n"
        "html.render_html(r); schema.overall_verdict(r)\n"
        "bad = sorted(m for m in sys.modules if m.startswith('moe_fq_parity.harness'))\n"
        "assert not bad, bad\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_harness_takes_the_vocabulary_from_the_schema_module():
    from moe_fq_parity.harness.core import records, ulp
    from moe_fq_parity.reports import schema

    assert records.CHECKS is schema.CHECKS and records.VERDICTS is schema.VERDICTS and ulp.HIST_EDGES is schema.HIST_EDGES


def test_one_section_verdict_rule_for_the_harness_and_merge():
    from moe_fq_parity.harness.sections import Section, SectionRow
    from moe_fq_parity.reports.schema import section_verdict

    cases = {("pass", "skip"): "pass", ("skip", "skip"): "skip", ("skip", "fail", "pass"): "fail", (): "pass"}
    for verdicts, want in cases.items():
        assert section_verdict(verdicts) == want
        assert Section("s", "t", [], [SectionRow(f"r{i}", v) for i, v in enumerate(verdicts)]).verdict == want
