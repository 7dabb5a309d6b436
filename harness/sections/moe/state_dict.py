"""State-dict layout normalization for grouped expert layers (weights, biases, quantizer state).

Layouts of N experts' tensors under one module ``prefix``:

* **indexed** -- ``{prefix}weight0 .. weight{N-1}`` each ``[out, in]`` (``bias{i}``: ``[out]``):
  Transformer Engine ``GroupedLinear``'s default parameters;
* **grouped** -- one ``{prefix}weight`` ``[N, out, in]`` (``bias``: ``[N, out]``), or *packed*
  ``[N*out, in]`` (``bias``: ``[N*out]``), TE's ``single_grouped_weight`` storage;
* **N-quantizer** -- ``{prefix}weight_quantizer_{i}._amax`` (naming ``suffix``: the upstream
  per-expert modules' own keys, ``UPSTREAM_KEYS``) or ``{prefix}weight_quantizer.{i}._amax``
  (naming ``list``: the internal module tree, a ``ModuleList``-like ``ExpertQuantizer``, and
  Model-Optimizer 0.47's ``GroupedQuantizer``), each ``()`` per tensor or ``[out]`` per channel;
* **one-vector** -- one ``{prefix}weight_quantizer._amax`` ``[N]`` / ``[N, out]`` (form ``flat``)
  or ``[N, 1, 1]`` / ``[N, out, 1]`` (form ``broadcast``: broadcasts over ``[N, out, in]``).

Every conversion mutates the dict **in place** (as a load pre-hook must) and returns an *action*,
modelled on Megatron's ``TEGroupedLinear._normalize_grouped_parameter_keys``:

* ``target_present`` -- the target layout's key(s) already exist: nothing is touched;
* ``absent``         -- neither layout is in the dict (e.g. ``bias`` of a bias-free layer);
* ``incomplete``     -- only some of the N indexed keys exist: nothing is touched (the load then
  reports the missing keys itself);
* ``converted``      -- keys rewritten; ``reshaped`` -- a one-vector amax re-formed flat <-> broadcast;
* ``ambiguous``      -- (flat optimizer dicts only) a key suffix matches more than one key.

Splitting a grouped tensor (``split_grouped_tensor``): ``shape[0] == N`` -> unbind along dim 0;
else ``shape[0] % N == 0`` -> N equal chunks along dim 0 (packed); else ``ValueError`` naming the
key, its shape and N.  Stacking never changes a bit: ``stack``/``cat`` copy, ``unbind``/``chunk``
are views, so indexed -> grouped -> indexed is the identity on every tensor's bits.
Files are loaded with ``torch.load(..., weights_only=True)`` only (``load_checkpoint``).
"""

from __future__ import annotations

import os
import re
from typing import MutableMapping

import torch

ACTIONS = ("converted", "reshaped", "target_present", "absent", "incomplete", "ambiguous")
NAMINGS = ("list", "suffix")

UPSTREAM_KEYS: tuple[tuple[str, str, str], ...] = (
    ("{prefix}weight{i}", "{prefix}weight{i}", "expert i's weight [out, in] (TE GroupedLinear, Megatron TEGroupedLinear)"),
    ("{prefix}bias{i}", "{prefix}bias{i}", "expert i's bias [out]; absent when the layer has no bias"),
    ("{prefix}weight", "{prefix}weight", "single grouped weight [N, out, in] (TE single_grouped_weight)"),
    ("{prefix}weight_quantizer_{i}._amax", "{prefix}weight_quantizer.{i}._amax", "expert i's weight amax, () or [out]"),
    ("{prefix}weight_quantizer_{i}._global_amax", "{prefix}weight_quantizer.{i}._global_amax", "expert i's NVFP4 global amax ()"),
    ("{prefix}input_quantizer_{i}._amax", "{prefix}input_quantizer.{i}._amax", "expert i's input amax () (per-expert input layouts)"),
)
"""The one mapping between upstream checkpoint keys and internal module paths: ``(upstream,
internal, what)``.  Parameters keep their upstream names; per-expert quantizers are upstream
sibling modules ``weight_quantizer_{i}`` and internally children ``{i}`` of one
``ExpertQuantizer`` named ``weight_quantizer`` (``to_upstream_keys`` / ``to_internal_keys``
rename every buffer of such a quantizer, not only ``_amax``).  State dicts are written with the
upstream keys and read with either."""
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


def remapped_params(module: object) -> tuple[str, ...]:
    """Parameters the grouped-key normalisation touches: ``weight``, and ``bias`` only when the
    module uses a bias (``use_bias``).  A bias-free module leaves any ``bias`` / ``bias{i}`` keys of
    a checkpoint alone, so the load reports them as unexpected instead of inventing entries."""
    return ("weight", "bias") if getattr(module, "use_bias", False) else ("weight",)


def flat_split_blocked(indexed_found: dict[int, str], n: int) -> bool:
    """Optimizer-side early return of a split: *any* indexed key present blocks it (upstream rule)."""
    return bool(indexed_found)


def _ends_with(key: str, suffix: str) -> bool:
    return key == suffix or key.endswith("." + suffix)


def normalize_flat_grouped_params(flat: StateDict, root: "torch.nn.Module") -> dict[str, str]:
    """Optimizer-side normalisation of a *flat* parameter dict (main params loaded from a
    checkpoint by name) to the grouped/indexed layout of every grouped module under ``root``.

    Modelled on Megatron's ``DistributedOptimizer._normalize_state_dict_for_grouped_params`` (the
    model's load pre-hook does not run on that path).  Keys may carry wrapper prefixes: a module
    named ``module.decoder.experts.linear_fc1`` (leading ``module.`` stripped) matches any key
    ending in ``decoder.experts.linear_fc1.weight`` at a ``.`` boundary (upstream matches by bare
    suffix; the two agree unless one module path is a suffix of another's).  Per parameter of
    ``remapped_params(module)``:

    * single-grouped module: stack only when no grouped key and all N indexed keys (each matched
      exactly once) are present; the grouped key keeps the indexed keys' wrapper prefix;
    * indexed module: split (``split_grouped_tensor``) only when exactly one grouped key and *no*
      indexed key are present (``flat_split_blocked``).

    Returns ``{"{module}/{param}": action}`` with the ``ACTIONS`` vocabulary, in place on ``flat``.
    """
    actions: dict[str, str] = {}
    for name, module in root.named_modules():
        if not hasattr(module, "num_gemms") or not hasattr(module, "single_grouped_weight"):
            continue
        clean = name
        while clean.startswith("module."):
            clean = clean[len("module."):]
        n = module.num_gemms
        for param in remapped_params(module):
            grouped_suffix = f"{clean}.{param}" if clean else param
            indexed_suffixes = [f"{grouped_suffix}{i}" for i in range(n)]
            grouped = [k for k in flat if _ends_with(k, grouped_suffix)]
            found: dict[int, str] = {}
            for i, suffix in enumerate(indexed_suffixes):
                matches = [k for k in flat if _ends_with(k, suffix)]
                if len(matches) == 1:
                    found[i] = matches[0]
            tag = f"{clean}/{param}"
            if module.single_grouped_weight:
                if grouped:
                    actions[tag] = "target_present"
                    continue
                if len(found) != n:
                    actions[tag] = "incomplete" if found else "absent"
                    continue
                keys = [found[i] for i in range(n)]
                parts = [flat[k] for k in keys]
                _check_same(keys, parts)
                head = keys[0][: len(keys[0]) - len(indexed_suffixes[0])]
                for k in keys:
                    del flat[k]
                flat[head + grouped_suffix] = torch.stack(parts, dim=0)
                actions[tag] = "converted"
            else:
                if flat_split_blocked(found, n):
                    actions[tag] = "target_present"
                    continue
                if len(grouped) != 1:
                    actions[tag] = "absent" if not grouped else "ambiguous"
                    continue
                key = grouped[0]
                pieces = split_grouped_tensor(key, flat[key], n)
                head = key[: len(key) - len(grouped_suffix)]
                del flat[key]
                for suffix, piece in zip(indexed_suffixes, pieces):
                    flat[head + suffix] = piece
                actions[tag] = "converted"
    return actions


def n_quantizer_keys(prefix: str, n: int, *, quantizer: str = "weight_quantizer", naming: str = "suffix", buffer: str = "_amax") -> list[str]:
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
    naming: str = "suffix", form: str = "flat", buffer: str = "_amax",
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
    naming: str = "suffix", buffer: str = "_amax",
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


def _rename_expert_quantizer_keys(sd: StateDict, prefix: str, n: int, quantizer: str, src: str, dst: str) -> int:
    pattern = re.compile(re.escape(prefix + quantizer) + (r"\.(\d+)\." if src == "list" else r"_(\d+)\.") + r"(.+)$")
    sep = "." if dst == "list" else "_"
    renames = []
    for k in sd:
        m = pattern.match(k)
        if m and int(m.group(1)) < n:
            renames.append((k, f"{prefix}{quantizer}{sep}{m.group(1)}.{m.group(2)}"))
    clash = [new for _, new in renames if new in sd]
    if clash:
        raise ValueError(f"cannot rename {quantizer} keys: {clash[:3]} already present (both namings in one state dict)")
    for old, new in renames:
        sd[new] = sd.pop(old)
    return len(renames)


def to_upstream_keys(sd: StateDict, prefix: str, n: int, *, quantizer: str = "weight_quantizer") -> int:
    """``{prefix}{quantizer}.{i}.{buf}`` -> ``{prefix}{quantizer}_{i}.{buf}`` for ``i < n`` (``UPSTREAM_KEYS``),
    in place; returns the number of keys renamed.  ``ValueError`` when a target key exists already."""
    return _rename_expert_quantizer_keys(sd, prefix, n, quantizer, "list", "suffix")


def to_internal_keys(sd: StateDict, prefix: str, n: int, *, quantizer: str = "weight_quantizer") -> int:
    """Inverse of ``to_upstream_keys``."""
    return _rename_expert_quantizer_keys(sd, prefix, n, quantizer, "suffix", "list")


def save_checkpoint(sd: StateDict, path: str | os.PathLike) -> None:
    """``torch.save`` of a plain dict of tensors."""
    torch.save(dict(sd), path)


def load_checkpoint(path: str | os.PathLike, map_location: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """``torch.load(path, weights_only=True)``: tensors and plain containers only, never pickled code."""
    return torch.load(path, map_location=map_location, weights_only=True)
