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
from contextlib import contextmanager
from typing import Iterator, Mapping, Protocol

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.tensor import DTensor, Replicate, Shard

from moe_fq_parity.harness.backends.quiet_imports import quiet_import, quiet_upstream

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
    internal_keys: tuple[str, ...]
    """Byte entries the engine writes and reads for itself, not part of the checked state (names;
    an entry below a name counts too); the safe readers leave them unread."""

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
    internal_keys: tuple[str, ...] = ()

    def available(self, device: str) -> tuple[bool, str]:
        return True, ""

    def save(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> None:
        state = {s.key: to_dtensor(s, ctx) for s in specs}
        dcp.save(state, storage_writer=dcp.FileSystemWriter(path, sync_files=False))

    def load_into(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> dict[str, torch.Tensor]:
        state = {s.key: to_dtensor(s, ctx) for s in specs}
        try:
            # torch logs each metadata file it cannot read as a warning with its traceback before it
            # falls back or fails (the bad-checkpoint rows read such files on purpose); the failure
            # itself is ours to report (dcp_failure)
            with quiet_upstream("torch.distributed.checkpoint"):
                dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner())
        except CheckpointException as exc:
            raise dcp_failure(exc, path) from None
        return {k: v.to_local() for k, v in state.items()}


class SaveRefusedError(RuntimeError):
    """An engine refused to write a checkpoint; raised on every rank with the same message."""


MEGATRON_PIP_HINT = "pip install 'moe-fq-parity[megatron]' (megatron-core and psutil)"

CUDA_CALLS_ON_SAVE: tuple[str, ...] = (
    "torch.cuda.synchronize() in dist_checkpointing/strategies/filesystem_async.py preload_tensors",
    "torch.cuda.current_device() in dist_checkpointing/strategies/state_dict_saver.py "
    "save_state_dict_async_finalize (device of the one-element failure flag it all-reduces)",
)
"""The only CUDA calls Megatron-Core 0.16.1's ``dist_checkpointing.save`` makes on the default
(``torch_dist``, synchronous) path; ``load`` makes none.  On a CPU-only torch both raise
"Torch not compiled with CUDA enabled"."""


@contextmanager
def cpu_shim() -> Iterator[None]:
    """Let ``dist_checkpointing.save`` run on a host without CUDA: for the duration of the call,
    ``torch.cuda.synchronize`` is a no-op (no CUDA stream exists to wait for) and
    ``torch.cuda.current_device`` returns ``torch.device("cpu")`` (its one use puts a flag tensor
    on the device gloo reduces on).  Nothing is patched when CUDA is available; everything is
    restored afterwards, also on an exception.  The calls replaced: ``CUDA_CALLS_ON_SAVE``."""
    if torch.cuda.is_available():
        yield
        return
    saved = torch.cuda.synchronize, torch.cuda.current_device
    torch.cuda.synchronize = lambda *args, **kwargs: None  # type: ignore[assignment]
    torch.cuda.current_device = lambda: torch.device("cpu")  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.synchronize, torch.cuda.current_device = saved


class MegatronEngine:
    """Megatron-Core ``dist_checkpointing`` (optional; see ``available``).

    ``ShardedTensor.from_rank_offsets`` per entry: EP/TP placements become rank offsets (global
    expert offsets for the stacked entries), the other mesh dims of the entry give the
    ``replica_id`` (exactly one rank per shard has all zeros).  On a CPU-only host the save runs
    under ``cpu_shim`` (two CUDA queries replaced, ``CUDA_CALLS_ON_SAVE``); the load needs nothing.
    """

    name = "megatron"
    internal_keys: tuple[str, ...] = ("common_state",)
    """Megatron-Core 0.19 and later store the non-tensor part of the state dict (its "common state
    dict") inside the DCP checkpoint as the pickled ``ShardedObject`` ``common_state``
    (``dist_checkpointing/serialization.py``; key ``common_state/shard_0_1``), where 0.16 wrote a
    separate ``common.pt``.  Megatron reads it back itself; the safe readers skip it unread."""

    def available(self, device: str) -> tuple[bool, str]:
        try:
            with quiet_import():
                from megatron.core import dist_checkpointing  # noqa: F401
        except Exception as exc:  # ImportError, or a broken install raising at import
            return False, f"megatron.core.dist_checkpointing not importable ({type(exc).__name__}: {exc}); {MEGATRON_PIP_HINT}"
        try:
            import psutil  # noqa: F401
        except ImportError:
            return False, f"megatron-core's checkpoint writer needs psutil; {MEGATRON_PIP_HINT}"
        return True, ""

    @staticmethod
    def version() -> str:
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("megatron-core")
        except PackageNotFoundError:
            return "?"

    @staticmethod
    def _sharded(specs: list[ShardSpec], ctx: RankContext) -> dict:
        with quiet_import():
            from megatron.core.dist_checkpointing import ShardedTensor

        out = {}
        for s in specs:
            offsets = [(tdim, ctx.coords.on(m), ctx.layout.size(m)) for m, tdim in s.placements]
            split = {m for m, _ in s.placements}
            replica = tuple(ctx.coords.on(m) for m in s.mesh_dims if m not in split)
            out[s.key] = ShardedTensor.from_rank_offsets(s.key, s.local, *offsets, replica_id=replica or 0)
        return out

    def save(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> None:
        """``dist_checkpointing.save``, after Megatron's own sharding validation has run on every
        rank and the ranks have agreed on its outcome: the validation raises on global rank 0
        only, so a refusal is turned into a ``SaveRefusedError`` on *every* rank (ranks stay in
        step) instead of a rank-0 exception and a hang in the next collective."""
        with quiet_import():
            from megatron.core import dist_checkpointing
            from megatron.core.dist_checkpointing.core import CheckpointingException
            from megatron.core.dist_checkpointing.state_dict_utils import save_preprocess

        try:
            save_preprocess(self._sharded(specs, ctx), validate_access_integrity=True)
            problems = []
        except CheckpointingException as exc:
            problems = [f"{type(exc).__name__}: {exc}"]
        problems = ctx.agree(problems)
        if problems:
            raise SaveRefusedError(" || ".join(problems))
        with cpu_shim(), quiet_upstream("megatron", FutureWarning, _TORCH_ON_MEGATRON):
            dist_checkpointing.save(self._sharded(specs, ctx), path, validate_access_integrity=False)

    def load_into(self, specs: list[ShardSpec], path: str, ctx: RankContext) -> dict[str, torch.Tensor]:
        with quiet_import():
            from megatron.core import dist_checkpointing

        try:
            with quiet_upstream("megatron", FutureWarning, _TORCH_ON_MEGATRON):  # its loader calls torch's deprecated load_state_dict
                loaded = dist_checkpointing.load(self._sharded(specs, ctx), path)
        except CheckpointException as exc:  # its torch_dist strategy reads through DCP
            raise dcp_failure(exc, path) from None
        return {s.key: loaded[s.key] for s in specs}


_TORCH_ON_MEGATRON = ("The argument order of load has been changed",
                      "torch.distributed is disabled, unavailable or uninitialized, assuming the intent is to load in a single process")
"""torch's warnings about how Megatron-Core 0.19 calls it (its common-state load passes arguments by
position, without a process group): 18 lines each, and 2 log lines of its own ("MCore's async save
is deprecated"), in one save and one load layout of the section."""

ENGINES: dict[str, Engine] = {"dcp": DcpEngine(), "megatron": MegatronEngine()}

_ERROR_KINDS: dict[str, type[CheckpointError]] = {
    "mismatch": CheckpointMismatchError,
    "corrupt": CheckpointCorruptError,
    "unsafe": UnsafeCheckpointError,
}


def _precheck(path: str, expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]], tolerated: Mapping = {},
              internal: tuple[str, ...] = ()) -> list[str]:
    """``["kind|message", ...]`` for this rank (empty when the checkpoint fits)."""
    try:
        misfits = check_entries(read_metadata(path), expected, tolerated=tolerated, internal=internal)
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
        problems = _precheck(path, expected, tolerated, engine.internal_keys)
    problems = ctx.agree(problems)
    if problems:
        kind = problems[0].split("|", 1)[0]
        raise _ERROR_KINDS[kind](" || ".join(p.split("|", 1)[1] for p in problems))
    return engine.load_into(specs, path, ctx)
