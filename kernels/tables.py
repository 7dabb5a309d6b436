"""Expert tables of the list layout: build, cache, key, await, and the outputs they describe.

N tensors anywhere in memory: their addresses, output offsets and shapes go into one int64 table
``meta[7, N]`` (see ``ExpertTable``) that the kernel reads per program.  Outputs are views into one
buffer (one allocation), each expert starting on a 64-element boundary so the kernel may use
16-byte vector accesses.

Host cost.  Tables are cached (``table_for``): a call whose experts have the same addresses,
shapes, contiguity and dtypes (and device) as an earlier validated call reuses its table, its
tile, grid and launch arguments (``ExpertTable.plans``), without per-expert validation or any
host-to-device copy.  A table depends only on that key (never on values), so a reused table cannot
be stale: new addresses, shapes or dtypes are a new key.  Measured host time per call is in
``docs/kernels_performance.md``.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .arena import pinned_copy
from .geometry import expert_matrix_shape, flat_shapes, flat_width

FLAT_CAP = 2048
"""Widest flat view (``geometry.flat_width``): the widest tile the kernel configurations use."""

_PAD_ELEMS = 64  # every expert's output starts on a 64-element boundary: >= 128 bytes for any dtype


@dataclass(frozen=True)
class ExpertTable:
    """What a list-layout launch needs that depends only on the experts' addresses and shapes.

    ``meta`` (int64 ``[7, N]`` on the device): input offset (elements from ``xs[base]``), output
    offset (from the output buffer), rows, cols, gradient offset (from ``grads[base]``), and rows and
    cols of the flat view ``[rows * cols / flat, flat]`` (``geometry.flat_width``; ``flat`` 0: none).  Output
    offsets follow from the shapes alone, so the table stays valid for any output buffer from
    ``alloc_outputs``.  ``base``: the first non-empty expert (an empty tensor's address may be 0);
    ``xvec``/``gvec``: elements per 16-byte vector the kernel may assume (1: no alignment assumed).
    ``rows``: the common row count (``None`` if ragged); ``plans``: launch geometry and arguments
    per kernel/format/check mode, filled on first use.
    """

    meta: torch.Tensor
    shapes: tuple[tuple[int, int], ...]
    out_shapes: tuple[torch.Size, ...]
    offsets: tuple[int, ...]
    total: int
    base: int
    xvec: int
    gvec: int
    key: tuple
    device: torch.device = torch.device("cpu")
    rows: int | None = None
    stacked: tuple[int, ...] | None = None
    split_sizes: tuple[int, ...] = ()
    host: torch.Tensor | None = None
    flat: int = 0
    plans: dict = field(default_factory=dict, compare=False, repr=False)
    ready: list = field(default_factory=list, compare=False, repr=False)
    """``[event, raw stream]`` while the copy of ``meta`` may still be queued on the stream that
    built the table (``await_table``); emptied once the event has completed."""


_data_ptr = torch.Tensor.data_ptr
_is_contiguous = torch.Tensor.is_contiguous
_is_neg = torch.Tensor.is_neg
_shape = operator.attrgetter("shape")
_dtype = operator.attrgetter("dtype")


def table_key(xs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None = None) -> tuple:
    """Identity of a table: ``(addresses, rest)``: per expert the address, and in ``rest`` the
    shape, contiguity, negative bit and dtype, plus the device of the first (device addresses are
    unique across devices under CUDA's unified addressing); the same for the gradients.  Contiguity
    and shape fix the strides; the negative bit is there because a negated view shares its base's
    address (a cached table would read the base's values: it must miss, and validation rejects it).
    C-level reads only; the cache hashes the addresses and compares ``rest``."""
    ptrs = tuple(map(_data_ptr, xs))
    rest = (tuple(map(_shape, xs)), tuple(map(_is_contiguous, xs)), tuple(map(_is_neg, xs)), tuple(map(_dtype, xs)), xs[0].device)
    if grads is not None:
        ptrs += tuple(map(_data_ptr, grads))
        rest += (tuple(map(_shape, grads)), tuple(map(_is_contiguous, grads)), tuple(map(_is_neg, grads)), tuple(map(_dtype, grads)))
    return ptrs, rest


CACHE_SIZE = 64
"""Tables kept (oldest first out); tables a CUDA graph captured are kept for good."""
_TABLES: dict[tuple, ExpertTable] = {}
_CAPTURED: dict[int, ExpertTable] = {}


def table_for(xs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None = None, *, validate: Callable[[], None]) -> ExpertTable:
    """The cached table of ``xs`` (and ``grads``), or ``validate()`` then build and cache one.

    ``validate`` raises for input the kernel does not take; it runs only when the key is new (or
    cannot be computed, e.g. a non-tensor in the list), so a cached table implies validated input.
    A table used while a CUDA graph is being captured is never freed (the graph reads its device
    table on every replay); one built during a capture is not cached for eager calls (its device
    copy happens when the graph runs).  Launches order the current stream after the table's copy
    to the device (``await_table``), so a table built on one stream serves launches on any other.
    """
    try:
        key = table_key(xs, grads)
        table = _TABLES.get(key[0])
        if table is not None and table.key[1] != key[1]:
            table = None
    except (AttributeError, TypeError, RuntimeError, IndexError):
        key, table = None, None
    capturing = table is not None and table.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
    if table is None:
        validate()
        key = table_key(xs, grads)
        table = expert_table(xs, grads, key=key)
        capturing = table.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        if not capturing:  # a table built in a capture holds its values only once the graph has run
            _TABLES.pop(key[0], None)
            _TABLES[key[0]] = table
            if len(_TABLES) > CACHE_SIZE:
                del _TABLES[next(iter(_TABLES))]
    if capturing and id(table) not in _CAPTURED:
        _CAPTURED[id(table)] = table
    return table


def clear_table_cache() -> None:
    """Forget cached tables (not those captured by CUDA graphs)."""
    _TABLES.clear()


def _vec_of(ptrs: Sequence[int], shapes: Sequence[tuple[int, int]], esize: int) -> int:
    """Elements per 16 bytes when every non-empty expert starts 16-byte aligned and its row length is
    a multiple of that (the kernel may then use 16-byte vector accesses), else 1."""
    vec = 16 // esize
    ok = all(p % 16 == 0 and c % vec == 0 for p, (r, c) in zip(ptrs, shapes) if r and c)
    return vec if ok else 1


def _offsets_from(ptrs: Sequence[int], base: int, esize: int) -> list[int]:
    """Element offsets of each address from ``ptrs[base]`` (same dtype: exact division)."""
    b = ptrs[base]
    assert all((p - b) % esize == 0 for p in ptrs), "expert data not aligned to its dtype"
    return [(p - b) // esize for p in ptrs]


def expert_table(xs: Sequence[torch.Tensor], grads: Sequence[torch.Tensor] | None = None, *, key: tuple | None = None) -> ExpertTable:
    """Build the table for validated experts ``xs`` (and, for the backward, their gradients): one
    pinned host tensor and one asynchronous copy to the device (the host tensor stays referenced
    by the table, so a copy captured in a CUDA graph always reads the right bytes)."""
    key = table_key(xs, grads) if key is None else key
    ptrs, shape_list = key[0][: len(xs)], key[1][0]
    shapes = tuple(expert_matrix_shape(w) for w in xs)
    offsets, total = [], 0
    for r, c in shapes:
        offsets.append(total)
        total += -(-(r * c) // _PAD_ELEMS) * _PAD_ELEMS
    base = next((i for i, (r, c) in enumerate(shapes) if r and c), 0)
    esize = xs[0].element_size()
    xo = _offsets_from(ptrs, base, esize)
    if grads is not None:
        gptrs = [g.data_ptr() for g in grads]
        go = _offsets_from(gptrs, base, grads[0].element_size())
        gvec = _vec_of(gptrs, shapes, grads[0].element_size())
    else:
        go = [0] * len(xs)
    device = xs[0].device
    flat = flat_width(shapes, FLAT_CAP)
    fshapes = flat_shapes(shapes, flat) if flat else shapes
    host = torch.tensor([xo, offsets, [r for r, _ in shapes], [c for _, c in shapes], go, [r for r, _ in fshapes], [c for _, c in fshapes]],
                        dtype=torch.int64)  # fmt: skip
    if device.type == "cuda":
        host = pinned_copy(host, device)
    meta = host.to(device, non_blocking=True)
    ready = []
    if device.type == "cuda" and not torch.cuda.is_current_stream_capturing():
        event = torch.cuda.Event()
        event.record()
        ready = [event, torch._C._cuda_getCurrentRawStream(device.index)]
    xvec = _vec_of(ptrs, shapes, esize)
    if grads is None:
        gvec = xvec
    out_shapes = tuple(shape_list)
    n, first = len(shapes), out_shapes[0] if shapes else torch.Size()
    rows = shapes[0][0] if shapes and all(r == shapes[0][0] for r, _ in shapes) else None
    stacked = None
    if n and all(s == first for s in out_shapes) and offsets[-1] == (n - 1) * first.numel() and first.numel():
        stacked = (n, *first)
    sizes: list[int] = []
    prev = 0
    for off, (r, c) in zip(offsets, shapes):
        sizes += [off - prev, r * c]
        prev = off + r * c
    sizes.append(max(total, 1) - prev)
    return ExpertTable(meta, shapes, out_shapes, tuple(offsets), total, base, xvec, gvec, key, device, rows, stacked, tuple(sizes),
                       host if device.type == "cuda" else None, flat=flat,
                       ready=ready)  # fmt: skip


def await_table(table: ExpertTable) -> None:
    """Order the current stream after the copy of ``table.meta``.

    The copy was queued on the stream current when the table was built; a launch on that stream
    follows it in stream order, one on another stream (a side stream) waits for its event, until
    the event is seen completed (then nothing is left to do, for any stream).  While a CUDA graph
    is captured nothing is queried or waited for (not allowed there): ``torch.cuda.graph``
    synchronizes the device before it starts capturing.  Host cost: an event query per call until
    the copy has landed (the first call or two), nothing after."""
    if not table.ready or torch.cuda.is_current_stream_capturing():
        return
    event, stream = table.ready
    if event.query():
        table.ready.clear()
    elif torch._C._cuda_getCurrentRawStream(table.device.index) != stream:
        torch.cuda.current_stream(table.device).wait_event(event)


def alloc_outputs(table: ExpertTable, dtype: torch.dtype, device: torch.device) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """One flat buffer plus the per-expert contiguous views the kernel writes (``table.offsets``).

    Equal shapes whose size is a multiple of the padding (the usual grouped layer) take one
    ``[N, ...]`` allocation and ``unbind``: a single call instead of 2N view constructions.
    """
    if table.stacked is not None:
        stacked = torch.empty(table.stacked, dtype=dtype, device=device)
        return stacked.view(-1), list(stacked.unbind(0))
    flat = torch.empty(max(table.total, 1), dtype=dtype, device=device)
    chunks = flat.split(table.split_sizes)
    return flat, [chunks[2 * i + 1].view(s) for i, s in enumerate(table.out_shapes)]
