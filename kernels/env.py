"""Where the Triton kernels can run, decided once per process.

* On a CUDA device when Triton imports.
* On CPU tensors when Triton runs in interpreter mode (``TRITON_INTERPRET=1`` set before Triton is
  first imported): the CPU tier of the tests.
* Nowhere else: callers use the reference (the module adapter's soft gate) or get ``RuntimeError``.
"""

from __future__ import annotations

import functools
import os
import re

import torch


def interpret_mode() -> bool:
    """True when Triton was (or will be) imported in interpreter mode."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=1)
def triton_importable() -> bool:
    try:
        import triton  # noqa: F401
        import triton.language  # noqa: F401
    except Exception:  # any import failure means "no Triton", whatever its cause
        return False
    return True


_SUPPORTED: set[str] = set()


def kernel_supported(device: torch.device) -> bool:
    """Can the Triton kernels run on tensors living on ``device``?  A yes is remembered per device
    type (it cannot change once Triton is imported); a no is asked again."""
    if device.type in _SUPPORTED:
        return True
    if not triton_importable():
        return False
    if device.type == "cuda":
        ok = not interpret_mode() and torch.cuda.is_available()
    else:
        ok = device.type == "cpu" and interpret_mode()
    if ok:
        _SUPPORTED.add(device.type)
    return ok


def require_kernel(device: torch.device) -> None:
    """Raise ``RuntimeError`` naming the reason when the kernels cannot run on ``device``."""
    if kernel_supported(device):
        return
    if not triton_importable():
        raise RuntimeError("Triton is not importable; use the reference (reference.fake_quant_experts)")
    if device.type == "cpu":
        raise RuntimeError("CPU tensors need Triton's interpreter: set TRITON_INTERPRET=1 before importing triton")
    raise RuntimeError(f"the Triton kernels do not run on {device} (interpreter mode: {interpret_mode()})")


@functools.lru_cache(maxsize=None)
def exact_fma(device_type: str) -> bool:
    """Does ``tl.fma`` round once on this back end?

    Always on the GPU (``fma.rn.f32``).  Triton's interpreter computed ``x*y+z`` with two roundings
    before 3.7; probe it with a case where that matters: ``(1+2**-12)**2 - (1+2**-11)`` is
    ``2**-24`` fused and ``0`` unfused.
    """
    if device_type == "cuda":
        return True
    import triton
    import triton.language as tl

    @triton.jit
    def _probe(a_ptr, o_ptr):
        a = tl.load(a_ptr)
        tl.store(o_ptr, tl.fma(a, a, -(a + a - 1.0)))

    a = torch.tensor([1.0 + 2.0**-12], dtype=torch.float32)
    out = torch.empty(1, dtype=torch.float32)
    _probe[(1,)](a, out)
    return float(out[0]) == 2.0**-24


@functools.lru_cache(maxsize=None)
def hw_bf16_rne(device: torch.device) -> bool:
    """Does fp32 -> bf16 ``.to(tl.bfloat16)`` round to nearest even on ``device``, in one instruction?

    On CUDA devices of compute capability 8.0 and later (``cvt.rn.bf16.f32``, ``cvt.rn.bf16x2.f32``
    for pairs), which also writes the canonical NaN ``0x7FFF`` for every NaN input, either sign, any
    payload (``tl_rounding.out_bits`` relies on it; measured on an H100 for both forms, and checked
    by ``tests/kernels/test_tl_rounding.py`` on every GPU the tests run on).  Not under Triton's
    interpreter, whose cast truncates (``docs/measured.md`` section 1): there, and on older GPUs,
    the kernels round with integer operations (``tl_rounding.f32_to_bits``).  Both give the same bits.
    """
    if device.type != "cuda" or interpret_mode():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 0)


@functools.lru_cache(maxsize=None)
def hw_e4m3_rne(device: torch.device) -> bool:
    """Does fp32 -> E4M3 ``.to(tl.float8e4nv)`` round to nearest even, saturating, in hardware?

    On CUDA devices of compute capability 8.9 and later (``cvt.rn.satfinite.e4m3x2.f32``: two
    elements per instruction, finite values above 448 and infinities to 448, NaN to NaN).  Not
    under Triton's interpreter, whose fp8 casts drop carries (``docs/measured.md`` section 1), nor
    on older GPUs: there the kernels round with ``tl_rounding.round_mag_e4m3``.  Both give the
    same bits on ``[0, 448]``.
    """
    if device.type != "cuda" or interpret_mode():
        return False
    return torch.cuda.get_device_capability(device) >= (8, 9)


@functools.lru_cache(maxsize=None)
def layout_ties_low() -> bool:
    """Does the installed Triton give a load's equally contiguous axes their lanes lowest axis first?

    Triton's coalescing pass orders a load's axes by the contiguity of its offsets; the axes it
    cannot tell apart (contiguity 1) it ordered lowest index first up to 3.6 and highest first from
    3.8 (measured by compiling the forward for sm_90: a ``[K, NB, block / K]`` tile gets the order
    ``[2, 0, 1]``, lanes along ``K``, from Triton 3.6.0 and ``[2, 1, 0]``, lanes along the blocks,
    from 3.8.0 and 3.9.0).  The forward builds its block tiles in the arrangement that gives the
    lanes it is written for under either rule (``tiles.tile_aligned``, ``tiles.tile_4d``);
    ``tests/kernels/test_instructions.py`` checks the compiled layouts on the installed Triton."""
    import triton

    return tuple(int(p) for p in re.findall(r"\d+", triton.__version__)[:2]) < (3, 7)
