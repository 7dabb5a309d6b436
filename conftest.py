"""Root pytest configuration of this repository's own test suite.

The harness plugin (options, markers, seeds, Hypothesis profiles, ``--parity-report``) is loaded by
the ``pytest11`` entry point of the installed ``moe-fq-parity`` distribution, here as in any other
project that installs it; nothing needs to be listed here.

Optional extras (``tests/extras.py``): a test that needs an extra which is not installed is
*skipped* with the pip command that installs it, never failed or a collection error:

* every test under a folder of ``FOLDER_NEEDS`` (``tests/kernels``: the Triton kernel);
* a test module that cannot be imported because an extra's module is missing;
* single tests elsewhere carry ``@needs("triton")`` (``tests/extras.py``).

Any other import error stays an error, and with the extra installed nothing is skipped.

GPU tests: a test of this repository marked ``gpu`` is skipped with a reason where there is no CUDA
device (the harness plugin does that for parity tests only, leaving other projects' markers alone).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.extras import EXTRAS, importable, install_hint

ROOT = Path(__file__).resolve().parent
FOLDER_NEEDS = {"tests/kernels": "triton"}
"""Test folder -> the extra module every test in it needs."""
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_]+)")


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    """Skip this repository's tests marked ``gpu`` when there is no CUDA device."""
    mine = [item for item in items if item.get_closest_marker("gpu") and Path(item.path).resolve().is_relative_to(ROOT)]
    if mine and not torch.cuda.is_available():
        for item in mine:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _skip_gpu_tests_without_cuda(items)
    missing = {folder: module for folder, module in FOLDER_NEEDS.items() if not importable(module)}
    if not missing:
        return
    for item in items:
        rel = Path(item.path).resolve().relative_to(ROOT).as_posix() if Path(item.path).resolve().is_relative_to(ROOT) else ""
        for folder, module in missing.items():
            if rel.startswith(folder + "/"):
                item.add_marker(pytest.mark.skip(reason=install_hint(module)))


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):
    outcome = yield
    rep = outcome.get_result()
    if rep.failed and isinstance(collector, pytest.Module):
        m = _MISSING.search(str(rep.longrepr))
        if m and m.group(1) in EXTRAS and not importable(m.group(1)):
            rep.outcome = "skipped"
            rep.longrepr = (str(collector.path), 0, "Skipped: " + install_hint(m.group(1)))
