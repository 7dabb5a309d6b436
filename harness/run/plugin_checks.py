"""The pytest plugin's checks: one check of one case on one backend, as the ``parity_check`` fixture
runs it, and the case tensors its consecutive tests share.

By default the backend calls run in a supervised worker process (``harness.run.isolation``, the
CLI's machinery): a backend that ends its process (``os._exit``, a segfault) or hangs past the call
timeout fails its test with a ``crash``/``timeout`` record, and the session goes on with a fresh
worker.  ``--parity-in-process`` (``PARITY_IN_PROCESS=1``) calls the backends in the pytest process,
sharing one case's tensors between its consecutive tests.  A backend the worker cannot load (one
defined in ``__main__``), or a case of a format registered at run time, runs in process.

Imported by the plugin once a parity test runs (it imports torch through the checks).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Optional

import pytest
import torch

from moe_fq_parity.cases import make_inputs

from moe_fq_parity.harness.backends import LoadedBackend, load
from moe_fq_parity.harness.checks import CheckContext, case_oom_record, expected_forward, run_case_checks
from moe_fq_parity.harness.checks.plan import LABEL, planned_checks
from moe_fq_parity.harness.core.memory import OOM_ERRORS, allocated, case_bytes, forget, release
from moe_fq_parity.harness.core.records import CheckRecord
from moe_fq_parity.harness.core.repro import repro_command

from .chunks import PHASES
from .isolation import NotIsolatable, Supervisor, WorkerSettings, isolatable
from .plugin_state import CaseTensors, ParitySession, parity_case_of


def loaded_backend(state: ParitySession, spec: str) -> LoadedBackend:
    """The session's ``LoadedBackend`` of ``spec`` (loaded on first use)."""
    if spec not in state.loaded:
        state.loaded[spec] = load(spec)
    return state.loaded[spec]


def _device_key(device: str) -> tuple[str, Optional[int]]:
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        return dev.type, torch.cuda.current_device()
    return dev.type, dev.index


def case_tensors(state: ParitySession, case: Any, seed: int, device: str) -> CaseTensors:
    """Inputs and reference outputs of a case, shared by the consecutive checks of that case."""
    key = (case.id, seed, _device_key(device))
    if state.current is not None and state.current.key == key:
        return state.current
    state.current = None  # the previous case's tensors go before this one's are built
    base = allocated(torch.device(device))
    inputs = make_inputs(case, seed, device)
    expected = expected_forward(inputs)
    after = allocated(torch.device(device))
    state.current = CaseTensors(key, inputs, expected, base, (after - base) if after is not None and base is not None else 0)
    return state.current


def teardown(state: ParitySession, item: pytest.Item, nextitem: Optional[pytest.Item]) -> None:
    """Drop the case's tensors unless the next test checks the same case (freed by reference
    counting; ``tidy`` on the lease's release collects cycles only when memory stays allocated)."""
    if state.current is not None and (nextitem is None or parity_case_of(nextitem) != parity_case_of(item)):
        state.current = None


def _in_process(state: ParitySession, case: Any, backend: LoadedBackend, name: str) -> list[CheckRecord]:
    s = state.settings
    device = backend.device or "cpu"
    try:
        tensors = case_tensors(state, case, s.seed, device)
    except OOM_ERRORS as exc:
        detail = f"{type(exc).__name__}: {exc}"
        forget(exc)
        state.current = None
        release()
        return [case_oom_record(case, backend.spec, name, s.seed, s.mode, case_bytes(case), device,
                                "building the case inputs and reference outputs", detail)]
    ctx = CheckContext(backend, tensors.inputs, s.seed, s.mode, s.timeout_s, mem_base=tensors.mem_base, nan_bits=s.nan_bits)
    return [r for r in run_case_checks(ctx, [name], tensors.expected) if r.check == name]


def _worker_device(device: str) -> str:
    """``device`` with the index this process uses (a GPU lease may have set one): the worker is
    another process, its default device is its own."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and torch.cuda.is_initialized():
        return f"cuda:{torch.cuda.current_device()}"
    return device


def _in_worker(state: ParitySession, case: Any, backend: LoadedBackend, name: str) -> Optional[list[CheckRecord]]:
    """The check's records from the session's worker (started on first use, replaced after a crash),
    or ``None`` where it cannot run there."""
    if isolatable([backend]) is not None:
        return None
    s = state.settings
    if state.supervisor is None:
        specs = tuple(dict.fromkeys((*s.backends, backend.spec)))
        state.supervisor = Supervisor(specs, WorkerSettings(s.seed, s.mode, s.timeout_s, s.nan_bits, torch.get_num_threads()), None)
    elif backend.spec not in state.supervisor.specs:  # a backend of the user's test outside --parity-backend
        state.supervisor.close()
        state.supervisor = Supervisor((*state.supervisor.specs, backend.spec), state.supervisor.settings, None)
    same_next = state.next_case is not None and state.next_case.id == case.id
    try:
        recs = state.supervisor.records(case, _worker_device(backend.device or "cpu"), [backend], (name,), dict.fromkeys(PHASES, 0.0),
                                        keep_case=same_next)
    except NotIsolatable:
        return None
    mine = [r for r in recs if r.check == name]
    if not mine and recs:  # the case could not be built: its record speaks of the forward check, this test is about ``name``
        mine = [replace(recs[0], check=name, repro=repro_command(case.id, backend.spec, name, s.seed, s.mode, timeout_s=s.timeout_s,
                                                                 nan_bits=s.nan_bits))]
    return mine


def run_check(state: ParitySession, case: Any, backend: LoadedBackend, name: str) -> list[CheckRecord]:
    """The records of check ``name`` of ``case`` on ``backend`` (skips the test when the backend does
    not declare what the case needs: no record)."""
    if not (plan := planned_checks(backend, case, [name]))[0]:
        pytest.skip(f"{LABEL}: {plan[1]}")  # no record: outside what the backend declares
    recs = None if state.settings.in_process else _in_worker(state, case, backend, name)
    return recs if recs is not None else _in_process(state, case, backend, name)


def close_worker(state: ParitySession) -> None:
    """End the session's worker process, if one was started."""
    if state.supervisor is not None:
        state.supervisor.close()
        state.supervisor = None
