"""Checkpoint engines: save a rank's ``ShardSpec`` list, load it back resharded to another layout.

* ``DcpEngine`` -- ``torch.distributed.checkpoint`` with DTensors on the ``(ep, tp)`` device mesh
  (or its TP sub-mesh for per-expert keys); DCP reshards on load.  Files are written without
  ``fsync`` (test data; several times faster on slow disks).
* ``MegatronEngine`` -- Megatron-Core ``dist_checkpointing`` (same DCP format on disk) with
  ``ShardedTensor.from_rank_offsets``; optional: ``available()`` says why it cannot run (not
  importable; or a CPU device, since it calls ``torch.cuda`` unconditionally).

``load_checked`` is the one way the checks load: every rank reads the metadata through the
allow-list (``safe_io``) and compares keys, shapes and dtypes with the target; the ranks agree
on the union of problems *before* any load collective, so a misfit on one rank stops all of them
with the same message (key, checkpoint shape, target shape) instead of a hang.
"""

from __future__ import annotations

import os
from typing import Mapping, Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor, Replicate, Shard

from .launch import RankContext
from .safe_io import (
    CheckpointCorruptError,
    CheckpointError,
    CheckpointMismatchError,
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    check_entries,
    dcp_failure,
    format_problems,
    read_metadata,
)
from .shards import ShardSpec


class Engine(Protocol):
    """A checkpoint engine (see the module docstring)."""

    name: str

    def available(self, device: str) -> tuple[bool, str]: ...

    def save(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> None: ...

    def load_into(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> dict[str, torch.Tensor]: ...


def _contiguous_stride(shape: tuple[int, ...]) -> tuple[int, ...]:
    stride, acc = [], 1
    for n in reversed(shape):
        stride.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(stride))


def to_dtensor(spec: ShardSpec, ctx: RankContext) -> DTensor:
    """The DTensor of ``spec`` on its (sub-)mesh: ``Shard(d)`` where placed, else ``Replicate``."""
    by_mesh_dim = dict(spec.placements)
    placements = [Shard(by_mesh_dim[m]) if m in by_mesh_dim else Replicate() for m in spec.mesh_dims]
    return DTensor.from_local(
        spec.local,
        ctx.submesh(spec.mesh_dims),
        placements,
        run_check=False,
        shape=torch.Size(spec.global_shape),
        stride=_contiguous_stride(spec.global_shape),
    )


class DcpEngine:
    """``torch.distributed.checkpoint`` with DTensor shards."""

    name = "dcp"

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def save(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> None:
        state = {s.key: to_dtensor(s, ctx) for s in specs}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=False))

    def load_into(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> dict[str, torch.Tensor]:
        state = {s.key: to_dtensor(s, ctx) for s in specs}
        try:
            dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
        except CheckpointException as exc:
            raise dcp_failure(exc, path) from None
        return {k: v.to_local() for k, v in state.items()}


class MegatronEngine:
    """Megatron-Core ``dist_checkpointing`` (optional; see ``available``)."""

    name = "megatron"

    def available(self, device: str) -> tuple[bool, str]:
        try:
            from megatron.core import dist_checkpointing  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install raising at import
            return False, f"megatron.core.dist_checkpointing not importable ({type(exc).__name__}: {exc})"
        if device != "cuda":
            return False, "megatron-core dist_checkpointing calls torch.cuda unconditionally; it runs with device='cuda' only"
        return True, ""

    @staticmethod
    def _sharded(specs: list[ShardSpec], ctx: RankContext) -> dict:
        from megatron.core.dist_checkpointing import ShardedTensor

        out = {}
        for s in specs:
            offsets = [(tdim, ctx.coords.on(m), ctx.layout.size(m)) for m, tdim in s.placements]
            split = {m for m, _ in s.placements}
            replica = tuple(ctx.coords.on(m) for m in s.mesh_dims if m not in split)
            out[s.key] = ShardedTensor.from_rank_offsets(s.key, s.local, *offsets, replica_id=replica or 0)
        return out

    def save(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> None:
        from megatron.core import dist_checkpointing

        dist_checkpointing.save(self._sharded(specs, ctx), path)

    def load_into(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> dict[str, torch.Tensor]:
        from megatron.core import dist_checkpointing

        loaded = dist_checkpointing.load(self._sharded(specs, ctx), path)
        return {s.key: loaded[s.key] for s in specs}


ENGINES: dict[str, Engine] = {"dcp": DcpEngine(), "megatron": MegatronEngine()}

_ERROR_KINDS: dict[str, type[CheckpointError]] = {
    "mismatch": CheckpointMismatchError,
    "corrupt": CheckpointCorruptError,
    "unsafe": UnsafeCheckpointError,
}


def _precheck(path: str, expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]], tolerated: Mapping = {}) -> list[str]:
    """``["kind|message", ...]`` for this rank (empty when the checkpoint fits)."""
    try:
        misfits = check_entries(read_metadata(path), expected, tolerated=tolerated)
    except UnsafeCheckpointError as exc:
        return [f"unsafe|{exc}"]
    except CheckpointError as exc:
        return [f"corrupt|{exc}"]
    if not misfits:
        return []
    kind = "unsafe" if any(m.kind == "unsafe" for m in misfits) else "mismatch"
    ordered = sorted(misfits, key=lambda m: m.kind != "unsafe")
    return [f"{kind}|{format_problems([m.message for m in ordered], path)}"]


def load_checked(
    engine: Engine,
    specs: list[ShardSpec],
    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    path: str,
    ctx: RankContext,
    tolerated: Mapping[str, tuple[tuple[int, ...], torch.dtype]] = {},
) -> dict[str, torch.Tensor]:
    """Validate on every rank, agree, then load ``specs`` in place; returns key -> local tensor.

    ``expected`` is the *whole* target checkpoint (``key -> (global shape, dtype)``), not only
    this rank's keys, so extra experts in the checkpoint are caught too (``tolerated``: extra
    keys that are redundant copies, ``safe_io.check_entries``).  Raises a
    ``CheckpointError`` subclass on every rank, with the same message, when anything misfits.
    """
    if not os.path.isdir(path):
        problems = [f"corrupt|checkpoint {path}: not a directory"]
    else:
        problems = _precheck(path, expected, tolerated)
    problems = ctx.agree(problems)
    if problems:
        kind = problems[0].split("|", 1)[0]
        raise _ERROR_KINDS[kind](" || ".join(p.split("|", 1)[1] for p in problems))
    return engine.load_into(specs, path, ctx)
