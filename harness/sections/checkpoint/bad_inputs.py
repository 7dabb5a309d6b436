"""Checkpoints that must not load, each with the error and the words the message must contain.

Built by the parent process (single-process DCP saves and file surgery on copies of good
checkpoints); loaded by every rank of a load layout, which must all refuse them the same way:

=====================  =======================================================  ==========================
kind                   checkpoint                                               expected
=====================  =======================================================  ==========================
``fewer_experts``      one-vector, E/2 experts                                  mismatch: key, both shapes
``more_experts``       N-quantizer, 2E experts                                  mismatch: extra key, shape
``shape``              one-vector, ffn/2                                        mismatch: key, both shapes
``format``             FP8 checkpoint into an NVFP4 target                      mismatch: key, both shapes
``qlayout``            N-quantizer checkpoint into a one-vector target          mismatch: missing key
``truncated_data``     data files cut to half                                   corrupt
``truncated_metadata`` ``.metadata`` cut to half                                corrupt
``garbled_metadata``   ``.metadata`` replaced by bytes                          corrupt
``unsafe_metadata``    ``.metadata`` a pickle that would call ``builtins.print``  unsafe (never called)
``bytes_entry``        an amax stored as a pickled object                       unsafe (never unpickled)
``missing_dir``        no such directory                                        corrupt
=====================  =======================================================  ==========================
"""

from __future__ import annotations

import os
import pickle
import shutil
from dataclasses import dataclass, replace
from typing import Any, Optional

from .jobs import CkptTask
from .model import MoEConfig
from .oracle import build_truth, truth_entries
from .quant import buffer_shape
from .safe_io import save_full

FP8 = "fp8_e4m3/per_expert"
INT8 = "int8/per_channel"
NVFP4 = "nvfp4/static"
PREFIX = "decoder.experts.linear_fc1."


@dataclass(frozen=True)
class BadCase:
    """A checkpoint (``task.path``) and the target it is loaded into (the rest of ``task``)."""

    kind: str
    task: CkptTask
    error: str
    must_mention: tuple[str, ...]


class _CallsPrint:
    """Pickles to a call of ``builtins.print``: harmless, but code all the same."""

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (print, ("checkpoint metadata ran code",))


def _copy(src: str, dst: str) -> str:
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def _cut(path: str) -> None:
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _single(cfg: MoEConfig, seed: int, qlayout: str, qf_id: str, path: str, **overrides: Any) -> str:
    entries: dict[str, Any] = dict(truth_entries(build_truth(cfg, seed, (qf_id,)), qlayout, qf_id))
    entries.update(overrides)
    shutil.rmtree(path, ignore_errors=True)
    save_full(entries, path)
    return path


def _shape(*dims: int) -> str:
    return str(tuple(dims))


def make_bad_cases(workdir: str, cfg: MoEConfig, seed: int, good: dict[tuple[str, str], str]) -> list[BadCase]:
    """Write every bad checkpoint under ``workdir``; ``good[(qlayout, qf_id)]`` are saved good ones.

    Cases that need a good checkpoint that is not there (its save failed) are left out.
    """
    os.makedirs(workdir, exist_ok=True)
    E, f, h = cfg.num_experts, cfg.ffn, cfg.hidden
    at = lambda name: os.path.join(workdir, name)  # noqa: E731
    cases = [
        BadCase(
            "fewer_experts",
            CkptTask("bad/fewer_experts", _single(replace(cfg, num_experts=E // 2), seed, "one_vector", FP8, at("fewer")), "one_vector", FP8, cfg=cfg),
            "CheckpointMismatchError",
            (f"'{PREFIX}weight'", _shape(E // 2, f, h), _shape(E, f, h)),
        ),
        BadCase(
            "more_experts",
            CkptTask("bad/more_experts", _single(replace(cfg, num_experts=2 * E), seed, "n_quantizer", FP8, at("more")), "n_quantizer", FP8, cfg=cfg),
            "CheckpointMismatchError",
            (f"'{PREFIX}weight{E}'", _shape(f, h), "not in the target layout"),
        ),
        BadCase(
            "shape",
            CkptTask("bad/shape", _single(replace(cfg, ffn=f // 2), seed, "one_vector", INT8, at("shape")), "one_vector", INT8, cfg=cfg),
            "CheckpointMismatchError",
            (f"'{PREFIX}weight'", _shape(E, f // 2, h), _shape(E, f, h)),
        ),
        BadCase(
            "bytes_entry",
            CkptTask("bad/bytes_entry", _single(cfg, seed, "one_vector", FP8, at("bytes"), **{f"{PREFIX}weight_quantizer._amax": "not a tensor"}),
                     "one_vector", FP8, cfg=cfg),
            "UnsafeCheckpointError",
            (f"'{PREFIX}weight_quantizer._amax'", "pickled object"),
        ),
        BadCase("missing_dir", CkptTask("bad/missing_dir", at("no-such-checkpoint"), "one_vector", FP8, cfg=cfg), "CheckpointCorruptError",
                ("not a directory",)),
    ]
    ov: Optional[str] = good.get(("one_vector", FP8))
    nq: Optional[str] = good.get(("n_quantizer", FP8))
    if ov:
        cases.append(
            BadCase("format", CkptTask("bad/format", ov, "one_vector", NVFP4, cfg=cfg), "CheckpointMismatchError",
                    (f"'{PREFIX}weight_quantizer._amax'", _shape(E), _shape(E, *buffer_shape(cfg, "fc1", "per_block"))))
        )
        cases += _corrupted(ov, workdir, cfg)
    if nq:
        cases.append(
            BadCase("qlayout", CkptTask("bad/qlayout", nq, "one_vector", FP8, cfg=cfg), "CheckpointMismatchError", (f"'{PREFIX}weight'", "missing"))
        )
    return cases


def flip_payload_bit(src: str, dst: str, needle: bytes) -> str:
    """Copy checkpoint ``src`` to ``dst`` and flip one bit inside the stored bytes ``needle``.

    DCP keeps no checksums and ``torch.load`` does not check the zip CRC, so this loads without
    an error: only comparing values (``oracle.content_verdict``) can notice it.
    """
    _copy(src, dst)
    for name in sorted(os.listdir(dst)):
        file = os.path.join(dst, name)
        if not name.endswith(".distcp"):
            continue
        with open(file, "r+b") as f:
            data = f.read()
            pos = data.find(needle)
            if pos >= 0:
                f.seek(pos + 1)
                f.write(bytes([data[pos + 1] ^ 0x40]))
                return dst
    raise ValueError(f"the {len(needle)} needle bytes are in no data file of {src}")


def _corrupted(good: str, workdir: str, cfg: MoEConfig) -> list[BadCase]:
    """Copies of ``good`` (one-vector FP8) with one file damaged each."""
    out = []
    data = _copy(good, os.path.join(workdir, "truncated_data"))
    for name in os.listdir(data):
        if name.endswith(".distcp"):
            _cut(os.path.join(data, name))
    out.append(BadCase("truncated_data", CkptTask("bad/truncated_data", data, "one_vector", FP8, cfg=cfg), "CheckpointCorruptError", ("unreadable",)))
    meta = _copy(good, os.path.join(workdir, "truncated_metadata"))
    _cut(os.path.join(meta, ".metadata"))
    out.append(BadCase("truncated_metadata", CkptTask("bad/truncated_metadata", meta, "one_vector", FP8, cfg=cfg), "CheckpointCorruptError",
                       (".metadata", "unreadable")))
    garbled = _copy(good, os.path.join(workdir, "garbled_metadata"))
    with open(os.path.join(garbled, ".metadata"), "wb") as fh:
        fh.write(bytes(range(256)) * 4)
    out.append(BadCase("garbled_metadata", CkptTask("bad/garbled_metadata", garbled, "one_vector", FP8, cfg=cfg), "CheckpointCorruptError",
                       (".metadata", "unreadable")))
    unsafe = _copy(good, os.path.join(workdir, "unsafe_metadata"))
    with open(os.path.join(unsafe, ".metadata"), "wb") as fh:
        pickle.dump(_CallsPrint(), fh)
    out.append(BadCase("unsafe_metadata", CkptTask("bad/unsafe_metadata", unsafe, "one_vector", FP8, cfg=cfg), "UnsafeCheckpointError", ("builtins.print",)))
    return out
