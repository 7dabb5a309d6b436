"""Running the report sections of ``harness.sections.SECTION_RUNNERS``: one section, never raising
(``run_section``), and the sections of a run started ahead of their turn, each in a process of its
own on hosts with enough CPUs (``start_sections``, ``StartedSections``, ``run_sections``).

The registry (``SECTION_RUNNERS``, ``SPLIT_SECTIONS``, ``PARALLEL_MIN_CPUS``) is read from
``harness.sections`` at each call, so a caller's replacement of it is seen here.
"""

from __future__ import annotations

import importlib
import time
import traceback
from typing import Any, Callable, Iterable, Optional

from moe_fq_parity.harness import sections as registry
from moe_fq_parity.harness.core.processes import SIBLINGS_ENV, cpu_share, startable_main, usable_cpus
from moe_fq_parity.harness.core.partition import Part
from moe_fq_parity.harness.sections import Section, _single


def run_section(name: str, target: str, suite: str, seed: int, device: str, part: Optional[Part] = None) -> Section:
    """One section (its ``part`` of it, for a section of ``SPLIT_SECTIONS``), never raising (see
    ``harness.sections``): a runner that does not import gives one ``skip`` row, one that raises or
    returns something else one ``fail`` row."""
    module_name, _, fn_name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        return _single(name, "skip", f"section runner {target} unavailable: {type(exc).__name__}: {exc}", part)
    try:
        section = fn(suite=suite, seed=seed, device=device) if part is None else fn(suite=suite, seed=seed, device=device, part=part)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a broken section is a failed section
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return _single(name, "fail", f"section runner {target} raised {tb}", part)
    if not isinstance(section, Section):
        return _single(name, "fail", f"section runner {target} returned {type(section).__name__}, not Section", part)
    if section.part != part:
        return _single(name, "fail", f"section runner {target} was asked for part {part} and returned part {section.part}", part)
    return section


def _timed(name: str, target: str, suite: str, seed: int, device: str, part: Optional[Part] = None) -> dict[str, Any]:
    """``run_section``'s JSON with the wall ``seconds`` it took."""
    t0 = time.perf_counter()
    return run_section(name, target, suite, seed, device, part).to_json() | {"seconds": round(time.perf_counter() - t0, 3)}


def _prepare(target: str) -> None:
    """Import a runner's module and call its ``prepare()`` if it has one (the slow start-up a section
    can do before its turn: imports, a process server).  Errors are left for ``run_section``, which
    imports the module again and reports them as the section's row."""
    try:
        module = importlib.import_module(target.partition(":")[0])
        prepare = getattr(module, "prepare", None)
        if callable(prepare):
            prepare()
    except Exception:  # noqa: BLE001 - run_section reports what broke, as that section's row
        pass


def _host_only(target: str, device: str) -> bool:
    """Whether the runner's module declares (``host_only(device) -> True``) that for this run's device
    it uses no GPU: such a section starts as soon as it is prepared, beside the cases that drive the
    GPU, instead of after them.  Undeclared, or an error while asking: it waits for its turn."""
    try:
        declared = getattr(importlib.import_module(target.partition(":")[0]), "host_only", None)
        return bool(declared(device)) if callable(declared) else False
    except Exception:  # noqa: BLE001 - the section then runs in its turn, where run_section reports errors
        return False


def _child(conn: Any, name: str, target: str, suite: str, seed: int, device: str, threads: int, siblings: int,
           part: Optional[Part]) -> None:
    """Body of a section's own process (``threads``: its share of the parent's PyTorch threads;
    ``siblings``: the other section processes running at once, ``processes.SIBLINGS_ENV``):
    prepares the section, waits for the parent's ``"go"`` (on a GPU run, not if the section is
    ``_host_only``: it starts at once, beside the cases, and counts half of the host's CPUs as taken
    by them), then sends its JSON (or the exception's last
    line) through ``conn``.  The parent's end closing first (a run cut off before its sections)
    ends the process without running the section."""
    try:
        import os

        import torch

        early = device.startswith("cuda") and _host_only(target, device)
        if early:  # beside the cases: their process builds inputs on the host's CPUs, leave it half
            siblings += max(1, usable_cpus() // 2)
        os.environ[SIBLINGS_ENV] = str(siblings)  # before prepare(): a process server started there inherits it
        torch.set_num_threads(threads)
        _prepare(target)
        if not early and conn.recv() != "go":
            return
        conn.send(("ok", _timed(name, target, suite, seed, device, part)))
    except EOFError:
        return
    except BaseException as exc:  # noqa: BLE001 - reported by the parent as a failed section
        try:
            conn.send(("error", traceback.format_exception_only(type(exc), exc)[-1].strip()))
        except OSError:  # the parent is gone (a Ctrl-C reaches the whole process group): nobody to tell
            pass
    finally:
        conn.close()


def section_processes(name: str, part: Optional[Part]) -> int:
    """Processes for section ``name`` in a run whose sections each get a process: up to
    ``SECTION_PROCESSES[name]`` for a section of ``SPLIT_SECTIONS`` in an unsharded run (a sharded run
    splits it over its shards instead), one per ``PARALLEL_MIN_CPUS`` CPUs of this run's share."""
    most = registry.SECTION_PROCESSES.get(name, 1)
    if part is not None or name not in registry.SPLIT_SECTIONS or most <= 1:
        return 1
    return max(1, min(most, cpu_share() // registry.PARALLEL_MIN_CPUS))


def _joined(name: str, parts: dict[int, tuple[str, dict[str, Any]]], count: int) -> dict[str, Any]:
    """The section from its ``count`` parts, as ``merge`` joins the parts of a sharded run's section
    (``seconds``: the slowest part's); parts that do not fit together give one failing row."""
    from moe_fq_parity.reports.merge import MergeError, join_parts  # deferred: only runs that split a section join

    try:
        return join_parts(name, parts, count, lambda i: {"id": f"{name}/part{i}of{count}", "verdict": "fail", "fields": {}, "repro": "",
                                                         "message": f"part {i}/{count} of section {name} gave nothing"})
    except MergeError as exc:
        seconds = max(sec.get("seconds", 0.0) for _, sec in parts.values())
        return _single(name, "fail", f"section {name}: its {count} parts do not join: {exc}").to_json() | {"seconds": seconds}


OnDone = Callable[[list[dict[str, Any]], dict[str, Any]], None]
"""``on_done(sections finished so far, in the order chosen; the one just finished)``."""


class StartedSections:
    """The sections of a run, started ahead of their turn (``start_sections``): ``run()`` runs them
    and returns their JSON; ``close()`` (or leaving the ``with`` block) ends every section process
    still alive, so a run cut off before or during its sections leaves none behind."""

    def __init__(self, chosen: list[str], suite: str, seed: int, device: str, part: Optional[Part], parallel: bool) -> None:
        self.chosen, self.suite, self.seed, self.device, self.part = chosen, suite, seed, device, part
        self._procs: dict[Any, tuple[str, Any, Optional[Part]]] = {}
        self._threads: Optional[int] = None
        self.splits: dict[str, int] = {}
        """Sections run as that many parts, each in a process of its own (``section_processes``)."""
        if parallel and len(chosen) >= 2:
            self.splits = {n: k for n in chosen if (k := section_processes(n, part)) > 1}
            self._spawn()

    def _part(self, name: str) -> Optional[Part]:
        return self.part if name in registry.SPLIT_SECTIONS else None

    def _spawn(self) -> None:
        import multiprocessing as mp

        import torch

        ctx = mp.get_context("spawn")  # a fresh interpreter: no CUDA context or forkserver state inherited
        jobs = [(n, Part(i, self.splits[n]) if n in self.splits else self._part(n)) for n in self.chosen for i in range(1, self.splits.get(n, 1) + 1)]
        threads = max(1, torch.get_num_threads() // len(jobs))  # the section processes share this process's CPUs
        for n, part in jobs:
            mine, theirs = ctx.Pipe()
            # not daemonic: a daemonic process may not start processes, and dist starts its ranks
            p = ctx.Process(target=_child,
                            args=(theirs, n, registry.SECTION_RUNNERS[n], self.suite, self.seed, self.device, threads, len(jobs) - 1, part),
                            name=f"section-{n}" + (f"-{part.index}of{part.count}" if n in self.splits else ""))
            with startable_main():
                p.start()
            theirs.close()
            self._procs[mine] = (n, p, part)
        # While the sections prepare, the caller's OpenMP threads leave them a CPU each: a parallel
        # region waits for its slowest thread, and one waiting for a CPU stalls all of them
        # (docs/measured.md §13).
        self._threads = torch.get_num_threads()
        torch.set_num_threads(max(1, self._threads - len(self.chosen)))

    def _give_threads_back(self) -> None:
        if self._threads is not None:
            import torch

            torch.set_num_threads(self._threads)
            self._threads = None

    def run(self, on_done: Optional[OnDone] = None) -> list[dict[str, Any]]:
        """Every chosen section's JSON in the order chosen, each with the wall ``seconds`` it took
        from its start (its preparation not included); ``on_done`` is called as each one finishes."""
        if not self._procs:
            out = []
            for n in self.chosen:
                out.append(_timed(n, registry.SECTION_RUNNERS[n], self.suite, self.seed, self.device, self._part(n)))
                if on_done is not None:
                    on_done(list(out), out[-1])
            return out
        from multiprocessing.connection import wait

        t0 = time.perf_counter()
        done: dict[str, dict[str, Any]] = {}
        parts: dict[str, dict[int, tuple[str, dict[str, Any]]]] = {n: {} for n in self.splits}
        for conn in list(self._procs):
            try:
                conn.send("go")
            except OSError:  # the process already died: its EOF below gives the failed row
                pass
        try:
            while self._procs:
                for conn in wait(list(self._procs)):
                    n, p, part = self._procs.pop(conn)
                    try:
                        status, payload = conn.recv()
                    except EOFError:
                        p.join(5)
                        status, payload = "error", f"the section process exited with {p.exitcode} before reporting"
                    conn.close()
                    if status != "ok":
                        payload = _single(n, "fail", f"section {n} failed in its process: {payload}", part).to_json() | {
                            "seconds": round(time.perf_counter() - t0, 3)}
                    p.join(5)
                    if n in self.splits:
                        parts[n][part.index] = (f"process {p.name}", payload)
                        if len(parts[n]) < self.splits[n]:
                            continue
                        payload = _joined(n, parts[n], self.splits[n])
                    done[n] = payload
                    if on_done is not None:
                        on_done([done[k] for k in self.chosen if k in done], done[n])
        finally:
            self.close()
        return [done[n] for n in self.chosen]

    def close(self) -> None:
        """End the section processes still alive (a run cut off, or one that never ran them); the
        caller's PyTorch threads are as they were before ``start_sections``."""
        self._give_threads_back()
        for conn, (_, p, _) in list(self._procs.items()):
            conn.close()
            if p.is_alive():  # still preparing, waiting for "go" or running: nothing of it is kept
                p.kill()
            p.join(5)
        self._procs.clear()

    def __enter__(self) -> "StartedSections":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_sections(suite: str, seed: int, device: str, names: Optional[Iterable[str]] = None, parallel: Optional[bool] = None,
                   part: Optional[Part] = None) -> StartedSections:
    """The selected sections (default: all of ``SECTION_RUNNERS``), started ahead of their turn.
    ``part`` (shard ``i/n`` of a sharded run): the sections of ``SPLIT_SECTIONS`` run that part of
    themselves, the others whole.

    ``parallel`` (default: when this process's share of the host's CPUs, ``cpu_share``, is
    ``PARALLEL_MIN_CPUS`` or more): every section gets a process of its own (``spawn``) now, which
    starts its interpreter, imports its runner and calls the runner module's ``prepare()`` while the
    caller goes on (the run's cases), then waits; ``run()`` starts them all at once, so the run waits
    for the slowest section instead of their sum (on a one-GPU host the nightly's ``moe`` section drives the
    GPU while ``dist`` runs its gloo ranks on the CPUs), each with an equal share of this process's
    PyTorch threads.  On a GPU run, a section whose module declares ``host_only(device)`` (it uses no
    GPU there: ``dist``'s gloo matrix on a one-GPU host) does not wait for ``run()``: it starts as soon
    as it is prepared, beside the cases.  A section process that dies gives that section one ``fail`` row.  Otherwise
    (one section, or few CPUs) ``run()`` runs them one after the other in this process.

    Cost of starting ahead: each section process holds its interpreter and imports while the cases
    run (resident host memory, a few hundred MB per section process; no GPU memory: nothing
    initialises CUDA before ``run()``), and the caller runs with one PyTorch thread fewer per section
    until ``run()`` or ``close()``.  Starting ahead is chosen by measurement: docs/measured.md §13.
    """
    chosen = list(names) if names is not None else list(registry.SECTION_RUNNERS)
    unknown = [n for n in chosen if n not in registry.SECTION_RUNNERS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; known: {sorted(registry.SECTION_RUNNERS)}")
    if parallel is None:
        parallel = cpu_share() >= registry.PARALLEL_MIN_CPUS
    return StartedSections(chosen, suite, seed, device, part, parallel)


def run_sections(suite: str, seed: int, device: str, names: Optional[Iterable[str]] = None, on_done: Optional[OnDone] = None,
                 parallel: Optional[bool] = None, part: Optional[Part] = None) -> list[dict[str, Any]]:
    """JSON of the selected sections in the order chosen, each with the wall ``seconds`` it took:
    ``start_sections(...)`` run at once (see there); ``on_done`` is called as each one finishes
    (progress, and a report that keeps the finished sections if the run is cut off)."""
    with start_sections(suite, seed, device, names, parallel, part) as started:
        return started.run(on_done)
