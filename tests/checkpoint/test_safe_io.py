"""Untrusted checkpoints in one process: allow-listed metadata, tensors only, clean errors."""

from __future__ import annotations

import os
import pathlib
import pickle
import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp

from moe_fq_parity.harness.sections.checkpoint import safe_io
from moe_fq_parity.harness.sections.checkpoint.bad_inputs import _CallsPrint, _cut
from moe_fq_parity.harness.sections.checkpoint.safe_io import (
    CheckpointCorruptError,
    SafeFileSystemReader,
    SafeLoadPlanner,
    UnsafeCheckpointError,
    check_entries,
    dcp_failure,
    load_full,
    read_metadata,
    save_full,
)
from moe_fq_parity.harness.core.bits import bits_equal

TENSORS = {
    "w": (torch.randn(4, 6, generator=torch.Generator().manual_seed(0)) * 3).bfloat16(),
    "amax": torch.tensor([0.5, -0.0, 3.0]),
    "scalar": torch.tensor(2.5),
}


@pytest.fixture
def ckpt(tmp_path):
    path = str(tmp_path / "ckpt")
    save_full(TENSORS, path)
    return path


def test_full_roundtrip_is_bit_exact_and_weights_only(ckpt, monkeypatch):
    calls = []
    real_load = torch.load

    def spy(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    def no_pickle(*args, **kwargs):
        raise AssertionError("pickle.load must not read checkpoint files")

    monkeypatch.setattr(torch, "load", spy)
    monkeypatch.setattr(pickle, "load", no_pickle)
    back = load_full(ckpt)
    assert set(back) == set(TENSORS)
    for k, v in TENSORS.items():
        assert back[k].dtype == v.dtype and bool(bits_equal(back[k], v).all()), k
    assert calls and all(c is True for c in calls), calls


def test_metadata_that_would_run_code_is_refused(ckpt, capsys):
    with open(os.path.join(ckpt, ".metadata"), "wb") as f:
        pickle.dump(_CallsPrint(), f)
    with pytest.raises(UnsafeCheckpointError, match="builtins.print"):
        load_full(ckpt)
    assert "ran code" not in capsys.readouterr().out


def test_pickled_entry_is_refused_before_and_inside_dcp(tmp_path, monkeypatch):
    path = str(tmp_path / "bytes")
    save_full({**TENSORS, "obj": "a python object"}, path)
    with pytest.raises(UnsafeCheckpointError, match="'obj'"):
        load_full(path)
    problems = check_entries(read_metadata(path), {"obj": ((3,), torch.float32)})
    assert [p.kind for p in problems] == ["unsafe", "mismatch", "mismatch", "mismatch"]
    # Past the pre-check, the planner itself refuses to unpickle (DCP's default would use weights_only=False).
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail(f"torch.load called with {k}"))
    state = {"obj": "placeholder"}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(BaseException) as info:
            dcp.load(state, storage_reader=SafeFileSystemReader(path), planner=SafeLoadPlanner(), no_dist=True)
    err = dcp_failure(info.value, path) if not isinstance(info.value, UnsafeCheckpointError) else info.value
    assert isinstance(err, UnsafeCheckpointError) and "'obj'" in str(err)


@pytest.mark.parametrize("damage", ["truncate_data", "truncate_metadata", "garble_metadata", "remove_metadata"])
def test_damaged_files_fail_cleanly(ckpt, damage):
    meta = os.path.join(ckpt, ".metadata")
    if damage == "truncate_data":
        for name in os.listdir(ckpt):
            if name.endswith(".distcp"):
                _cut(os.path.join(ckpt, name))
    elif damage == "truncate_metadata":
        _cut(meta)
    elif damage == "garble_metadata":
        with open(meta, "wb") as f:
            f.write(b"\x80\x04garbage" * 10)
    else:
        os.remove(meta)
    with pytest.raises(CheckpointCorruptError, match="unreadable|no metadata"):
        load_full(ckpt)


def test_misfit_messages_name_key_and_both_shapes(ckpt):
    md = read_metadata(ckpt)
    expected = {"w": ((8, 6), torch.bfloat16), "amax": ((3,), torch.bfloat16), "extra": ((1,), torch.float32)}
    text = [p.message for p in check_entries(md, expected)]
    assert "key 'w': checkpoint shape (4, 6) != target shape (8, 6)" in text
    assert any("key 'amax'" in t and "dtype torch.float32 != target dtype torch.bfloat16" in t for t in text)
    assert "key 'extra': missing from checkpoint (target shape (1,))" in text
    assert "key 'scalar': in checkpoint (shape ()) but not in the target layout" in text


class _ByName:
    """Pickles as ``getattr(cls, name)``: how Python 3.11.2 pickles an enum member."""

    def __init__(self, cls, name):
        self.cls, self.name = cls, name

    def __reduce__(self):
        return getattr, (self.cls, self.name)


def test_enum_members_pickled_by_name_are_read_and_nothing_else_through_getattr(ckpt, monkeypatch):
    """Python 3.11.2 pickles DCP's enums (``_MEM_FORMAT_ENCODING``, ``WriteItemType``) by name,
    through ``builtins.getattr``: the checkpoint section failed every load of a DCP checkpoint
    written there.  A member of an allow-listed enum is read; ``getattr`` on anything else is not."""
    from torch.distributed.checkpoint.metadata import _MEM_FORMAT_ENCODING
    from torch.distributed.checkpoint.planner import WriteItemType

    md = read_metadata(ckpt)
    with monkeypatch.context() as m:  # rewrite the metadata with its enum members by name, as 3.11.2 writes them
        m.setattr(_MEM_FORMAT_ENCODING, "__reduce_ex__", lambda self, proto: (getattr, (type(self), self.name)))
        with open(os.path.join(ckpt, ".metadata"), "wb") as f:
            pickle.dump(md, f)
    with open(os.path.join(ckpt, ".metadata"), "rb") as f:
        assert b"getattr" in f.read()
    back = load_full(ckpt)
    assert all(bool(bits_equal(back[k], v).all()) for k, v in TENSORS.items())
    assert read_metadata(ckpt).state_dict_metadata["w"].properties.memory_format is torch.contiguous_format
    for cls, name, what in ((WriteItemType, "__init__", "WriteItemType, '__init__'"), (pathlib.Path, "home", "Path, 'home'"),
                            (torch.Size, "count", "Size, 'count'")):  # fmt: skip
        with open(os.path.join(ckpt, ".metadata"), "wb") as f:
            pickle.dump(_ByName(cls, name), f)
        with pytest.raises(UnsafeCheckpointError, match=f"getattr\\({what}\\)"):
            read_metadata(ckpt)


def test_allow_list_is_small():
    """Only DCP metadata classes, Size, dtype lookup, layout lookup, paths, OrderedDict, and the
    DCP save-plan records Megatron-Core caches in its metadata."""
    modules = {m for m, _ in safe_io.ALLOWED_GLOBALS}
    assert modules == {"torch.distributed.checkpoint.metadata", "torch.distributed.checkpoint.filesystem", "torch", "torch.serialization",
                       "collections", "pathlib", "torch.distributed.checkpoint.planner"}
    assert {n for m, n in safe_io.ALLOWED_GLOBALS if m == "torch.distributed.checkpoint.planner"} == {
        "SavePlan", "WriteItem", "WriteItemType", "TensorWriteData"}


_UNPICKLED: list[str] = []


class _Records:
    """A pickled object whose unpickling is visible (appends to ``_UNPICKLED``)."""

    def __setstate__(self, state: dict) -> None:
        _UNPICKLED.append("unpickled")


def test_engine_internal_byte_entries_are_skipped_unread_and_nothing_else_is(tmp_path):
    """Megatron-Core >= 0.19 writes its common state dict as the byte entry ``common_state/shard_0_1``
    inside the checkpoint: the safe readers skip an engine's own entries without unpickling them,
    and still refuse every other byte entry and an expected key stored as bytes."""
    from moe_fq_parity.harness.sections.checkpoint.engines import ENGINES

    internal = ENGINES["megatron"].internal_keys
    path = str(tmp_path / "mcore019")
    save_full({**TENSORS, "common_state/shard_0_1": _Records()}, path)
    _UNPICKLED.clear()
    with pytest.raises(UnsafeCheckpointError, match="common_state/shard_0_1"):
        load_full(path)  # DCP's own engine writes no such entry: refused as before
    back = load_full(path, internal)
    assert set(back) == set(TENSORS) and not _UNPICKLED
    expected = {k: (tuple(v.shape), v.dtype) for k, v in TENSORS.items()}
    assert check_entries(read_metadata(path), expected, internal=internal) == []
    assert [p.kind for p in check_entries(read_metadata(path), expected)] == ["mismatch"]
    assert ENGINES["dcp"].internal_keys == ()
    # Only the engine's names, and only byte entries, are skipped.
    other = str(tmp_path / "other")
    save_full({**TENSORS, "common_statex": _Records(), "common_state/shard_0_1": _Records()}, other)
    with pytest.raises(UnsafeCheckpointError, match="common_statex"):
        load_full(other, internal)
    unsafe = check_entries(read_metadata(path), {**expected, "common_state/shard_0_1": ((1,), torch.float32)}, internal=internal)
    assert [p.kind for p in unsafe] == ["unsafe"]
    assert not _UNPICKLED


# --- metadata that disagrees with the files: every size, dtype, offset and path is checked ----------------------------

def _doctor(path, edit):
    """Rewrite ``path``'s ``.metadata`` after ``edit(md)`` (the metadata read through the allow-list)."""
    md = read_metadata(path)
    edit(md)
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)


def _entry(md, key):
    return md.state_dict_metadata[key]


def _storage(md, key):
    return next(v for k, v in md.storage_data.items() if k.fqn == key)


@pytest.fixture
def flat(tmp_path):
    """A checkpoint holding one 8-element fp32 vector ``v`` (one chunk) and ``TENSORS``."""
    path = str(tmp_path / "flat")
    save_full({**TENSORS, "v": torch.arange(8, dtype=torch.float32)}, path)
    return path


def _set_size(size):
    def edit(md):
        _entry(md, "v").size = torch.Size(size)
    return edit


def _set_dtype(md):
    _entry(md, "v").properties.dtype = torch.float64


def _set_chunk(offsets, sizes):
    def edit(md):
        c = _entry(md, "v").chunks[0]
        c.offsets, c.sizes = torch.Size(offsets), torch.Size(sizes)
    return edit


def _set_storage(**fields):
    def edit(md):
        info = _storage(md, "v")
        for k, v in fields.items():
            setattr(info, k, v(info) if callable(v) else v)
    return edit


def _huge_consistent(md):
    """Size and chunk both claim 2**50 elements: only the file can tell."""
    e = _entry(md, "v")
    e.size = torch.Size([2**50])
    e.chunks[0].sizes = torch.Size([2**50])


@pytest.mark.parametrize("edit,match", [
    (_set_size([2**50]), r"'v'.*\(1125899906842624,\)"),
    (_huge_consistent, r"'v'"),
    (_set_size([16]), r"'v'.*chunks cover 8 of its 16 elements"),
    (_set_size([4]), r"'v'.*outside"),
    (_set_size([2, 4]), r"'v'"),
    (_set_dtype, r"'v'.*stored as \(8,\) torch.float32; the metadata says \(8,\) torch.float64"),
    (_set_chunk([4], [8]), r"'v'.*outside"),
    (_set_chunk([0], [4]), r"'v'"),
    (_set_storage(length=lambda i: i.length + 10**6), r"'v'.*past the end"),
    (_set_storage(offset=-1), r"'v'"),
    (_set_storage(offset=lambda i: i.offset + 1), r"'v'"),
    (_set_storage(transform_descriptors=["zstd"]), r"'v'.*transform"),
], ids=["size_2**50", "size_and_chunk_2**50", "size_16_over_8", "size_4_over_8", "shape_2x4", "dtype_f64",
        "chunk_offset_4", "chunk_size_4", "length_past_eof", "offset_negative", "offset_shifted", "transform"])
def test_metadata_that_disagrees_with_the_files_is_refused(flat, edit, match):
    """Today's loader allocated first (2**50), NaN-filled or cut short what the chunks did not
    cover, and converted a doctored dtype: each is now a ``CheckpointError`` naming the key."""
    _doctor(flat, edit)
    with pytest.raises(safe_io.CheckpointError, match=match):
        load_full(flat)


def test_no_allocation_is_tried_for_a_doctored_size(flat, monkeypatch):
    _doctor(flat, _set_size([2**50]))
    real = torch.full

    def full(size, *a, **k):
        assert torch.Size(size).numel() < 2**20, f"allocation of {tuple(size)} tried"
        return real(size, *a, **k)

    monkeypatch.setattr(torch, "full", full)
    monkeypatch.setattr(torch, "empty", lambda size, *a, **k: full(size, *a, **k))
    with pytest.raises(safe_io.CheckpointError, match="'v'"):
        load_full(flat)


@pytest.mark.parametrize("where", ["parent", "absolute", "symlink"])
def test_a_storage_path_outside_the_checkpoint_folder_is_refused(flat, tmp_path, where):
    outside = tmp_path / "outside"
    outside.mkdir()
    data = next(n for n in os.listdir(flat) if n.endswith(".distcp"))
    with open(os.path.join(flat, data), "rb") as f:
        (outside / data).write_bytes(f.read())
    if where == "parent":
        rel = os.path.join("..", "outside", data)
    elif where == "absolute":
        rel = str(outside / data)
    else:
        os.symlink(outside / data, os.path.join(flat, "link.distcp"))
        rel = "link.distcp"
    _doctor(flat, _set_storage(relative_path=rel))
    with pytest.raises(UnsafeCheckpointError, match=r"'v'.*outside the checkpoint folder"):
        load_full(flat)
    with pytest.raises(UnsafeCheckpointError, match=r"'v'.*outside the checkpoint folder"):
        SafeFileSystemReader(flat).read_metadata()


def test_multi_chunk_entries_load_whole(tmp_path):
    """Chunks that tile the tensor (as a sharded save writes them) are read and placed by offset."""
    path = str(tmp_path / "chunks")
    full = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    save_full({"t": full}, path)
    md = read_metadata(path)
    info = _storage(md, "t")
    with open(os.path.join(path, info.relative_path), "rb") as f:
        f.seek(info.offset)
        blob = f.read(info.length)
    # write the two row halves as separate chunks into a second file, as two ranks would
    import io
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

    pieces, items, off = [], {}, 0
    for r0 in (0, 2):
        buf = io.BytesIO()
        torch.save(full[r0:r0 + 2].clone(), buf)
        pieces.append(buf.getvalue())
        items[MetadataIndex("t", torch.Size([r0, 0]))] = type(info)("halves.distcp", off, len(pieces[-1]))
        off += len(pieces[-1])
    with open(os.path.join(path, "halves.distcp"), "wb") as f:
        f.write(b"".join(pieces))
    assert blob  # the original stays, unreferenced
    md.state_dict_metadata["t"].chunks = [ChunkStorageMetadata(torch.Size([0, 0]), torch.Size([2, 6])),
                                          ChunkStorageMetadata(torch.Size([2, 0]), torch.Size([2, 6]))]
    md.storage_data = items
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    assert torch.equal(load_full(path)["t"], full)
    # overlapping chunks (the second moved up one row) cover 20 of 24 elements twice-over: refused
    md.state_dict_metadata["t"].chunks[1] = ChunkStorageMetadata(torch.Size([1, 0]), torch.Size([2, 6]))
    md.storage_data = {MetadataIndex("t", torch.Size([0, 0])): items[MetadataIndex("t", torch.Size([0, 0]))],
                       MetadataIndex("t", torch.Size([1, 0])): items[MetadataIndex("t", torch.Size([2, 0]))]}
    with open(os.path.join(path, ".metadata"), "wb") as f:
        pickle.dump(md, f)
    with pytest.raises(safe_io.CheckpointError, match="'t'.*overlap"):
        load_full(path)
