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

The ready parity test (``tests/harness/test_parity.py``) on a host without CUDA: there the ``triton``
backend runs under Triton's interpreter, at about half a second a forward check.  Its tests of the
``smoke`` cases (``INTERPRETED_SUITE``), plus the first ``ci`` case of every variant, option set,
granularity and layout that no smoke case has (``tests.tiers.interpreted_cases``: each such combination of the
kernel runs), stay in the default tier; those of the other ``ci`` cases are marked ``slow`` (``-m
slow`` runs them, interpreted); on a GPU host nothing changes (they are ``gpu`` tests there).  Why, and the kernel
mutants the default tier still kills (``scripts/kernel_mutants.py``): ``docs/measured.md`` section 12e.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from tests.extras import EXTRAS, importable, install_hint
from tests.tiers import INTERPRETED_BACKEND, INTERPRETED_SUITE, PARITY_TEST, interpreted_parity_outside_kept_is_slow

ROOT = Path(__file__).resolve().parent
FOLDER_NEEDS = {"tests/kernels": "triton"}
"""Test folder -> the extra module every test in it needs."""
_MISSING = re.compile(r"ModuleNotFoundError: No module named '([A-Za-z0-9_]+)")
def pytest_report_header(config: pytest.Config) -> str | None:
    if torch.cuda.is_available():
        return None
    return (f"{PARITY_TEST}: no CUDA device: the {INTERPRETED_BACKEND} backend's interpreted parity tests of the "
            f"{INTERPRETED_SUITE} cases and of one ci case per variant, granularity and layout not in it are in the default tier, "
            "those of the other ci cases are marked slow (-m slow runs them)")


def _skip_gpu_tests_without_cuda(items: list[pytest.Item]) -> None:
    """Skip this repository's tests marked ``gpu`` when there is no CUDA device."""
    mine = [item for item in items if item.get_closest_marker("gpu") and Path(item.path).resolve().is_relative_to(ROOT)]
    if mine and not torch.cuda.is_available():
        for item in mine:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA device"))


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    interpreted_parity_outside_kept_is_slow(items)
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
