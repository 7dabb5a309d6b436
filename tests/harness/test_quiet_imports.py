"""Third-party import warnings stay out of our output, and only those (``quiet_imports.quiet_import``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from moe_fq_parity.harness.backends.quiet_imports import try_import

from tests.extras import importable

REPO = Path(__file__).resolve().parents[2]


def test_an_optional_import_hides_its_own_warnings_only(tmp_path, monkeypatch):
    (tmp_path / "noisy_optional_pkg.py").write_text("import warnings\nwarnings.warn('Apex is not installed', UserWarning)\nVALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        mod, why = try_import("noisy_optional_pkg")
        assert mod is not None and mod.VALUE == 1 and why == ""
        assert [str(w.message) for w in seen] == []
        warnings.warn("the user's own warning", UserWarning)  # the filter did not outlive the import
    assert [str(w.message) for w in seen] == ["the user's own warning"]


LIST_LINE = re.compile(r"^(formats: .*|  \S+: .*; variants .*|suite \S+: \d+ cases, [\d.]+ M elements|backends: .*"
                       r"|  \S+\s+(built-in|external)\s+(available|unavailable).*)$")


@pytest.mark.skipif(not (importable("megatron") or importable("modelopt")), reason="Megatron-Core / Model-Optimizer not installed: nothing warns")
def test_list_prints_its_table_and_no_third_party_warnings():
    """With the README's install line, ``list`` printed five Megatron-Core ``UserWarning``s (Apex and
    Transformer Engine missing) in the middle of its table; every stdout line is a table line and
    stderr is empty."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHONWARNINGS")}
    proc = subprocess.run([sys.executable, "-m", "moe_fq_parity.harness", "list"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr == "", proc.stderr[-2000:]
    bad = [ln for ln in proc.stdout.splitlines() if not LIST_LINE.match(ln)]
    assert not bad and "modelopt-eager" in proc.stdout, bad


def test_an_upstream_call_hides_that_package_s_warnings_only(tmp_path, monkeypatch):
    from moe_fq_parity.harness.backends.quiet_imports import quiet_upstream

    (tmp_path / "noisy_upstream_pkg.py").write_text(
        "import warnings\ndef load():\n    warnings.warn('load_state_dict is deprecated', FutureWarning)\n    return 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import noisy_upstream_pkg

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with quiet_upstream("noisy_upstream_pkg", FutureWarning):
            assert noisy_upstream_pkg.load() == 1
            warnings.warn("ours, inside the block", FutureWarning)
        noisy_upstream_pkg.load()  # after the block: shown again
    assert [str(w.message) for w in seen] == ["ours, inside the block", "load_state_dict is deprecated"]


def test_an_upstream_call_holds_back_that_package_s_log_records_and_torch_s_warnings_about_it(caplog):
    """Megatron-Core 0.19 logs "MCore's async save is deprecated" per rank and makes torch warn about
    how it calls ``load`` (18 lines each in one save and one load layout of the dist section): inside
    ``quiet_upstream`` its records below ERROR and the named torch warnings are held back, nothing else."""
    import logging

    from moe_fq_parity.harness.backends.quiet_imports import quiet_upstream

    upstream, other = logging.getLogger("noisy_upstream_pkg.strategies"), logging.getLogger("someone_else")
    with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO):
        warnings.simplefilter("always")
        with quiet_upstream("noisy_upstream_pkg", messages=("The argument order of load has been changed",)):
            upstream.warning("async save is deprecated")
            upstream.error("a real error")
            other.warning("not theirs")
            warnings.warn("The argument order of load has been changed. Please check the document.", UserWarning)
            warnings.warn("another torch warning", UserWarning)
        upstream.warning("after the block")
    assert [r.getMessage() for r in caplog.records] == ["a real error", "not theirs", "after the block"]
    assert [str(w.message) for w in seen] == ["another torch warning"]


def test_an_upstream_call_holds_back_its_records_on_the_root_logger(tmp_path, monkeypatch, caplog):
    """torch's checkpoint loader logs on the root logger (``logging.getLogger()``) a warning with its
    traceback for every metadata file it cannot read: 15 tracebacks in the README's first command,
    from the dist section's deliberately broken checkpoints.  Records of the package's modules
    below ERROR are held back; its errors, and root records from anywhere else, are not."""
    import logging

    from moe_fq_parity.harness.backends.quiet_imports import quiet_upstream

    pkg = tmp_path / "noisy_root_pkg" / "checkpoint"
    pkg.mkdir(parents=True)
    (pkg.parent / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "loader.py").write_text("import logging\nlogger = logging.getLogger()\n"
                                   "def load():\n    logger.warning('Rank local metadata is not found.')\n    logger.error('a real error')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from noisy_root_pkg.checkpoint import loader

    with caplog.at_level(logging.INFO):
        with quiet_upstream("noisy_root_pkg.checkpoint"):
            loader.load()
            logging.getLogger().warning("ours, on the root logger")
        loader.load()
    assert [r.getMessage() for r in caplog.records] == ["a real error", "ours, on the root logger", "Rank local metadata is not found.",
                                                        "a real error"]
