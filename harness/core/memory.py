"""Device memory: the per-check budget, peak measurement, out-of-memory detection and release.

Budget: a check may need at most ``BUDGET_FACTOR`` x the case's input + output bytes
(``CaseInputs.nbytes``: the bytes one fake quant of the case reads and writes), counted from before
the case's tensors were built.  At the Ultra case (N=32 x [5120, 8192] bf16: 2.68 GB in, 2.68 GB
out) that is 16.1 GB.  What a check holds at its peak, with the harness's own layout: the inputs
(1x), the output gradients (1x), the reference outputs shared by the backends (1x), the backend's
outputs (1x) and one more output-sized tensor in the invariants (separate vs stacked results), plus
per-expert temporaries (the reference and the comparisons work expert by expert, or in chunks of
experts: ``harness.backends.reference_backend.CHUNK_ELEMENTS``).

Out of memory (``torch.OutOfMemoryError``, or ``MemoryError`` on the host) is never a parity
verdict: the check's record gets ``outcome="oom"``, the message names the case, its bytes and the
memory free after releasing what the failed call held, and the run goes on with the next case.
"""

from __future__ import annotations

import gc
import traceback
from typing import Optional

import torch

from moe_fq_parity.cases.distributions import TORCH_DTYPES

BUDGET_FACTOR = 3
"""Peak memory of one check <= BUDGET_FACTOR x the case's input + output bytes."""

OOM_ERRORS: tuple[type[BaseException], ...] = tuple(
    {t for t in (getattr(torch, "OutOfMemoryError", None), getattr(torch.cuda, "OutOfMemoryError", None), MemoryError) if t is not None}
)
"""Exception types that mean "out of memory" (device or host)."""


class CheckOutOfMemory(Exception):
    """Raised out of a check when a backend call ran out of memory; the check's record becomes ``oom``.

    Carries the original error's one-line description only (never its traceback: that would keep
    the failed call's tensors alive).
    """

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(f"{where}: {detail}")
        self.where = where
        self.detail = detail


def case_bytes(case) -> int:
    """Input + output bytes of one fake quant of ``case`` (as ``CaseInputs.nbytes``, from the case alone)."""
    return 2 * case.numel * TORCH_DTYPES[case.dtype].itemsize


def is_oom(exc: Optional[BaseException]) -> bool:
    """True for an out-of-memory error (``OOM_ERRORS`` or ``CheckOutOfMemory``)."""
    return isinstance(exc, OOM_ERRORS + (CheckOutOfMemory,))


def forget(exc: BaseException) -> None:
    """Drop the frames of ``exc``'s traceback so the tensors they reference can be freed."""
    tb = exc.__traceback__
    if tb is not None:
        traceback.clear_frames(tb)
    exc.__traceback__ = None


def _cuda(device: Optional[torch.device]) -> Optional[torch.device]:
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return None
    return device if device.index is not None else torch.device("cuda", torch.cuda.current_device())


def allocated(device: Optional[torch.device]) -> Optional[int]:
    """Bytes allocated by PyTorch on ``device`` now (``None`` off CUDA)."""
    dev = _cuda(device)
    return torch.cuda.memory_allocated(dev) if dev is not None else None


def start_peak(device: Optional[torch.device]) -> None:
    """Start a peak measurement on ``device`` (resets ``max_memory_allocated``; no-op off CUDA)."""
    dev = _cuda(device)
    if dev is not None:
        torch.cuda.reset_peak_memory_stats(dev)


def peak_since(device: Optional[torch.device], base: Optional[int]) -> Optional[int]:
    """Peak bytes since ``start_peak`` above ``base`` (``memory_allocated`` taken earlier), or ``None``."""
    dev = _cuda(device)
    if dev is None or base is None:
        return None
    return max(0, torch.cuda.max_memory_allocated(dev) - base)


def release(device: Optional[torch.device] = None) -> None:
    """Collect garbage and return PyTorch's cached device blocks to the driver (after an out-of-memory
    error: everything that can be freed is)."""
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()


def allocated_here() -> int:
    """Bytes PyTorch has allocated on the current CUDA device (0 before CUDA is initialised)."""
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return 0
    return torch.cuda.memory_allocated(torch.cuda.current_device())


TIDY_SLACK_BYTES = 1 << 30
"""``tidy`` tolerates this much unexplained allocation, and this much unused cache, per device."""


def tidy(keep_bytes: Optional[int] = None) -> None:
    """The cheap release between tests on the current CUDA device (no-op before CUDA is initialised).

    A full garbage collection in a pytest process that collected the test tree costs more than most
    GPU tests (docs/measured.md §13); so it runs only when more than
    ``keep_bytes + TIDY_SLACK_BYTES`` is still allocated (something outlived its test, e.g. held by
    a reference cycle), or when ``keep_bytes`` is ``None``.  PyTorch's cache is emptied only when it
    holds more than ``TIDY_SLACK_BYTES`` unused (so the next process leasing the GPU finds it free,
    and consecutive tests of one case do not pay ``cudaMalloc`` again for small buffers).
    """
    if not (torch.cuda.is_available() and torch.cuda.is_initialized()):
        return
    dev = torch.cuda.current_device()
    if keep_bytes is None or torch.cuda.memory_allocated(dev) > keep_bytes + TIDY_SLACK_BYTES:
        gc.collect()
    if torch.cuda.memory_reserved(dev) - torch.cuda.memory_allocated(dev) > TIDY_SLACK_BYTES:
        torch.cuda.empty_cache()


def free_text(device: Optional[torch.device]) -> str:
    """``"X GiB free of Y GiB on cuda:0"`` (``torch.cuda.mem_get_info``) or the host's case."""
    dev = _cuda(device)
    if dev is None:
        return f"on {device or 'cpu'} (free host memory not measured)"
    free, total = torch.cuda.mem_get_info(dev)
    held = torch.cuda.memory_allocated(dev)
    return f"{free / 2**30:.2f} GiB free of {total / 2**30:.2f} GiB on {dev} ({held / 2**30:.2f} GiB still allocated by this process)"


def oom_message(case_id: str, case_bytes: int, device: Optional[torch.device], where: str, detail: str) -> str:
    """The message of an out-of-memory record; call after ``release`` so "free" is what the next case gets."""
    first = detail.strip().splitlines()[0] if detail.strip() else "out of memory"
    return (f"out of memory in {where} (not a parity verdict) for case {case_id} "
            f"({case_bytes / 1e9:.2f} GB = {case_bytes} bytes input + output); after releasing: {free_text(device)}; {first[:400]}")


def budget_text(peak_bytes: Optional[int], case_bytes: int) -> str:
    """``"peak 12.31 GB = 2.29x the case's 5.37 GB"`` (empty when not measured)."""
    if peak_bytes is None:
        return ""
    ratio = f" = {peak_bytes / case_bytes:.2f}x the case's {case_bytes / 1e9:.2f} GB" if case_bytes else ""
    return f"peak {peak_bytes / 1e9:.2f} GB{ratio}"
