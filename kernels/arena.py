"""Pinned host memory for expert tables: a fresh pinned copy outside CUDA graph capture, a slice
of a per-device arena during capture (allocating pinned memory is not allowed while capturing)."""

from __future__ import annotations

import torch

ARENA_ELEMS = 1 << 16
"""int64 entries of pinned host memory per device from which tables built during a CUDA graph
capture take their host copy (allocating pinned memory is not allowed while capturing; 5 entries
per expert, so 13,107 experts' worth of tables captured per device)."""
_ARENAS: dict[torch.device, list] = {}


def pinned_copy(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``host`` in pinned memory: a fresh pinned tensor, or while a CUDA graph is being captured a
    never-reused slice of the device's arena (allocated on the first table built outside capture)."""
    if not torch.cuda.is_current_stream_capturing():
        if device not in _ARENAS:
            _ARENAS[device] = [torch.empty(ARENA_ELEMS, dtype=torch.int64, pin_memory=True), 0]
        return host.pin_memory()
    arena = _ARENAS.get(device)
    n = host.numel()
    if arena is None or arena[1] + n > arena[0].numel():
        raise RuntimeError("kernels: no pinned staging memory left for an expert table built during CUDA graph capture; "
                           "run the captured step once eagerly before capturing")  # fmt: skip
    out = arena[0][arena[1] : arena[1] + n].view(host.shape)
    arena[1] += n
    out.copy_(host)
    return out
