"""A backend cannot change what the reference computes, nor end, hang or interrupt the run.

Process-global numeric settings (``harness.core.guard.SETTINGS``): what building a backend sets, its
calls run with and the reference never sees; what a call leaves changed fails that call and is set
back.  Isolation (``harness.run.isolation``): the cases run in a supervised worker process, so a
backend that exits, segfaults, hangs past the timeout or raises ``KeyboardInterrupt`` gives
``crash``/``timeout``/failed records and the run goes on with the next case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from moe_fq_parity.harness.core.guard import ProcessState, ProcessStateChanged, building, guarded
from moe_fq_parity.harness.run.cli import main

HOSTILE = "tests.harness.hostile_backends"
SPECIAL = "int8.reciprocal/per_expert/stacked/N4/16x48/special@design/s0"
"""Its inputs hold denormals: flushing them changes the outputs."""
INT8 = "int8.cuda/per_expert/stacked/N4/8x40/outliers/s0"


def _run(out: Path, *args: str) -> tuple[int, dict]:
    rc = main(["run", "--no-progress", "--no-sections", "--out", str(out), *args])
    return rc, json.loads((out / "report.json").read_text())


# --- process-global numeric state ------------------------------------------------------------------

def test_a_call_that_leaves_a_setting_changed_fails_and_is_set_back():
    before = ProcessState.capture()
    call = guarded(lambda: torch.set_default_dtype(torch.float64), None)
    assert isinstance(call.error, ProcessStateChanged) and "default_dtype torch.float32 -> torch.float64" in call.message
    assert torch.get_default_dtype() == torch.float32 and not before.changes(ProcessState.capture())


def test_what_building_sets_the_calls_run_with_and_the_harness_does_not():
    with building() as built:
        torch.set_flush_denormal(True)
    assert not ProcessState.capture().changes(ProcessState.capture().with_values([("flush_denormal", False)]))
    assert dict(built[0].chosen) == {"flush_denormal": True} and "flush_denormal False -> True" in built[0].note()
    tiny = float.fromhex("0x1p-1074")
    call = guarded(lambda: tiny * 1.0, None, built[0].chosen)
    assert call.ok and call.value == 0.0, "the call did not run in the backend's state"
    assert tiny * 1.0 == tiny, "the backend's state leaked out of its call"


def test_a_backend_flushing_denormals_is_judged_against_a_clean_reference(tmp_path):
    """Building it turns flushing on; the in-process reference used to flush too and the case passed."""
    rc, report = _run(tmp_path / "ftz", "--case", SPECIAL, "--backend", f"{HOSTILE}:FlushesDenormals", "--checks", "forward")
    assert rc == 1 and report["records"][0]["verdict"] == "fail", report["records"][0]["message"]
    assert "flush_denormal False -> True" in report["meta"]["backends"][0]["note"]
    assert float.fromhex("0x1p-1074") * 1.0 != 0.0  # this process does not flush afterwards


def test_a_backend_setting_the_default_dtype_fails_itself_not_the_next_case(tmp_path):
    rc, report = _run(tmp_path / "dt", "--case", INT8, "--case", SPECIAL, "--backend", f"{HOSTILE}:SetsDefaultDtype",
                      "--backend", "reference", "--checks", "forward")
    assert rc == 1 and len(report["records"]) == 4
    by = {(r["case_id"], r["backend"].split(":")[-1]): r for r in report["records"]}
    assert all(by[(c, "reference")]["verdict"] == "pass" for c in (INT8, SPECIAL))
    assert all(by[(c, "SetsDefaultDtype")]["verdict"] == "fail" and "default_dtype" in by[(c, "SetsDefaultDtype")]["message"]
               for c in (INT8, SPECIAL))
    assert torch.get_default_dtype() == torch.float32
