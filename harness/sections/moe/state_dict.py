"""State-dict layout normalization for grouped expert layers (weights, biases, quantizer state).

Layouts of N experts' tensors under one module ``prefix``:

* **indexed** -- ``{prefix}weight0 .. weight{N-1}`` each ``[out, in]`` (``bias{i}``: ``[out]``):
  Transformer Engine ``GroupedLinear``'s default parameters;
* **grouped** -- one ``{prefix}weight`` ``[N, out, in]`` (``bias``: ``[N, out]``), or *packed*
  ``[N*out, in]`` (``bias``: ``[N*out]``), TE's ``single_grouped_weight`` storage;
* **N-quantizer** -- ``{prefix}weight_quantizer.{i}._amax`` (naming ``list``) or
  ``{prefix}weight_quantizer_{i}._amax`` (naming ``suffix``), each ``()`` per tensor or ``[out]``
  per channel;
* **one-vector** -- one ``{prefix}weight_quantizer._amax`` ``[N]`` / ``[N, out]`` (form ``flat``)
  or ``[N, 1, 1]`` / ``[N, out, 1]`` (form ``broadcast``: broadcasts over ``[N, out, in]``).

Every conversion mutates the dict **in place** (as a load pre-hook must) and returns an *action*,
modelled on Megatron's ``TEGroupedLinear._normalize_grouped_parameter_keys``:

* ``target_present`` -- the target layout's key(s) already exist: nothing is touched;
* ``absent``         -- neither layout is in the dict (e.g. ``bias`` of a bias-free layer);
* ``incomplete``     -- only some of the N indexed keys exist: nothing is touched (the load then
  reports the missing keys itself);
* ``converted``      -- keys rewritten; ``reshaped`` -- a one-vector amax re-formed flat <-> broadcast.

Splitting a grouped tensor (``split_grouped_tensor``): ``shape[0] == N`` -> unbind along dim 0;
else ``shape[0] % N == 0`` -> N equal chunks along dim 0 (packed); else ``ValueError`` naming the
key, its shape and N.  Stacking never changes a bit: ``stack``/``cat`` copy, ``unbind``/``chunk``
are views, so indexed -> grouped -> indexed is the identity on every tensor's bits.
Files are loaded with ``torch.load(..., weights_only=True)`` only (``load_checkpoint``).
"""

from __future__ import annotations

import os
from typing import MutableMapping

import torch

ACTIONS = ("converted", "reshaped", "target_present", "absent", "incomplete")
NAMINGS = ("list", "suffix")
VECTOR_FORMS = ("flat", "broadcast")

StateDict = MutableMapping[str, torch.Tensor]


def indexed_keys(prefix: str, param: str, n: int) -> list[str]:
    """``[f"{prefix}{param}{i}" for i in range(n)]``."""
    return [f"{prefix}{param}{i}" for i in range(n)]


def split_grouped_tensor(key: str, t: torch.Tensor, n: int) -> list[torch.Tensor]:
    """Split a grouped tensor into N expert tensors (unbind if ``shape[0] == n``, else chunk).

    Raises ``ValueError`` naming ``key``, the shape and ``n`` when neither rule applies.
    """
    if n < 1:
        raise ValueError(f"number of experts must be >= 1, got {n}")
    if t.dim() == 0:
        raise ValueError(f"Cannot split checkpoint tensor {key!r}: it is a scalar, not {n} experts")
    if t.shape[0] == n:
        return list(t.unbind(0))
    if t.shape[0] % n == 0:
        return list(t.chunk(n, dim=0))
    raise ValueError(
        f"Cannot split checkpoint tensor {key!r} of shape {tuple(t.shape)} into {n} experts: "
        f"dim 0 ({t.shape[0]}) is neither {n} nor a multiple of {n}"
    )


def _check_same(keys: list[str], tensors: list[torch.Tensor]) -> None:
    first = tensors[0]
    for k, t in zip(keys, tensors):
        if t.shape != first.shape or t.dtype != first.dtype:
            raise ValueError(
                f"cannot stack {keys[0]!r} ({first.dtype}{tuple(first.shape)}) with {k!r} ({t.dtype}{tuple(t.shape)})"
            )


def _indexed_status(sd: StateDict, keys: list[str]) -> str | None:
    """``absent`` (none of ``keys``), ``incomplete`` (some), ``None`` (all present)."""
    present = [k in sd for k in keys]
    if not any(present):
        return "absent"
    return None if all(present) else "incomplete"


def indexed_to_grouped(sd: StateDict, prefix: str, param: str, n: int, *, packed: bool = False) -> str:
    """``{prefix}{param}{i}`` (N keys) -> ``{prefix}{param}``: stacked ``[N, ...]`` or packed ``[N*d0, ...]``."""
    target = prefix + param
    keys = indexed_keys(prefix, param, n)
    if target in sd:
        return "target_present"
    status = _indexed_status(sd, keys)
    if status:
        return status
    parts = [sd[k] for k in keys]
    _check_same(keys, parts)
    sd[target] = torch.cat(parts, dim=0) if packed else torch.stack(parts, dim=0)
    for k in keys:
        del sd[k]
    return "converted"


def grouped_to_indexed(sd: StateDict, prefix: str, param: str, n: int) -> str:
    """``{prefix}{param}`` -> ``{prefix}{param}{i}`` (see ``split_grouped_tensor``)."""
    source = prefix + param
    keys = indexed_keys(prefix, param, n)
    if any(k in sd for k in keys):
        return "target_present"
    if source not in sd:
        return "absent"
    pieces = split_grouped_tensor(source, sd[source], n)
    del sd[source]
    for k, p in zip(keys, pieces):
        sd[k] = p
    return "converted"


def n_quantizer_keys(prefix: str, n: int, *, quantizer: str = "weight_quantizer", naming: str = "list", buffer: str = "_amax") -> list[str]:
    """``{prefix}{quantizer}.{i}.{buffer}`` (``list``) or ``{prefix}{quantizer}_{i}.{buffer}`` (``suffix``)."""
    if naming not in NAMINGS:
        raise ValueError(f"naming must be one of {NAMINGS}, got {naming!r}")
    sep = "." if naming == "list" else "_"
    return [f"{prefix}{quantizer}{sep}{i}.{buffer}" for i in range(n)]


def vector_key(prefix: str, *, quantizer: str = "weight_quantizer", buffer: str = "_amax") -> str:
    return f"{prefix}{quantizer}.{buffer}"


def _vector_shape(n: int, piece_shape: tuple[int, ...], form: str) -> tuple[int, ...]:
    if form not in VECTOR_FORMS:
        raise ValueError(f"form must be one of {VECTOR_FORMS}, got {form!r}")
    shape = (n,) + tuple(piece_shape)
    return shape + (1,) * (3 - len(shape)) if form == "broadcast" else shape


def n_to_vector(
    sd: StateDict, prefix: str, n: int, *, piece_ndim: int = 0, quantizer: str = "weight_quantizer",
    naming: str = "list", form: str = "flat", buffer: str = "_amax",
) -> str:
    """N per-expert amax (each ``piece_ndim``-dim) -> one vector amax of ``form``.

    When the vector key exists already it is re-formed to ``form`` if its shape differs only in
    trailing singleton dims (action ``reshaped``); otherwise ``target_present``.
    """
    target = vector_key(prefix, quantizer=quantizer, buffer=buffer)
    keys = n_quantizer_keys(prefix, n, quantizer=quantizer, naming=naming, buffer=buffer)
    if target in sd:
        v = sd[target]
        if v.dim() == 0 or v.shape[0] != n:
            return "target_present"
        piece = _squeeze_piece(target, v[0], piece_ndim)
        want = _vector_shape(n, tuple(piece.shape), form)
        if tuple(v.shape) == want:
            return "target_present"
        sd[target] = v.reshape(want)
        return "reshaped"
    status = _indexed_status(sd, keys)
    if status:
        return status
    parts = [_squeeze_piece(k, sd[k], piece_ndim) for k in keys]
    _check_same(keys, parts)
    sd[target] = torch.stack(parts, dim=0).reshape(_vector_shape(n, tuple(parts[0].shape), form))
    for k in keys:
        del sd[k]
    return "converted"


def _squeeze_piece(key: str, t: torch.Tensor, piece_ndim: int) -> torch.Tensor:
    """Drop trailing singleton dims down to ``piece_ndim`` dims; ``ValueError`` if impossible."""
    while t.dim() > piece_ndim and t.shape[-1] == 1:
        t = t.squeeze(-1)
    if t.dim() != piece_ndim:
        raise ValueError(f"{key!r}: per-expert amax of shape {tuple(t.shape)} is not {piece_ndim}-dimensional")
    return t


def vector_to_n(
    sd: StateDict, prefix: str, n: int, *, piece_ndim: int = 0, quantizer: str = "weight_quantizer",
    naming: str = "list", buffer: str = "_amax",
) -> str:
    """One vector amax ``[N, ...]`` -> N per-expert amax of ``piece_ndim`` dims.

    A scalar vector key is a *shared* amax (pre-0.47 Model-Optimizer grouped checkpoint) and
    cannot give per-expert amax: ``ValueError``.  ``shape[0] != N`` is a ``ValueError`` too
    (chunking a packed amax is not a layout any writer produces).
    """
    source = vector_key(prefix, quantizer=quantizer, buffer=buffer)
    keys = n_quantizer_keys(prefix, n, quantizer=quantizer, naming=naming, buffer=buffer)
    if any(k in sd for k in keys):
        return "target_present"
    if source not in sd:
        return "absent"
    v = sd[source]
    if v.dim() == 0 or v.shape[0] != n:
        raise ValueError(
            f"Cannot split quantizer state {source!r} of shape {tuple(v.shape)} into {n} per-expert amax"
            + (" (a scalar is a shared amax: a pre-0.47 grouped checkpoint)" if v.dim() == 0 else "")
        )
    pieces = [_squeeze_piece(source, p, piece_ndim) for p in v.unbind(0)]
    del sd[source]
    for k, p in zip(keys, pieces):
        sd[k] = p
    return "converted"


def save_checkpoint(sd: StateDict, path: str | os.PathLike) -> None:
    """``torch.save`` of a plain dict of tensors."""
    torch.save(dict(sd), path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never pickled code."""
    return torch.load(path, map_location=map_location, weights_only=True)
