"""Hostile backends for the run-lifecycle tests (loaded as ``tests.harness.hostile_backends:NAME``).

Each meets the contract on paper and misbehaves in one way a real backend could.  Those that change
process-global state or end the process are classes, built only when a run loads them (``--backend
tests.harness.hostile_backends:FlushesDenormals``), never when this module is imported.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time

import torch

from moe_fq_parity import reference
from moe_fq_parity.reference import FORMATS


class _Reference:
    name = "hostile"
    formats = set(FORMATS)

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        return reference.fake_quant_experts(weights, amax, fmt, variant, **options)

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        return reference.ste_backward_experts(weights, amax, grads, mode, fmt=fmt)


class DeclaresThenDeclines(_Reference):
    """Lists nvfp4 in ``formats`` but raises ``NotImplementedError`` for it."""

    name = "declares-then-declines"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        if fmt == "nvfp4":
            raise NotImplementedError("nvfp4 later")
        return super().fake_quant(weights, amax, fmt, variant, **options)


class WritesIntoWeights(_Reference):
    """Right outputs, also written into the input weights (``w.copy_(out)``)."""

    name = "writes-into-weights"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = super().fake_quant(weights, amax, fmt, variant, **options)
        with torch.no_grad():
            for w, y in zip(weights, out):
                w.copy_(y)
        return out


class HalvesAmax(_Reference):
    """Quantizes with the amax it is given, then halves it in place (state that leaks across checks)."""

    name = "halves-amax"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = super().fake_quant(weights, amax, fmt, variant, **options)
        amax.mul_(0.5)
        return out

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        out = super().ste_backward(weights, amax, grads, fmt, mode)
        amax.mul_(0.5)
        return out


class RetriesForever(_Reference):
    """Swallows every ``Exception`` and retries: a timeout must still end the call."""

    name = "retries-forever"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        while True:
            try:
                time.sleep(0.05)
            except Exception:  # noqa: BLE001 - the point of this backend
                continue


class Slow(_Reference):
    """Correct, 0.3 s per call (a run long enough to be signalled mid-way)."""

    name = "slow"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        time.sleep(0.3)
        return super().fake_quant(weights, amax, fmt, variant, **options)


class NoCuda(_Reference):
    name = "no-cuda"
    device = "cuda"


class BogusDevice(_Reference):
    name = "bogus-device"
    device = "warp-drive:7"


class FlushesDenormals(_Reference):
    """Sets ``torch.set_flush_denormal(True)`` when built (as a fast-math library may on load), then
    computes the reference's formula in that state: outputs differ from a clean reference on denormals."""

    name = "flushes-denormals"

    def __init__(self) -> None:
        torch.set_flush_denormal(True)


class SetsDefaultDtype(_Reference):
    """Right outputs; each call leaves ``torch.set_default_dtype(torch.float64)`` behind."""

    name = "sets-default-dtype"

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        out = super().fake_quant(weights, amax, fmt, variant, **options)
        torch.set_default_dtype(torch.float64)
        return out


class _MisbehavesOnInt4(_Reference):
    """Correct, except that every INT4 call runs ``misbehave()`` first (other formats show the run going on)."""

    def fake_quant(self, weights, amax, fmt, variant=None, **options):
        if fmt == "int4":
            self.misbehave()
        return super().fake_quant(weights, amax, fmt, variant, **options)

    def misbehave(self) -> None:
        raise NotImplementedError


class ExitsZero(_MisbehavesOnInt4):
    """``os._exit(0)``: the process ends, "successfully", mid-run."""

    name = "exits-zero"

    def misbehave(self) -> None:
        os._exit(0)


class ExitsInBackward(_Reference):
    """Right forward outputs; ``os._exit(0)`` in its INT4 STE backward (the process ends in one check
    of a case whose other checks are fine)."""

    name = "exits-in-backward"

    def ste_backward(self, weights, amax, grads, fmt, mode, **options):
        if fmt == "int4":
            os._exit(0)
        return super().ste_backward(weights, amax, grads, fmt, mode, **options)


class Segfaults(_MisbehavesOnInt4):
    """Reads address 0 (``ctypes.string_at(0)``: SIGSEGV)."""

    name = "segfaults"

    def misbehave(self) -> None:
        ctypes.string_at(0)


class HangsUninterruptibly(_MisbehavesOnInt4):
    """Disarms SIGALRM and loops forever, swallowing even ``BaseException``."""

    name = "hangs-uninterruptibly"

    def misbehave(self) -> None:
        while True:
            try:
                signal.setitimer(signal.ITIMER_REAL, 0)
                time.sleep(0.05)
            except BaseException:  # noqa: BLE001 - the point of this backend
                continue


class RaisesKeyboardInterrupt(_MisbehavesOnInt4):
    """Raises ``KeyboardInterrupt`` itself (no one pressed Ctrl-C)."""

    name = "raises-keyboard-interrupt"

    def misbehave(self) -> None:
        raise KeyboardInterrupt("from the backend")


class IllegalCudaAccess(_MisbehavesOnInt4):
    """On a GPU: a Triton kernel stores 2**40 bytes past its tensor (an illegal memory access, which
    poisons the process's CUDA context for every later call)."""

    name = "illegal-cuda-access"
    device = "cuda"

    def misbehave(self) -> None:
        import triton
        import triton.language as tl

        @triton.jit
        def _poke(ptr):
            tl.store(ptr + (1 << 40), 1.0)

        target = torch.zeros(1, device="cuda")
        _poke[(1,)](target)
        torch.cuda.synchronize()

declares_then_declines = DeclaresThenDeclines()
writes_into_weights = WritesIntoWeights()
halves_amax = HalvesAmax()
retries_forever = RetriesForever()
slow = Slow()
no_cuda = NoCuda()
bogus_device = BogusDevice()
