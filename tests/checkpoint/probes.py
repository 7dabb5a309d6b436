"""Rank jobs that misbehave on purpose, to show ``run_ranks`` turns hangs and crashes into errors.

Module-level functions, so the ranks (started from a fork server) can import them by name.
``outcome`` runs one probe and records what happened: the exception class, its message and how
long it took, for the tests to judge.
"""

from __future__ import annotations

import os
import time
from typing import Any

import torch
import torch.distributed as dist

from moe_fq_parity.harness.sections.checkpoint.launch import RankContext, run_ranks
from moe_fq_parity.harness.sections.checkpoint.layout import Layout

SLEEP_S = 600.0
"""How long a hanging rank sleeps: far beyond any deadline a probe uses."""


def hang_job(ctx: RankContext, payload: Any) -> dict:
    """Rank 1 never returns; rank 0 finishes normally."""
    if ctx.rank == 1:
        time.sleep(SLEEP_S)
    return {"rank": ctx.rank}


def raise_job(ctx: RankContext, payload: Any) -> dict:
    """Rank 1 raises."""
    if ctx.rank == 1:
        raise ValueError("probe: rank 1 fails on purpose")
    return {"rank": ctx.rank}


def missed_collective_job(ctx: RankContext, payload: Any) -> dict:
    """Rank 0 waits in an all-reduce that rank 1 never joins (rank 1 sleeps instead)."""
    if ctx.rank == 1:
        time.sleep(SLEEP_S)
    t = torch.ones(1)
    dist.all_reduce(t)
    return {"sum": t}


def echo_job(ctx: RankContext, payload: Any) -> dict:
    """Returns nested data with tensors of several dtypes (for the result transport)."""
    return {
        "rank": ctx.rank,
        "coords": [ctx.coords.ep, ctx.coords.tp],
        "nested": {"bf16": torch.arange(6, dtype=torch.bfloat16).reshape(2, 3) + ctx.rank, "scalar": torch.tensor(float(ctx.rank))},
        "list": [torch.zeros(0), "text", None, 1.5],
    }


def stamp_job(ctx: RankContext, payload: Any) -> dict:
    """Sleeps ``payload`` seconds; returns when it started and ended (wall clock, for overlap checks)
    and its parent process (the fork server it was forked from)."""
    start = time.time()
    time.sleep(float(payload))
    return {"rank": ctx.rank, "start": start, "end": time.time(), "ppid": os.getppid()}


PROBES = {
    "hang": (hang_job, {"timeout_s": 3.0}),
    "raise": (raise_job, {}),
    "missed_collective": (missed_collective_job, {"timeout_s": 60.0, "pg_timeout_s": 2.0}),
    "echo": (echo_job, {}),
}


def jsonable(o: Any) -> Any:
    """Tensors -> ``{"dtype", "shape", "values"}``; dicts and lists recursively; the rest as is."""
    if isinstance(o, torch.Tensor):
        return {"dtype": str(o.dtype), "shape": list(o.shape), "values": o.float().reshape(-1).tolist()}
    if isinstance(o, dict):
        return {k: jsonable(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [jsonable(v) for v in o]
    return o


def outcome(name: str, layout: Layout = Layout(1, 2)) -> dict:
    """Run probe ``name``; return ``{"error", "message", "elapsed_s", "result"}`` (JSON-able)."""
    job, kwargs = PROBES[name]
    start = time.monotonic()
    try:
        result, error, message = jsonable(run_ranks(job, None, layout, **kwargs)), None, ""
    except Exception as exc:  # the probe is about which exception comes out
        result, error, message = None, type(exc).__name__, str(exc)[-3000:]
    return {"error": error, "message": message, "elapsed_s": time.monotonic() - start, "result": result}
