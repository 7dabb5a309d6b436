"""Reading DCP checkpoints without trusting them: restricted metadata, tensors only, clear errors.

``torch.distributed.checkpoint`` (torch 2.13) reads ``.metadata`` with a bare ``pickle.load``
and loads non-tensor entries (``BytesStorageMetadata``) with ``torch.load(weights_only=False)``
(``DefaultLoadPlanner.load_bytes``); only tensor payloads go through ``weights_only=True``.  A
crafted checkpoint could run code through either.  Here:

* ``read_metadata`` unpickles ``.metadata`` with an allow-list of the DCP metadata classes,
  ``torch.Size``, torch dtypes and ``pathlib`` paths (``ALLOWED_GLOBALS``); anything else is an
  ``UnsafeCheckpointError`` naming the global;
* ``SafeFileSystemReader`` is DCP's file reader with that metadata reader;
* ``SafeLoadPlanner`` refuses byte entries instead of unpickling them; ``check_entries`` refuses a
  requested key stored as bytes before any load starts;
* ``check_entries`` compares a checkpoint's keys, shapes and dtypes with what the target expects,
  and names every misfit: key, checkpoint shape and target shape.

``load_full`` is the single-process oracle: a process without a process group loads every tensor
of a checkpoint whole, independently of the layout that wrote it.
"""

from __future__ import annotations

import os
import pickle
import warnings
from typing import Any, Mapping, NamedTuple, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import BytesStorageMetadata, FileSystemReader, FileSystemWriter, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner

_METADATA_CLASSES = (
    "Metadata",
    "TensorStorageMetadata",
    "BytesStorageMetadata",
    "TensorProperties",
    "ChunkStorageMetadata",
    "MetadataIndex",
    "StorageMeta",
    "_MEM_FORMAT_ENCODING",
)
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {("torch.distributed.checkpoint.metadata", n) for n in _METADATA_CLASSES}
    | {
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("collections", "OrderedDict"),
    }
    | {("pathlib", n) for n in ("Path", "PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")}
    | {("torch.distributed.checkpoint.planner", n) for n in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData")}
)
"""``(module, name)`` globals a DCP ``.metadata`` pickle may reference; plus ``torch.<dtype>``.
The ``planner`` data classes are the save plans Megatron-Core's ``dist_checkpointing`` caches in
the metadata (``mcore_data``); plain records and an enum, nothing that runs code."""

def is_internal(key: str, internal: Sequence[str]) -> bool:
    """Whether ``key`` is one of an engine's own entries: equal to a name of ``internal`` or below
    it (``common_state`` covers ``common_state/shard_0_1``)."""
    return any(key == name or key.startswith(name + "/") for name in internal)


MAX_LISTED_PROBLEMS = 12
"""How many misfits an error message lists before it says how many more there are."""


class CheckpointError(Exception):
    """A checkpoint cannot be loaded into the target; the message says which key and why."""


class CheckpointMismatchError(CheckpointError):
    """Keys, shapes or dtypes of the checkpoint do not fit the target layout."""


class CheckpointCorruptError(CheckpointError):
    """A checkpoint file is missing, truncated or unreadable."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint asks to unpickle something other than tensors and DCP metadata."""


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), torch.dtype):
            return getattr(torch, name)
        raise UnsafeCheckpointError(f"checkpoint metadata references {module}.{name}, which is not on the allow-list; refused")


def read_metadata(path: str | os.PathLike, rank: int | None = None) -> Metadata:
    """Unpickle ``{path}/.metadata`` (or ``__{rank}.metadata``) with the allow-list."""
    name = ".metadata" if rank is None else f"__{rank}.metadata"
    file = os.path.join(os.fspath(path), name)
    try:
        with open(file, "rb") as f:
            md = _RestrictedUnpickler(f).load()
    except UnsafeCheckpointError:
        raise
    except FileNotFoundError as exc:
        raise CheckpointCorruptError(f"checkpoint {path}: no metadata file {name}") from exc
    except Exception as exc:  # truncated or garbled pickle: any unpickling error is corruption
        raise CheckpointCorruptError(f"checkpoint {path}: metadata {name} unreadable ({type(exc).__name__}: {exc})") from exc
    if not isinstance(md, Metadata):
        raise CheckpointCorruptError(f"checkpoint {path}: metadata {name} holds a {type(md).__name__}, not DCP Metadata")
    return md


class SafeFileSystemReader(FileSystemReader):
    """DCP's ``FileSystemReader`` reading metadata through the allow-list (tensors: weights_only=True)."""

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        md = read_metadata(self.path, kwargs.get("rank"))
        md.storage_meta = md.storage_meta or dcp.metadata.StorageMeta()
        md.storage_meta.load_id = self.load_id
        return md


class SafeLoadPlanner(DefaultLoadPlanner):
    """``DefaultLoadPlanner`` that refuses byte (pickled object) entries instead of unpickling them."""

    def load_bytes(self, read_item: Any, value: Any) -> None:
        raise UnsafeCheckpointError(f"key {read_item.dest_index.fqn!r} is stored as a pickled object; only tensors are loaded")


def tensor_entries(md: Metadata) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    """``key -> (global shape, dtype)`` of every tensor entry; byte entries are left out."""
    return {
        k: (tuple(v.size), v.properties.dtype) for k, v in md.state_dict_metadata.items() if isinstance(v, TensorStorageMetadata)
    }


class Misfit(NamedTuple):
    """One way a checkpoint does not fit: ``kind`` is ``"mismatch"`` or ``"unsafe"``."""

    kind: str
    message: str


def check_entries(
    md: Metadata,
    expected: Mapping[str, tuple[tuple[int, ...], torch.dtype]],
    *,
    where: str = "checkpoint",
    tolerated: Mapping[str, tuple[tuple[int, ...], torch.dtype]] = {},
    internal: Sequence[str] = (),
) -> list[Misfit]:
    """Every way the checkpoint's entries misfit ``expected`` (``key -> (shape, dtype)``).

    Missing keys, keys the target does not have, shape and dtype differences (``mismatch``), and
    expected keys stored as pickled objects (``unsafe``).  An empty list means the checkpoint fits.
    A stored key the target does not read but ``tolerated`` names with the same shape and dtype
    (a redundant copy, e.g. a further ``[N_global]``-vector key) is not a misfit, nor is a byte
    entry the engine writes and reads for itself (``internal``, ``Engine.internal_keys``) that the
    target does not expect; an expected key is checked whatever its name.
    """
    problems = []
    stored = md.state_dict_metadata
    for key, (shape, dtype) in expected.items():
        if key not in stored:
            problems.append(Misfit("mismatch", f"key {key!r}: missing from {where} (target shape {tuple(shape)})"))
            continue
        entry = stored[key]
        if isinstance(entry, BytesStorageMetadata) or not isinstance(entry, TensorStorageMetadata):
            problems.append(Misfit("unsafe", f"key {key!r}: stored as a pickled object in {where}, not a tensor; refused (target shape {tuple(shape)})"))
            continue
        got = tuple(entry.size)
        if got != tuple(shape):
            problems.append(Misfit("mismatch", f"key {key!r}: {where} shape {got} != target shape {tuple(shape)}"))
        elif entry.properties.dtype != dtype:
            problems.append(Misfit("mismatch", f"key {key!r}: {where} dtype {entry.properties.dtype} != target dtype {dtype} (shape {got})"))
    for key in stored:
        if key not in expected:
            if is_internal(key, internal) and isinstance(stored[key], BytesStorageMetadata):
                continue
            shape = tuple(stored[key].size) if isinstance(stored[key], TensorStorageMetadata) else "bytes"
            if key in tolerated and isinstance(stored[key], TensorStorageMetadata) and (shape, stored[key].properties.dtype) == (
                tuple(tolerated[key][0]), tolerated[key][1]
            ):
                continue
            problems.append(Misfit("mismatch", f"key {key!r}: in {where} (shape {shape}) but not in the target layout"))
    return problems


def format_problems(problems: list[str], path: str | os.PathLike) -> str:
    """One message listing the first ``MAX_LISTED_PROBLEMS`` misfits (unsafe ones first)."""
    shown = problems[:MAX_LISTED_PROBLEMS]
    more = len(problems) - len(shown)
    tail = f"; ... and {more} more" if more > 0 else ""
    return f"checkpoint {os.fspath(path)} does not fit the target: " + "; ".join(shown) + tail


def save_full(tensors: Mapping[str, torch.Tensor], path: str | os.PathLike) -> None:
    """Single-process DCP save of whole tensors (no process group)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
        dcp.save(dict(tensors), storage_writer=FileSystemWriter(os.fspath(path), sync_files=False), no_dist=True)


def load_full(path: str | os.PathLike, internal: Sequence[str] = ()) -> dict[str, torch.Tensor]:
    """Single-process load of every tensor of a checkpoint, whole (CPU; the independent oracle).

    Raises ``UnsafeCheckpointError`` for byte entries or disallowed metadata globals and
    ``CheckpointCorruptError`` for unreadable files.  Byte entries named by ``internal`` (the
    engine's own, ``Engine.internal_keys``) are left unread, never unpickled.
    """
    md = read_metadata(path)
    byte_keys = [
        k for k, v in md.state_dict_metadata.items()
        if not isinstance(v, TensorStorageMetadata) and not (is_internal(k, internal) and isinstance(v, BytesStorageMetadata))
    ]
    if byte_keys:
        raise UnsafeCheckpointError(f"checkpoint {path}: keys {byte_keys} are pickled objects, not tensors; refused")
    out = {}
    for key, (shape, dtype) in tensor_entries(md).items():
        fill = float("nan") if dtype.is_floating_point else 0
        out[key] = torch.full(shape, fill, dtype=dtype)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*torch.distributed is disabled.*")
            dcp.load(out, storage_reader=SafeFileSystemReader(os.fspath(path)), planner=SafeLoadPlanner(), no_dist=True)
    except CheckpointException as exc:
        raise dcp_failure(exc, path) from None
    except CheckpointError:
        raise
    except Exception as exc:  # a reader error DCP did not wrap: the file is unreadable
        raise CheckpointCorruptError(f"checkpoint {path}: data unreadable ({type(exc).__name__}: {_first_line(exc)})") from exc
    return out


def dcp_failure(exc: CheckpointException, path: str | os.PathLike) -> CheckpointError:
    """Turn DCP's ``CheckpointException`` (a ``BaseException`` carrying each failed rank's exception)
    into one of ours: the first ``CheckpointError`` a rank raised, else ``CheckpointCorruptError``
    listing ``rank: type: message`` of every failure."""
    underlying = [(rank, pair[0]) for rank, pair in sorted(exc.failures.items())]
    for _, e in underlying:
        if isinstance(e, CheckpointError):
            return type(e)(str(e))
    summary = "; ".join(f"rank {rank}: {type(e).__name__}: {_first_line(e)}" for rank, e in underlying)
    return CheckpointCorruptError(f"checkpoint {os.fspath(path)}: data unreadable ({summary})")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
