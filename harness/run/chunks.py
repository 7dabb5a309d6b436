"""One case of a run, in the units it runs in: build the case's tensors, run its checks one chunk at a
time, order its records.  Used alike by the runner in its own process and by an isolation worker
(``harness.run.isolation``), which is why it lives apart from both.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterator, Optional, Sequence

import torch

from moe_fq_parity.cases import Case, make_inputs

from moe_fq_parity.harness.backends import LoadedBackend
from moe_fq_parity.harness.checks import CheckContext, case_oom_record, expected_forward, run_case_checks
from moe_fq_parity.harness.core.memory import OOM_ERRORS, allocated, case_bytes, forget, release
from moe_fq_parity.harness.core.records import CHECKS, CheckRecord
from moe_fq_parity.harness.core.repro import repro_command
from moe_fq_parity.harness.core.timing import CopyCurve, curve_gbps

PHASES = ("inputs", "reference", "checks", "backend_calls", "lease_wait", "report_writes", "sections", "total")
"""Keys of ``meta.phase_s``: where a run's wall time went (``backend_calls`` is part of ``checks``;
``lease_wait``: case workers waiting for their lease of the GPU, or on a CPU of the host's memory,
``run --workers``).  With several case
workers the case phases are summed over the workers (``total`` is the wall time)."""



def _input_failure(case: Case, backend: LoadedBackend, seed: int, exc: BaseException) -> CheckRecord:
    return CheckRecord(case_id=case.id, backend=backend.spec, check="forward", verdict="fail", fmt=case.fmt, n=case.n,
                       numel=case.numel, message=f"building the case inputs raised {type(exc).__name__}: {exc}",
                       repro=repro_command(case.id, backend.spec, "forward", seed))


def check_chunks(checks: Sequence[str]) -> list[tuple[str, ...]]:
    """``checks`` in the units ``case_chunks`` runs them in: one check each, ``perf`` with ``forward``
    (it times only a passing forward call, so it needs that verdict)."""
    chunks: list[tuple[str, ...]] = []
    for c in CHECKS:
        if c not in checks or (c == "perf" and "forward" in checks):
            continue
        chunks.append(("forward", "perf") if c == "forward" and "perf" in checks else (c,))
    return chunks


class HeldCase:
    """At most one case's tensors kept between two calls of ``case_chunks`` (an isolation worker
    serving the tests of one case one check at a time: the case is built once, not once per check)."""

    def __init__(self) -> None:
        self._entry: Optional[tuple[tuple, Any]] = None

    def take(self, key: tuple) -> Any:
        """The tensors held under ``key`` (then no longer held), else ``None``; anything else held is
        dropped, before the caller builds another case."""
        entry, self._entry = self._entry, None
        return entry[1] if entry is not None and entry[0] == key else None

    def put(self, key: tuple, value: Any) -> None:
        self._entry = (key, value)


def case_chunks(cfg, case: Case, device: str, group: Sequence[LoadedBackend], checks: tuple[str, ...], curve: Optional[CopyCurve],
                phases: dict[str, float], on_begin: Optional[Callable[[LoadedBackend, tuple[str, ...]], None]] = None,
                held: Optional[HeldCase] = None, keep: bool = False, alone: Optional[Callable[[], Any]] = None) -> Iterator[list[CheckRecord]]:
    """The records of ``case`` on the backends of one device, one ``check_chunks`` unit of one backend
    at a time (``on_begin(backend, chunk)`` is called before each); the case's tensors are dropped at
    the end.  ``cfg``: anything with ``seed``, ``mode``, ``timeout_s`` and ``nan_bits`` (a ``RunConfig``
    or an isolation worker's settings).  ``curve``: the run's copy timings (``None``: perf is off).

    Out of memory while building the inputs or the reference outputs gives ``oom`` records (the
    memory is released first, so the message's "free" is what the next case gets).  ``phases``
    accumulates wall seconds: ``inputs``, ``reference`` (the expected outputs), ``checks`` (all
    checks, guards and comparisons included) and, within those, ``backend_calls``.

    ``held``: the case's tensors are taken from there when it holds them, and (``keep``) put back
    at the end instead of dropped, for the next call on the same case.  ``alone``: the checks'
    ``CheckContext.alone`` (case workers sharing a GPU).
    """
    dev = torch.device(device)
    key = (case.id, cfg.seed, str(dev))
    reuse = held.take(key) if held is not None else None
    if reuse is not None:
        inputs, expected, base = reuse
        yield from _checks_of(cfg, group, checks, curve, phases, on_begin, inputs, expected, base, alone)
        if keep:
            held.put(key, reuse)
        return
    base = allocated(dev)
    oom_detail = None
    try:
        t0 = time.perf_counter()
        inputs = make_inputs(case, cfg.seed, device)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t1 = time.perf_counter()
        expected = expected_forward(inputs)
        phases["inputs"] += t1 - t0
        phases["reference"] += time.perf_counter() - t1
    except KeyboardInterrupt:
        raise
    except OOM_ERRORS as exc:
        oom_detail = f"{type(exc).__name__}: {exc}"
        forget(exc)
    except Exception as exc:  # noqa: BLE001 - a case that cannot be built fails, the run goes on
        yield [_input_failure(case, b, cfg.seed, exc) for b in group]
        return
    if oom_detail is not None:
        release(dev)
        yield [case_oom_record(case, b.spec, "forward", cfg.seed, cfg.mode, case_bytes(case), dev,
                               "building the case inputs and reference outputs", oom_detail) for b in group]
        return
    yield from _checks_of(cfg, group, checks, curve, phases, on_begin, inputs, expected, base, alone)
    if held is not None and keep:
        held.put(key, (inputs, expected, base))


def _checks_of(cfg, group: Sequence[LoadedBackend], checks: tuple[str, ...], curve: Optional[CopyCurve], phases: dict[str, float],
               on_begin: Optional[Callable[[LoadedBackend, tuple[str, ...]], None]], inputs: Any, expected: Any,
               base: Optional[int], alone: Optional[Callable[[], Any]] = None) -> Iterator[list[CheckRecord]]:
    """The checks of ``case_chunks`` on built tensors."""
    gbps = curve_gbps(curve) if curve else None
    for b in group:
        ctx = CheckContext(b, inputs, cfg.seed, cfg.mode, cfg.timeout_s, gbps, mem_base=base, nan_bits=cfg.nan_bits, copy_curve=curve, alone=alone)
        for chunk in check_chunks(checks):
            if on_begin is not None:
                on_begin(b, chunk)
            t0 = time.perf_counter()
            recs = run_case_checks(ctx, chunk, expected)
            phases["checks"] += time.perf_counter() - t0
            phases["backend_calls"] += sum(r.duration_s for r in recs)
            yield recs


def in_check_order(recs: Sequence[CheckRecord], group: Sequence[LoadedBackend]) -> list[CheckRecord]:
    """Records of one case ordered by backend (as in ``group``), then by check (``CHECKS``)."""
    spec_order = {b.spec: i for i, b in enumerate(group)}
    return sorted(recs, key=lambda r: (spec_order.get(r.backend, len(spec_order)), CHECKS.index(r.check)))
