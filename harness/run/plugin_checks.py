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
from typing import Any, Optional, Sequence

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


def ready_runs(items: Sequence[pytest.Item]) -> dict[str, tuple[tuple[str, ...], bool]]:
    """For every ready parity test (``test_parity``: one ``check`` parameter) in ``items``: its check and
    those of the tests right after it on the same case and backend, and whether the test after those
    is on the same case.  A worker computes such a run of checks in one request (one round trip and
    one pass over the case per backend, not one per test)."""
    keys: list[Optional[tuple[str, str]]] = []
    checks: list[Optional[str]] = []
    for it in items:
        params = getattr(getattr(it, "callspec", None), "params", {})
        case, spec, check = params.get("parity_case"), params.get("parity_backend"), params.get("check")
        ok = case is not None and isinstance(spec, str) and isinstance(check, str)
        keys.append((case.id, spec) if ok else None)
        checks.append(check if ok else None)
    out: dict[str, tuple[tuple[str, ...], bool]] = {}
    end = len(items)
    for i in range(len(items) - 1, -1, -1):
        if keys[i] is None:
            end = i
            continue
        if i + 1 < len(items) and keys[i + 1] != keys[i]:
            end = i + 1
        after = keys[end] if end < len(items) else None
        out[items[i].nodeid] = (tuple(c for c in checks[i:end] if c is not None), after is not None and after[0] == keys[i][0])
    return out


def _in_worker(state: ParitySession, case: Any, backend: LoadedBackend, name: str, item: Optional[pytest.Item]) -> Optional[list[CheckRecord]]:
    """The check's records from the session's worker (started on first use, replaced after a crash),
    or ``None`` where it cannot run there.

    A ready test asks for its own check and the planned checks of the tests right after it on the
    same case and backend (``ready_runs``); their records wait in ``state.prepared`` for those tests.
    Only checked records are kept ahead: a check that crashed, timed out or ran out of memory is run
    again, alone, by its own test (in a fresh worker after a crash)."""
    key = (case.id, backend.spec, name)
    if key in state.prepared:
        return state.prepared.pop(key)
    state.prepared.clear()  # another case or backend: what was computed ahead for the last one is stale
    if isolatable([backend]) is not None:
        return None
    s = state.settings
    if state.supervisor is None:
        specs = tuple(dict.fromkeys((*s.backends, backend.spec)))
        state.supervisor = Supervisor(specs, WorkerSettings(s.seed, s.mode, s.timeout_s, s.nan_bits, torch.get_num_threads()), None)
    elif backend.spec not in state.supervisor.specs:  # a backend of the user's test outside --parity-backend
        state.supervisor.close()
        state.supervisor = Supervisor((*state.supervisor.specs, backend.spec), state.supervisor.settings, None)
    checks, keep = (name,), state.next_case is not None and state.next_case.id == case.id
    if item is not None:
        if state.runs is None:
            state.runs = ready_runs(item.session.items)
        run = state.runs.get(item.nodeid)
        if run is not None and run[0][:1] == (name,):
            checks, keep = tuple(planned_checks(backend, case, run[0])[0]) or (name,), run[1]
            if name not in checks:
                checks = (name, *checks)
    try:
        recs = state.supervisor.records(case, _worker_device(backend.device or "cpu"), [backend], checks, dict.fromkeys(PHASES, 0.0),
                                        keep_case=keep)
    except NotIsolatable:
        return None
    for other in (c for c in checks if c != name):
        theirs = [r for r in recs if r.check == other]
        if theirs and all(r.outcome == "checked" for r in theirs):
            state.prepared[(case.id, backend.spec, other)] = theirs
    mine = [r for r in recs if r.check == name]
    if not mine and recs:  # the case could not be built: its record speaks of the forward check, this test is about ``name``
        mine = [replace(recs[0], check=name, repro=repro_command(case.id, backend.spec, name, s.seed, s.mode, timeout_s=s.timeout_s,
                                                                 nan_bits=s.nan_bits))]
    return mine


def run_check(state: ParitySession, case: Any, backend: LoadedBackend, name: str, item: Optional[pytest.Item] = None) -> list[CheckRecord]:
    """The records of check ``name`` of ``case`` on ``backend`` (skips the test when the backend does
    not declare what the case needs: no record).  ``item``: the running test, whose neighbours in the
    session tell which checks the worker can compute ahead (``ready_runs``)."""
    if not (plan := planned_checks(backend, case, [name]))[0]:
        pytest.skip(f"{LABEL}: {plan[1]}")  # no record: outside what the backend declares
    recs = None if state.settings.in_process else _in_worker(state, case, backend, name, item)
    return recs if recs is not None else _in_process(state, case, backend, name)


def close_worker(state: ParitySession) -> None:
    """End the session's worker process, if one was started."""
    if state.supervisor is not None:
        state.supervisor.close()
        state.supervisor = None
