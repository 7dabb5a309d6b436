"""Reading DCP checkpoints without trusting them: restricted metadata, tensors only, clear errors.

``torch.distributed.checkpoint`` (torch 2.13) reads ``.metadata`` with a bare ``pickle.load``
and loads non-tensor entries (``BytesStorageMetadata``) with ``torch.load(weights_only=False)``
(``DefaultLoadPlanner.load_bytes``); only tensor payloads go through ``weights_only=True``.  A
crafted checkpoint could run code through either.  Here:

* ``read_metadata`` unpickles ``.metadata`` with an allow-list of the DCP metadata classes,
  ``torch.Size``, torch dtypes and ``pathlib`` paths (``ALLOWED_GLOBALS``), and the by-name form of
  their enum members; anything else is an ``UnsafeCheckpointError`` naming the global;
* ``SafeFileSystemReader`` is DCP's file reader with that metadata reader;
* ``SafeLoadPlanner`` refuses byte entries instead of unpickling them; ``check_entries`` refuses a
  requested key stored as bytes before any load starts;
* ``check_entries`` compares a checkpoint's keys, shapes and dtypes with what the target expects,
  and names every misfit: key, checkpoint shape and target shape.

``check_storage`` holds the metadata to the files before anything is allocated or read: every
tensor entry's size, chunks and dtype, every storage record's path, offset and length (a path
must stay inside the checkpoint folder, symlinks resolved); ``SafeFileSystemReader`` runs it on
every read of the metadata.

``load_full`` is the single-process oracle: a process without a process group loads every tensor
of a checkpoint whole, independently of the layout that wrote it, with its own reader (not DCP's
planner, which fills what no chunk covers with whatever the target held, reads only the part of a
chunk that fits and converts a dtype silently): each stored chunk must be a tensor of exactly its
chunk's shape and the entry's dtype, and the chunks must tile the entry.
"""

from __future__ import annotations

import enum
import io
import math
import os
import pickle
import warnings
from typing import Any, Mapping, NamedTuple, Sequence

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import BytesStorageMetadata, FileSystemReader, FileSystemWriter, Metadata, TensorStorageMetadata
from torch.distributed.checkpoint.metadata import MetadataIndex
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


def _enum_member(cls: Any, name: Any) -> Any:
    """What ``builtins.getattr`` may do in the metadata: some Python versions (3.11.2 here; 3.11.7
    and 3.12.1 pickle by value) pickle an enum member by name, as ``getattr(EnumClass, "NAME")``.
    Only a member of an allow-listed enum class is given; any other ``getattr`` is refused."""
    if (isinstance(cls, type) and issubclass(cls, enum.Enum) and (cls.__module__, cls.__qualname__) in ALLOWED_GLOBALS
            and isinstance(name, str) and name in cls.__members__):  # fmt: skip
        return cls[name]
    raise UnsafeCheckpointError(f"checkpoint metadata calls getattr({getattr(cls, '__qualname__', type(cls).__name__)}, {name!r}), "
                                "which is not a member of an allow-listed enum; refused")  # fmt: skip


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        if (module, name) == ("builtins", "getattr"):
            return _enum_member
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
        check_storage(md, self.path)
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


class _Piece(NamedTuple):
    """Where one chunk of one tensor entry lives: its offsets and sizes in the entry, its file
    (resolved, inside the checkpoint folder) and its byte range there."""

    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int


def _ints(value: object, n: int | None = None) -> Sequence[int] | None:
    """``value`` as non-negative ints (``n`` of them, where given), or None."""
    try:
        out = tuple(value)  # type: ignore[arg-type]
    except TypeError:
        return None
    ok = (n is None or len(out) == n) and all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in out)
    return out if ok else None


def _overlap(a: _Piece, b: _Piece) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a.offsets, a.sizes, b.offsets, b.sizes))


def _inside(root: str, relative: object, what: str) -> str:
    """The real path of ``relative`` under ``root``; ``UnsafeCheckpointError`` when it leaves ``root``."""
    if not isinstance(relative, (str, os.PathLike)) or not os.fspath(relative):
        raise CheckpointCorruptError(f"{what}: storage path {relative!r} is not a file name")
    real_root = os.path.realpath(root)
    real = os.path.realpath(os.path.join(real_root, os.fspath(relative)))
    if os.path.commonpath([real_root, real]) != real_root or real == real_root:
        raise UnsafeCheckpointError(f"{what}: storage path {os.fspath(relative)!r} is outside the checkpoint folder; refused")
    return real


def check_storage(md: Metadata, path: str | os.PathLike) -> dict[str, list[_Piece]]:
    """Hold every tensor entry of ``md`` to the files of the checkpoint at ``path``, before anything
    is allocated or read; return each entry's chunks with where they are stored.

    Per entry: the size is a list of non-negative ints; every chunk lies inside it and the chunks
    tile it (no overlap, every element covered); every chunk has a storage record whose path stays
    inside the checkpoint folder (symlinks resolved), names an existing file, and whose byte range
    ``[offset, offset + length)`` lies inside that file and holds at least the chunk's
    ``numel x itemsize`` bytes; no transform (compression) is declared.  Any misfit is a
    ``CheckpointCorruptError`` (``UnsafeCheckpointError`` for a path outside the folder) naming
    the key.  Cost: one ``stat`` per storage file, ``O(chunks^2)`` per entry for the overlap test.
    """
    root = os.fspath(path)
    sizes: dict[str, int] = {}
    out: dict[str, list[_Piece]] = {}
    for key, entry in md.state_dict_metadata.items():
        if not isinstance(entry, TensorStorageMetadata):
            continue
        what = f"checkpoint {root}: key {key!r}"
        dtype = getattr(entry.properties, "dtype", None)
        if not isinstance(dtype, torch.dtype):
            raise CheckpointCorruptError(f"{what}: dtype {dtype!r} is not a torch dtype")
        size = _ints(entry.size)
        if size is None:
            raise CheckpointCorruptError(f"{what}: size {entry.size!r} is not a list of non-negative ints")
        numel = math.prod(size)
        pieces: list[_Piece] = []
        for c in entry.chunks:
            offsets, csizes = _ints(c.offsets, len(size)), _ints(c.sizes, len(size))
            if offsets is None or csizes is None or any(o + n > d for o, n, d in zip(offsets, csizes, size)):
                raise CheckpointCorruptError(
                    f"{what}: chunk at offsets {tuple(c.offsets)} of sizes {tuple(c.sizes)} lies outside its size {tuple(size)}")
            info = md.storage_data.get(MetadataIndex(key, torch.Size(offsets)))
            if info is None:
                raise CheckpointCorruptError(f"{what}: no storage record for the chunk at offsets {offsets}")
            if getattr(info, "transform_descriptors", None):
                raise CheckpointCorruptError(f"{what}: chunk at offsets {offsets} is stored with transforms "
                                             f"{list(info.transform_descriptors)}; only plain tensor files are read")
            file = _inside(root, getattr(info, "relative_path", None), what)
            if file not in sizes:
                if not os.path.isfile(file):
                    raise CheckpointCorruptError(f"{what}: data unreadable (storage file {getattr(info, 'relative_path')!r} is missing)")
                sizes[file] = os.path.getsize(file)
            start, length = getattr(info, "offset", None), getattr(info, "length", None)
            if _ints((start, length), 2) is None:
                raise CheckpointCorruptError(f"{what}: storage byte range offset={start!r} length={length!r} is not two non-negative ints")
            if start + length > sizes[file]:
                raise CheckpointCorruptError(f"{what}: data unreadable (bytes {start}..{start + length} run past the end of "
                                             f"{info.relative_path!r}, {sizes[file]} bytes)")
            need = math.prod(csizes) * dtype.itemsize
            if need > length:
                raise CheckpointCorruptError(f"{what}: chunk at offsets {offsets} of sizes {csizes} ({need} bytes of {dtype}) "
                                             f"is stored in {length} bytes")
            piece = _Piece(offsets, csizes, file, start, length)
            hit = next((p for p in pieces if _overlap(p, piece)), None)
            if hit is not None:
                raise CheckpointCorruptError(f"{what}: chunks at offsets {hit.offsets} and {offsets} overlap")
            pieces.append(piece)
        covered = sum(math.prod(p.sizes) for p in pieces)
        if covered != numel:
            raise CheckpointCorruptError(f"{what}: its chunks cover {covered} of its {numel} elements (size {tuple(size)})")
        out[key] = pieces
    return out


def _read_piece(piece: _Piece, dtype: torch.dtype, what: str) -> torch.Tensor:
    """The stored chunk, loaded with ``weights_only=True``; it must be a tensor of the chunk's
    sizes and the entry's dtype."""
    try:
        with open(piece.file, "rb") as f:
            f.seek(piece.offset)
            blob = f.read(piece.length)
        t = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any failure to read or unpickle is corruption
        raise CheckpointCorruptError(f"{what}: data unreadable ({type(exc).__name__}: {_first_line(exc)})") from exc
    if not isinstance(t, torch.Tensor):
        raise CheckpointCorruptError(f"{what}: the chunk at offsets {piece.offsets} holds a {type(t).__name__}, not a tensor")
    if t.dtype != dtype or tuple(t.shape) != piece.sizes:
        raise CheckpointCorruptError(f"{what}: the chunk at offsets {piece.offsets} is stored as {tuple(t.shape)} {t.dtype}; "
                                     f"the metadata says {piece.sizes} {dtype}")
    return t


def load_full(path: str | os.PathLike, internal: Sequence[str] = ()) -> dict[str, torch.Tensor]:
    """Single-process load of every tensor of a checkpoint, whole (CPU; the independent oracle).

    ``check_storage`` first (nothing is allocated for an entry before its chunks are known to
    tile it and to fit their byte ranges); then, per entry, every chunk is read, checked to be a
    tensor of its chunk's shape and the entry's dtype (``torch.load(weights_only=True)``), and
    placed by offset; no element is left unwritten, none is converted.  Memory: an entry stored in
    one chunk is returned as loaded; otherwise its chunks and the whole entry (2x the entry) at once.
    Time: several times faster than ``dcp.load`` with the safe reader (docs/measured.md §13).

    Byte entries named by ``internal`` (the engine's own, ``Engine.internal_keys``) are left
    unread, never unpickled.

    Raises ``UnsafeCheckpointError`` for byte entries, disallowed metadata globals or a storage
    path outside the folder, and ``CheckpointCorruptError`` for unreadable files or metadata that
    disagrees with them (each naming the key).
    """
    md = read_metadata(path)
    byte_keys = [
        k for k, v in md.state_dict_metadata.items()
        if not isinstance(v, TensorStorageMetadata) and not (is_internal(k, internal) and isinstance(v, BytesStorageMetadata))
    ]
    if byte_keys:
        raise UnsafeCheckpointError(f"checkpoint {path}: keys {byte_keys} are pickled objects, not tensors; refused")
    pieces = check_storage(md, path)
    out = {}
    for key, entry in md.state_dict_metadata.items():
        if key not in pieces:  # an engine's own byte entry (``internal``), left unread
            continue
        what = f"checkpoint {os.fspath(path)}: key {key!r}"
        dtype, size = entry.properties.dtype, tuple(entry.size)
        loaded = [(p, _read_piece(p, dtype, what)) for p in pieces[key]]
        if len(loaded) == 1:
            out[key] = loaded[0][1]
            continue
        whole = torch.empty(size, dtype=dtype)
        for p, t in loaded:
            whole[tuple(slice(o, o + n) for o, n in zip(p.offsets, p.sizes))] = t
        out[key] = whole
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
