"""The pytest plugin's session state: one ``ParitySession`` per pytest process, kept in
``config.stash[SESSION]`` (no module-level state: two sessions in one process, as ``pytester`` runs
them, never see each other's records, backends or cached tensors).

Light on purpose, like ``plugin_options``: imported at the plugin's load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

import pytest

from .plugin_options import ParitySettings


@dataclass
class CaseTensors:
    """The tensors of the case under test: inputs, reference outputs, and the CUDA bytes before them."""

    key: tuple
    inputs: Any
    expected: Any
    mem_base: Optional[int]
    device_bytes: int = 0
    """CUDA bytes the inputs and reference outputs hold (0 off CUDA)."""


@dataclass
class ParitySession:
    """Everything the plugin keeps for one session."""

    settings: ParitySettings
    records: list[dict] = field(default_factory=list)
    """Every record of this process, as JSON (an xdist worker sends them to the controller)."""
    unrecorded: list[str] = field(default_factory=list)
    """Parity tests that failed in pytest where no record of the report can say so (``plugin_records.failed_test``)."""
    loaded: dict[str, Any] = field(default_factory=dict)
    """Backend spec -> its ``LoadedBackend`` (loaded once per session)."""
    writer: Any = None
    """The ``ReportWriter`` of ``--parity-report`` once tests run, else ``None``."""
    lock: Any = None
    """The held run lock of the report folder (``runner.out_lock``), released at unconfigure."""
    gpu_groups: int = 0
    """xdist controller: the number of GPU groups scheduled (0: xdist's own scheduling)."""
    case_groups: dict[str, int] = field(default_factory=dict)
    """Case id -> its GPU group (``plugin_collect.gpu_case_groups``), computed on first use."""
    current: Optional[CaseTensors] = None
    """The case of the running test (``plugin_checks.case_tensors``): shared by its consecutive tests."""
    supervisor: Any = None
    """The worker process the parity tests call their backends in (``harness.run.isolation``), once started."""
    next_case: Any = None
    """The ``parity_case`` of the test after the running one (``None``: another kind of test, or none)."""
    runs: Optional[dict[str, tuple[tuple[str, ...], bool]]] = None
    """Test id -> (its check and those of the ready tests after it, in session order, on the same case
    and backend; whether the test after those is on the same case), built on first use
    (``plugin_checks.ready_runs``)."""
    not_applicable: dict[str, Any] = field(default_factory=dict)
    """The parity tests deselected as not applicable to their backend, per backend and reason, in the
    report's ``not_applicable`` form (``plugin_collect.deselect_not_applicable``); an xdist controller
    takes a worker's (every worker collects the same tests)."""
    prepared: dict[tuple[str, str, str], list] = field(default_factory=dict)
    """``(case id, backend spec, check)`` -> the records the worker computed ahead for that check's test."""

    def current_bytes(self) -> int:
        """CUDA bytes held by the cached case tensors (0 when none)."""
        return self.current.device_bytes if self.current is not None else 0


def parity_case_of(item: Optional[pytest.Item]) -> Any:
    """The ``parity_case`` parameter of a test, or ``None``."""
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("parity_case") if callspec is not None else None


SESSION = pytest.StashKey[ParitySession]()
ITEM_RECORDS = pytest.StashKey[list]()
"""On a test item: the ``CheckRecord`` objects its checks recorded."""


def session_of(config: pytest.Config) -> Optional[ParitySession]:
    """The session state, or ``None`` before ``pytest_configure`` resolved it (``--help``, a usage error)."""
    return config.stash.get(SESSION, None)
