"""Value checks of the forward kernel without a host sync: mapped host flags, deferred errors.

The forward kernel, when checking (``CHECK``), stores 1 into slots of an int32 flag buffer:

====  ==========================================================================================
slot  set when
====  ==========================================================================================
0     amax is NaN (any entry, empty experts included)
1     amax is +-inf
2     amax is negative
3     unsigned INT got a negative input element
4     INT4 group-wise got a NaN or inf input element
====  ==========================================================================================

and writes the canonical NaN where the bad value acts (every output of an expert or row whose
amax is bad, the negative element of an unsigned INT input, the 128-element group of an INT4
group-wise NaN or inf; an NVFP4 block holding a NaN is NaN as the reference's ``te`` gives it, not an error):
a checked call never returns finite numbers computed from bad input.

``check_values`` of the public calls:

* ``True`` (default): **no host sync and no extra device work**.  On a CUDA device the kernel
  stores its flags straight into a per-device *sticky* buffer in pinned host memory (mapped into
  the device's address space under CUDA's unified addressing), so a checked call adds no copy to
  the stream.  The error is raised as ``ValueError`` (the reference's message) by the first checked
  call on that device that finds a flag set (a flag is visible to the host once the kernel that
  stored it has run; any synchronisation the caller makes guarantees it), or by
  ``kernels.raise_pending_errors()`` (one sync).  Capturable in a CUDA graph (the buffer never
  moves; a replay that finds a bad value sets the same host flags).  Cost on valid input: the
  flag stores are predicated off, nothing crosses PCIe (measured against the earlier design, device
  flags plus a ``non_blocking`` copy to the host after each launch: ``docs/kernels_performance.md``
  section 3).  On CPU tensors (Triton's interpreter) there is nothing to wait for: the call raises itself.
* ``"sync"``: the call raises itself, after one device sync (not capturable): what a parity
  harness needs to compare rejections with the reference call by call.
* ``False``: no flags, no NaN poisoning; bad values give the results documented in
  ``kernels/fwd_kernel.py``.
"""

from __future__ import annotations

import torch

SLOTS = 5
AMAX_NAN, AMAX_INF, AMAX_NEG, UNSIGNED_NEG, INT4G_NONFINITE = range(SLOTS)
CHECK_MODES = (True, False, "sync")

_MESSAGES = (
    "amax is NaN; amax must be finite and >= 0",
    "amax is infinite; amax must be finite and >= 0",
    "amax is negative; amax must be finite and >= 0",
    "unsigned INT quantization got negative input values (Model-Optimizer rejects them too)",
    "int4_group fake quant got NaN or inf input: a non-finite block amax has no INT scale",
)


def check_mode(check_values) -> bool | str:
    """Validate ``check_values`` (``True``, ``False`` or ``"sync"``)."""
    if check_values is True or check_values is False or check_values == "sync":
        return check_values
    raise ValueError(f"check_values must be True (asynchronous), False or 'sync', got {check_values!r}")


def raise_flags(values, deferred: bool = False) -> None:
    """Raise ``ValueError`` for the first set slot (amax first, as the reference checks it first)."""
    for v, msg in zip(values, _MESSAGES):
        if v:
            if deferred:
                msg += (" (found by the device-side checks of an earlier checked kernel call on this device; "
                        "its outputs hold NaN where the input was bad)")  # fmt: skip
            raise ValueError(msg)


class _DeviceLog:
    """Sticky flags of one CUDA device: pinned host memory the kernels write directly."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flags = torch.zeros(SLOTS, dtype=torch.int32, pin_memory=True)
        self.view = self.flags.numpy()  # reads the flags without a torch op

    def pending(self) -> bool:
        return self.view.tobytes() != _CLEAR  # a 20-byte compare: ~10x cheaper than ndarray.any()

    def raise_and_reset(self) -> None:
        torch.cuda.synchronize(self.device)  # error path: every kernel that may still set a flag has run
        values = self.view.tolist()
        self.view[:] = 0
        raise_flags(values, deferred=True)


_CLEAR = bytes(4 * SLOTS)
_LOGS: dict[torch.device, _DeviceLog] = {}


def device_log(device: torch.device) -> _DeviceLog:
    log = _LOGS.get(device)
    if log is None:
        log = _LOGS[device] = _DeviceLog(device)
    return log


def flags_for(device: torch.device, mode: bool | str) -> torch.Tensor | None:
    """The flag buffer a launch writes: the sticky mapped host buffer of ``device`` (asynchronous
    CUDA checks, after raising any error an earlier call left), a fresh zeroed device buffer
    (``"sync"``, CPU) or ``None``."""
    if not mode:
        return None
    if mode is True and device.type == "cuda":
        log = device_log(device)
        if log.pending():
            log.raise_and_reset()
        return log.flags
    return torch.zeros(SLOTS, dtype=torch.int32, device=device)


def after_launch(flags: torch.Tensor, device: torch.device, mode: bool | str) -> None:
    """``"sync"`` and CPU launches: read the flags now and raise; asynchronous CUDA checks: nothing
    (the kernel wrote the host flags itself)."""
    if mode is not True or device.type != "cuda":
        raise_flags(flags.tolist())


def raise_pending_errors(device: torch.device | str | None = None, *, sync: bool = True) -> None:
    """Raise the ``ValueError`` an earlier asynchronously checked call found on ``device`` (all
    devices used so far when ``None``).  ``sync=True`` waits for the device first (one sync)."""
    if device is None:
        devices = list(_LOGS)
    else:
        d = torch.device(device)
        devices = [torch.device("cuda", torch.cuda.current_device()) if d.type == "cuda" and d.index is None else d]
    for d in devices:
        log = _LOGS.get(d)
        if log is None:
            continue
        if sync:  # every launch queued so far (graph replays included) has stored its flags
            torch.cuda.synchronize(d)
        if log.pending():
            log.raise_and_reset()
