"""Run one job on every rank of a layout: real processes, real process groups, hard deadlines.

``run_ranks(job, payload, layout, device=..., workdir=...)`` starts ``layout.world`` processes
with ``torch.multiprocessing.start_processes``; each joins a process group over TCP on a free
local port (gloo on the CPU, NCCL with one GPU per rank for ``device="cuda"``, with
``NCCL_NVLS_ENABLE=0``), builds the ``(ep, tp)`` device mesh, runs ``job(ctx, payload)`` and
writes the returned dict (``pack``-ed: tensors gathered into one buffer per dtype) to
``{out}/rank{r}.pt``, which the caller reads back with ``torch.load(weights_only=True)`` (so a
job returns only tensors, str, int, float, bool, None, and lists/tuples/dicts of them).

No hangs: the process group has a timeout (a collective some rank never joins raises), and the
caller waits at most ``timeout_s``; then it kills the ranks it started and raises ``RankTimeout``.
A rank that raises makes ``run_ranks`` raise ``RankFailure`` with that rank's traceback.

Ranks start from a fork server that has torch and this package imported (``PRELOAD``): a
spawned interpreter per rank would re-import torch (and ``torch._dynamo``, which the first
``DTensor.from_local`` imports), seconds each on 2 cores.  The fork server never touches CUDA
(importing torch does not initialize it), so each CUDA rank starts its own context, as with
``spawn``.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Callable, Optional, Sequence, Union

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from moe_fq_parity.harness.core.processes import cpu_share, startable_main
from moe_fq_parity.harness.core.tolerances import DIST_PG_TIMEOUT_S, DIST_RUN_TIMEOUT_S

from .layout import MESH_DIMS, Coords, Layout

PRELOAD: list[str] = ["torch", "torch._dynamo", "torch.distributed.checkpoint", "torch.distributed.tensor", "moe_fq_parity.harness.sections.checkpoint.jobs"]
DEFAULT_TIMEOUT_S = DIST_RUN_TIMEOUT_S
"""Wall-clock limit of one ``run_ranks`` call (start, work, exit); ``harness.core.tolerances``."""
DEFAULT_PG_TIMEOUT_S = DIST_PG_TIMEOUT_S
"""Process-group timeout: a collective that some rank never reaches fails after this long."""

Job = Callable[["RankContext", Any], dict]

_STARTUP_FAILURES = ("Address already in use", "connectFullMesh")
"""Signs of a failed process-group start-up (a port taken meanwhile; a peer lost while gloo
connects): ``run_ranks`` starts the ranks once more, on a new port, before giving up."""


class RankFailure(RuntimeError):
    """A rank raised or died; the message carries its traceback or exit status."""


class RankTimeout(RuntimeError):
    """Ranks were still running at the deadline and were killed."""


@dataclass
class RankContext:
    """What a job gets on its rank: position, device, mesh and process groups."""

    rank: int
    layout: Layout
    coords: Coords
    device: torch.device
    backend: str
    mesh: DeviceMesh

    def group(self, mesh_dim: str) -> Optional[dist.ProcessGroup]:
        """The process group along ``mesh_dim``, or ``None`` when it has one rank."""
        return self.mesh.get_group(mesh_dim) if self.layout.size(mesh_dim) > 1 else None

    _submeshes: dict[tuple[str, ...], DeviceMesh] = field(default_factory=dict, repr=False)

    def submesh(self, mesh_dims: tuple[str, ...]) -> DeviceMesh:
        """The mesh over ``mesh_dims`` (``("ep", "tp")`` is the whole mesh); slices are cached."""
        dims = tuple(mesh_dims)
        if dims == MESH_DIMS:
            return self.mesh
        if dims not in self._submeshes:
            self._submeshes[dims] = self.mesh[dims]
        return self._submeshes[dims]

    def agree(self, problems: list[str]) -> list[str]:
        """All ranks' ``problems``, on every rank (a collective: call it on every rank or none).

        Lets a check that fails on some ranks stop every rank before the next collective, instead
        of leaving the others waiting for it.  One all-reduce when nobody has a problem; the
        messages are gathered only when someone has.
        """
        flag = torch.tensor([1 if problems else 0], device=self.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag.item()):
            return []
        gathered: list[Optional[list[str]]] = [None] * self.layout.world
        dist.all_gather_object(gathered, problems)
        merged: list[str] = []
        for per_rank in gathered:
            for p in per_rank or []:
                if p not in merged:
                    merged.append(p)
        return merged


@dataclass(frozen=True)
class LaunchSpec:
    """Everything a rank needs; pickled to the children."""

    job: Job
    payload: Any
    layout: Layout
    backend: str
    port: int
    out_dir: str
    pg_timeout_s: float


_TENSOR = "__tensor__"


def pack(obj: Any) -> dict:
    """Replace every tensor in a nested dict/list result by an index into one flat CPU buffer per
    dtype, so a result file holds a handful of tensors however many the job returned
    (``torch.load(weights_only=True)`` costs about half a millisecond per tensor)."""
    flat: dict[str, list[torch.Tensor]] = {}
    sizes: dict[str, int] = {}

    def walk(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            t = o.detach().cpu().contiguous().reshape(-1)
            name = str(o.dtype).removeprefix("torch.")
            start = sizes.get(name, 0)
            flat.setdefault(name, []).append(t)
            sizes[name] = start + t.numel()
            return {_TENSOR: [name, start, list(o.shape)]}
        if isinstance(o, dict):
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return [walk(v) for v in o]
        return o

    tree = walk(obj)
    return {"tree": tree, "buffers": {name: torch.cat(ts) for name, ts in flat.items()}}


def unpack(packed: dict) -> Any:
    """Inverse of ``pack`` (tensors come back as views of the per-dtype buffers; tuples as lists)."""
    buffers = packed["buffers"]

    def walk(o: Any) -> Any:
        if isinstance(o, dict):
            if set(o) == {_TENSOR}:
                name, start, shape = o[_TENSOR]
                n = 1
                for d in shape:
                    n *= d
                return buffers[name][start : start + n].view(shape)
            return {k: walk(v) for k, v in o.items()}
        if isinstance(o, list):
            return [walk(v) for v in o]
        return o

    return walk(packed["tree"])


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_entry(rank: int, spec: LaunchSpec) -> None:
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    torch.set_num_threads(1)
    layout = spec.layout
    if spec.backend == "nccl":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
    else:
        device = torch.device("cpu")
    dist.init_process_group(
        spec.backend,
        init_method=f"tcp://127.0.0.1:{spec.port}",
        rank=rank,
        world_size=layout.world,
        timeout=timedelta(seconds=spec.pg_timeout_s),
    )
    try:
        mesh = init_device_mesh(device.type, (layout.ep, layout.tp), mesh_dim_names=MESH_DIMS)
        ctx = RankContext(rank, layout, layout.coords(rank), device, spec.backend, mesh)
        result = spec.job(ctx, spec.payload)
        tmp = os.path.join(spec.out_dir, f"rank{rank}.pt.tmp")
        torch.save(pack(result), tmp)
        os.replace(tmp, os.path.join(spec.out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _start_method() -> str:
    mp.set_forkserver_preload(PRELOAD)
    return "forkserver"


def start_fork_server() -> None:
    """Start the ranks' fork server now (it imports ``PRELOAD``: seconds) instead of at the first
    ``run_ranks``; the ranks then fork from it as they would have.  Touches no GPU."""
    import multiprocessing.forkserver

    _start_method()
    with startable_main():
        multiprocessing.forkserver.ensure_running()


def _wait(context: Any, deadline: float, layout: Layout, timeout_s: float) -> None:
    try:
        while not context.join(timeout=0.2):
            if time.monotonic() > deadline:
                alive = [p.pid for p in context.processes if p.is_alive()]
                for p in context.processes:
                    if p.is_alive():
                        p.kill()
                for p in context.processes:
                    p.join(5)
                raise RankTimeout(f"{layout.id}: ranks still running after {timeout_s:.0f} s (pids {alive}); killed")
    except mp.ProcessRaisedException as exc:
        raise RankFailure(f"{layout.id}: rank {exc.error_index} raised:\n{exc}") from None
    except mp.ProcessExitedException as exc:
        raise RankFailure(f"{layout.id}: rank {exc.error_index} exited with {exc.exit_code}") from None


def run_ranks(
    job: Job,
    payload: Any,
    layout: Layout,
    *,
    device: str = "cpu",
    workdir: Optional[str] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S,
) -> list[dict]:
    """Run ``job(ctx, payload)`` on every rank of ``layout``; return the ranks' dicts in rank order.

    * ``job``: a module-level function (it is pickled by name);
    * ``device``: ``"cpu"`` (gloo) or ``"cuda"`` (NCCL, needs ``layout.world`` GPUs);
    * ``workdir``: where the per-call result folder goes (default: the system temp dir); it is
      removed before returning;
    * ``timeout_s``: wall-clock limit of the whole call; ``pg_timeout_s``: collective timeout.
    """
    if device not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    backend = "gloo" if device == "cpu" else "nccl"
    if backend == "nccl" and torch.cuda.device_count() < layout.world:
        raise ValueError(f"{layout.id} needs {layout.world} GPUs, found {torch.cuda.device_count()}")
    os.environ["NCCL_NVLS_ENABLE"] = "0"
    out_dir = tempfile.mkdtemp(prefix=f"ranks-{layout.id}-{uuid.uuid4().hex[:6]}-", dir=workdir)
    try:
        for attempt in range(2):
            spec = LaunchSpec(job, payload, layout, backend, free_port(), out_dir, pg_timeout_s)
            with startable_main():
                context = mp.start_processes(_rank_entry, args=(spec,), nprocs=layout.world, join=False, start_method=_start_method())
            try:
                _wait(context, time.monotonic() + timeout_s, layout, timeout_s)
                break
            except RankFailure as exc:
                if attempt == 0 and any(sign in str(exc) for sign in _STARTUP_FAILURES):
                    continue
                raise
        return [unpack(torch.load(os.path.join(out_dir, f"rank{r}.pt"), weights_only=True)) for r in range(layout.world)]
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)


def run_layouts(
    calls: Sequence[tuple[Job, Any, Layout]],
    *,
    device: str = "cpu",
    workdir: Optional[str] = None,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    slots: Optional[int] = None,
) -> list[Union[list[dict], RankFailure, RankTimeout]]:
    """``run_ranks(job, payload, layout)`` for each call; results in call order, a call whose ranks
    failed or hung gives its ``RankFailure``/``RankTimeout`` in its place.

    On the CPU (gloo) several layouts run at once while their ranks fit in ``slots`` (default
    ``cpu_share()``: the host's CPUs, or this process's share of them beside other harness processes;
    a layout wider than ``slots`` runs alone): each rank is a one-thread
    process, so the layouts of a 16-CPU host overlap where a 2-CPU host runs them one after
    another, as before.  With NCCL they run one at a time (every layout uses GPUs 0..world-1).
    Each call keeps its own deadline, port and result folder.
    """
    free = 1 if device == "cuda" else (slots or cpu_share())
    lock = threading.Condition()
    busy = [0]

    def one(call: tuple[Job, Any, Layout]) -> Union[list[dict], RankFailure, RankTimeout]:
        job, payload, layout = call
        need = 1 if device == "cuda" else min(layout.world, free)
        with lock:
            lock.wait_for(lambda: busy[0] + need <= free)
            busy[0] += need
        try:
            return run_ranks(job, payload, layout, device=device, workdir=workdir, timeout_s=timeout_s)
        except (RankFailure, RankTimeout) as exc:
            return exc
        finally:
            with lock:
                busy[0] -= need
                lock.notify_all()

    if len(calls) <= 1 or free <= 1:
        return [one(c) for c in calls]
    with ThreadPoolExecutor(max_workers=len(calls), thread_name_prefix="dist-layout") as pool:
        return list(pool.map(one, calls))
