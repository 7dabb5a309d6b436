"""The pytest plugin's GPU leases: a test marked ``gpu`` or ``slow`` holds a GPU for its setup, call
and teardown (``harness.run.gpu_lease``), one such test per GPU at a time however many xdist
workers, except the parity tests of small cases (``--parity-gpu-share-mib``), which share it with
each other; a parity case's tests prefer their case's GPU group.

Imported by the plugin when a test marked ``gpu`` or ``slow`` is about to run (it imports torch).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest
import torch

try:
    from _pytest.skipping import evaluate_skip_marks
except ImportError:  # pytest internals moved: lease every marked test
    evaluate_skip_marks = None

from moe_fq_parity.harness.core.memory import allocated_here

from .gpu_lease import acquire
from .gpu_lease import shares_gpu
from .plugin_collect import gpu_case_groups, gpu_count
from .plugin_state import ParitySession, parity_case_of


def worker_index() -> Optional[int]:
    """xdist worker number (``gw3`` -> 3), ``None`` outside a worker."""
    wid = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(wid[2:]) if wid.startswith("gw") and wid[2:].isdigit() else None


def needs_gpu_lease(item: pytest.Item) -> bool:
    """A test marked ``gpu`` or ``slow`` that is not skipped, on a host with CUDA, unless marked
    ``gpu(lease=False)`` (it needs a GPU host but puts nothing on the GPU: a build, an NVML query)."""
    if any(m.kwargs.get("lease", True) is False for m in item.iter_markers("gpu")):
        return False
    try:
        if evaluate_skip_marks is not None and evaluate_skip_marks(item) is not None:
            return False
    except Exception:  # noqa: BLE001 - a skipif condition failed: lease to be safe
        pass
    return torch.cuda.is_available()


def preferred_gpu(state: ParitySession, item: pytest.Item) -> int:
    """The GPU a test's lease tries first: its case's GPU group (``gpu_case_groups``), else the
    xdist worker's number."""
    case = parity_case_of(item)
    if case is not None:
        if not state.case_groups:
            state.case_groups.update(gpu_case_groups(state.settings, gpu_count()))
        if case.id in state.case_groups:
            return state.case_groups[case.id]
    return worker_index() or 0


def lease(state: ParitySession, item: pytest.Item) -> Optional[tuple[Any, int]]:
    """The GPU lease of ``item`` and the bytes this process held apart from the case cache, or
    ``None`` when the test needs none."""
    if not needs_gpu_lease(item):
        return None
    case = parity_case_of(item)
    shared = case is not None and shares_gpu(case, state.settings.gpu_share_mib)
    held = acquire(all_devices=bool(item.get_closest_marker("dist")), prefer=preferred_gpu(state, item), shared=shared)
    return held, allocated_here() - state.current_bytes()
