"""Model-Optimizer 0.47.0's tensor fake quant, wrapped in the backend contract.

One backend object per Model-Optimizer code path, so a report can say which one matched:

* ``modelopt`` (``device="cuda"``): the public autograd functions on CUDA tensors.  INT runs
  ``fake_tensor_quant`` -> the JIT-built extension ``modelopt_cuda_ext`` (per tensor, or its
  ``_with_axis`` kernel per channel); FP8 runs ``scaled_e4m3`` -> ``modelopt_cuda_ext_fp8``;
  NVFP4 runs ``static_blockwise_fp4_fake_quant`` (Triton kernel; its E4M3 block-scale step goes
  through ``scaled_e4m3``'s path again, i.e. ``modelopt_cuda_ext_fp8``).  Model-Optimizer silently
  falls back to its eager code when an extension fails to build, so ``format_available(fmt)``
  builds the extension that format needs (INT: ``modelopt_cuda_ext``; FP8 and NVFP4:
  ``modelopt_cuda_ext_fp8``) with ``raise_if_failed=True`` first: a fallback can never pass as the
  CUDA path.  The Triton kernel's fp32 ``|x| / scale`` compiles to ``div.full.f32`` (approximate),
  so NVFP4 is in ``approximate_division``: exact E2M1 ties may round away from even
  (``variant_match`` lists every such flip).
* ``modelopt-eager`` (``device="cpu"``): the same public functions on CPU tensors, which run
  Model-Optimizer's eager torch code (INT: ``_tensor_quant``; FP8: ``fp8_eager``).  NVFP4 has no
  CPU path in 0.47.0.

Per-expert amax is a scalar per expert; per-channel amax ``[out]`` is passed as ``[out, 1]``
(Model-Optimizer's layout for axis 0).  NVFP4: ``amax`` is the per-expert *global* amax and the
per-block amax is the block max of the weight, as max calibration sets it.

Beyond the contract: ``format_available(fmt)`` (per-format reason) and ``max_calibrate(batches,
granularity)`` (``TensorQuantizer`` max calibration over a sequence of batches).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Optional, Sequence

import torch

from moe_fq_parity.reference import split_expert_amax
from moe_fq_parity.reference.constants import E4M3_MAX, NVFP4_BLOCK
from moe_fq_parity.reference.formats import format_spec
from moe_fq_parity.reference.nvfp4 import block_amax

from .quiet_imports import try_import
from .registry import INSTALL_HINTS

MODELOPT_VERSION = "0.47.0"
INSTALL = INSTALL_HINTS["modelopt"]
"""What makes the Model-Optimizer backends available (the registry's hint, in their reason)."""
"""The release the reference's ``modelopt`` variants were read from (docs/measured.md §5-§7); another version is reported, not refused."""

_TENSOR_QUANT = "modelopt.torch.quantization.tensor_quant"
_INT_OPTIONS = frozenset({"narrow_range", "unsigned"})
_OPTIONS: dict[str, frozenset[str]] = {"int8": _INT_OPTIONS, "int4": _INT_OPTIONS, "fp8_e4m3": frozenset(), "nvfp4": frozenset({"block_size"})}
"""The formats this backend runs and the options Model-Optimizer takes for each (its own declaration,
not the reference's: it has no ``block_amax``)."""
CALIB_GRANULARITIES = ("per_tensor", "per_channel")


def modelopt_version() -> Optional[str]:
    """Installed ``nvidia-modelopt`` version, or ``None``."""
    try:
        from importlib.metadata import version

        return version("nvidia-modelopt")
    except Exception:  # noqa: BLE001 - not installed
        return None


EXTENSIONS: dict[str, str] = {"int": "modelopt_cuda_ext", "fp8": "modelopt_cuda_ext_fp8"}
"""The Model-Optimizer CUDA extensions the ``modelopt`` backend runs (INT; FP8 and NVFP4's block
scales), by kind.  Built by ``torch.utils.cpp_extension.load`` into the torch extensions folder
(``$TORCH_EXTENSIONS_DIR``, default ``~/.cache/torch_extensions/py<ver>_cu<ver>/<name>``), which
outlives the run: the first use on a host compiles (about a minute each: docs/measured.md §13),
later runs load the built library."""


@dataclass(frozen=True)
class ExtensionBuild:
    """How one extension came to be loaded: ``compiled`` (no built library was in the cache
    folder before), the wall seconds, the ``phase`` (``prepare``: in the section process while
    the cases ran; ``section``: in the section's own time) and the failure reason (``""`` when it
    loaded)."""

    name: str
    compiled: bool
    seconds: float
    phase: str
    error: str = ""

    def __str__(self) -> str:
        what = "failed" if self.error else "compiled" if self.compiled else "loaded from the cache"
        return f"{self.name} {what} in {self.seconds:.1f} s ({self.phase})"


BUILDS: dict[str, ExtensionBuild] = {}
"""The extensions built or loaded in this process, by kind (shown in the external section's notes)."""


def build_folder(name: str) -> Optional[str]:
    """The torch extensions folder of extension ``name`` (``None`` where torch does not say)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        return _get_build_directory(name, verbose=False)
    except Exception:  # noqa: BLE001 - a private torch helper: its absence only hides the folder
        return None


def _library_cached(name: str) -> bool:
    folder = build_folder(name)
    return folder is not None and os.path.isfile(os.path.join(folder, f"{name}.so"))


def _cuda_extension(kind: str, phase: str = "section") -> str:
    """Build/load one Model-Optimizer CUDA extension; ``""`` on success, else the reason.  Once per
    process: the first call's outcome is kept in ``BUILDS``."""
    if kind in BUILDS:
        return BUILDS[kind].error
    ext, why = try_import("modelopt.torch.quantization.extensions")
    if ext is None:
        return why
    getter = {"int": ext.get_cuda_ext, "fp8": ext.get_cuda_ext_fp8}[kind]
    name = EXTENSIONS[kind]
    cached = _library_cached(name)
    if not cached:
        print(f"external: compiling Model-Optimizer's CUDA extension {name} into {build_folder(name)} "
              f"(first use on this host; later runs load it)", flush=True)
    t0 = time.perf_counter()
    try:
        loaded = getter(raise_if_failed=True)
        error = "" if loaded is not None else f"modelopt {kind} CUDA extension did not load"
    except Exception as exc:  # noqa: BLE001 - a failed build is a reason
        error = f"modelopt {kind} CUDA extension failed to build: {type(exc).__name__}: {exc}"[:300]
    BUILDS[kind] = ExtensionBuild(name, not cached, round(time.perf_counter() - t0, 1), phase, error)
    return error


def nvml_arch_list() -> str:
    """``TORCH_CUDA_ARCH_LIST`` for the GPUs of this host (``"9.0"``; distinct compute
    capabilities, space separated), read through NVML: no CUDA initialisation.  ``""`` where NVML
    cannot say (no driver, no GPU)."""
    from ctypes import CDLL, byref, c_int, c_void_p

    try:
        nvml = CDLL("libnvidia-ml.so.1")
    except OSError:
        return ""
    if nvml.nvmlInit_v2() != 0:
        return ""
    try:
        count = c_int(0)
        if nvml.nvmlDeviceGetCount_v2(byref(count)) != 0:
            return ""
        caps = set()
        for i in range(count.value):
            handle, major, minor = c_void_p(), c_int(0), c_int(0)
            if nvml.nvmlDeviceGetHandleByIndex_v2(i, byref(handle)) == 0 and \
                    nvml.nvmlDeviceGetCudaComputeCapability(handle, byref(major), byref(minor)) == 0:
                caps.add((major.value, minor.value))
        return " ".join(f"{a}.{b}" for a, b in sorted(caps))
    finally:
        nvml.nvmlShutdown()


def prepare_extensions() -> str:
    """Build (first use on a host) or load the ``EXTENSIONS`` in this process without initialising
    CUDA, so the section's run finds them loaded; returns what was done, or why nothing was.

    Called by the external section's ``prepare()`` in its own process while the run's cases still
    use the GPU.  Model-Optimizer reads the GPU's compute capability with
    ``torch.cuda.get_device_capability()`` (which initialises CUDA) unless ``TORCH_CUDA_ARCH_LIST``
    is set; here it is set from NVML (``nvml_arch_list``) when the user has not set it.  The build
    still initialises torch's CUDA state (``torch.cuda.is_initialized()``: docs/measured.md §13)
    but creates no context on the GPU: the process is not among nvidia-smi's compute
    apps, so the cases' GPU memory is untouched (the section forks nothing).  A failed build is
    recorded, and reported by the section's rows as today."""
    if try_import(_TENSOR_QUANT)[0] is None:
        return "nvidia-modelopt not importable"
    if torch.version.cuda is None:
        return "a CPU-only torch: nothing to build"
    if not os.environ.get("TORCH_CUDA_ARCH_LIST"):
        arch = nvml_arch_list()
        if not arch:
            return "no GPU visible through NVML: nothing to build"
        os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    for kind in EXTENSIONS:
        _cuda_extension(kind, "prepare")
    return "; ".join(str(b) for b in BUILDS.values())


class ModeloptBackend:
    """One Model-Optimizer code path (``path="cuda"`` or ``"eager"``) as a contract backend."""

    def __init__(self, path: str) -> None:
        if path not in ("cuda", "eager"):
            raise ValueError(f"path must be 'cuda' or 'eager', got {path!r}")
        self.path = path
        self.name = "modelopt" if path == "cuda" else "modelopt-eager"
        self.device = "cuda" if path == "cuda" else "cpu"
        self.formats = set(_OPTIONS) if path == "cuda" else set(_OPTIONS) - {"nvfp4"}
        self.approximate_division = frozenset({"nvfp4"}) if path == "cuda" else frozenset()
        """Formats whose upstream kernel divides with an approximate (not correctly rounded) fp32 division."""

    @staticmethod
    def upstream_version() -> Optional[str]:
        """Installed ``nvidia-modelopt`` version, or ``None``."""
        return modelopt_version()

    def __repr__(self) -> str:
        return f"ModeloptBackend(path={self.path!r})"

    # -- availability -------------------------------------------------------------------------

    def available(self) -> tuple[bool, str]:
        """Importable, and on the CUDA path: a GPU (extensions are built per format: ``format_available``)."""
        tq, why = try_import(_TENSOR_QUANT)
        if tq is None:
            return False, f"{why} ({INSTALL})"
        if self.path == "eager":
            return True, ""
        if not torch.cuda.is_available():
            return False, "no CUDA device: the CUDA-extension path needs a GPU"
        return True, ""

    def format_available(self, fmt: str) -> tuple[bool, str]:
        """Whether this path runs ``fmt`` here, and why not."""
        if fmt not in self.formats:
            return False, f"{self.name} has no {fmt} path (Model-Optimizer {MODELOPT_VERSION} runs NVFP4 on CUDA only)"
        ok, why = self.available()
        if not ok:
            return False, why
        if self.path == "cuda":
            why = _cuda_extension("int" if format_spec(fmt).is_int else "fp8")
            if why:
                return False, why
        if fmt == "nvfp4":
            gemm, why = try_import("modelopt.torch.kernels.quantization.gemm")
            if gemm is None:
                return False, why
            if not getattr(gemm, "IS_AVAILABLE", False) or not hasattr(gemm, "static_blockwise_fp4_fake_quant"):
                return False, "modelopt's Triton NVFP4 kernels are not available (needs triton and a CUDA GPU)"
        return True, ""

    # -- contract -----------------------------------------------------------------------------

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, **options) -> list[torch.Tensor]:
        """Fake-quantize each expert with Model-Optimizer's code (see the module docstring)."""
        opts = self._check_options(fmt, options)
        with torch.no_grad():
            return [self._one(w, a, fmt, pass_through_bwd=True, **opts) for w, a in zip(weights, split_expert_amax(weights, amax))]

    def ste_backward(
        self, weights: Sequence[torch.Tensor], amax: torch.Tensor, grads: Sequence[torch.Tensor], fmt: str, mode: str, **options
    ) -> list[torch.Tensor]:
        """Input gradients from Model-Optimizer's autograd backward (``pass_through_bwd`` = ``mode == "pass_through"``)."""
        if mode not in ("pass_through", "clipped"):
            raise ValueError(f"mode must be 'pass_through' or 'clipped', got {mode!r}")
        if len(grads) != len(weights):
            raise ValueError(f"{len(grads)} gradients for {len(weights)} experts")
        opts = self._check_options(fmt, options)
        out = []
        for w, a, g in zip(weights, split_expert_amax(weights, amax), grads):
            if w.numel() == 0:
                out.append(torch.zeros_like(g))
                continue
            x = w.detach().clone().requires_grad_(True)
            y = self._one(x, a, fmt, pass_through_bwd=(mode == "pass_through"), **opts)
            y.backward(g)
            out.append(x.grad)
        return out

    # -- beyond the contract ------------------------------------------------------------------

    def max_calibrate(self, batches: Sequence[torch.Tensor], granularity: str = "per_tensor") -> torch.Tensor:
        """amax of Model-Optimizer's ``TensorQuantizer`` after max calibration over ``batches``.

        ``per_tensor``: axis ``None``; ``per_channel``: axis 0 of ``[out, in]`` batches.  Returned
        as Model-Optimizer keeps it (the batches' dtype), squeezed to ``()`` / ``[out]``.
        """
        if granularity not in CALIB_GRANULARITIES:
            raise ValueError(f"granularity must be one of {CALIB_GRANULARITIES}, got {granularity!r}")
        nn, why = try_import("modelopt.torch.quantization.nn")
        cfg, why_cfg = try_import("modelopt.torch.quantization.config")
        if nn is None or cfg is None:
            raise RuntimeError(why or why_cfg)
        axis = None if granularity == "per_tensor" else 0
        quantizer = nn.TensorQuantizer(cfg.QuantizerAttributeConfig(num_bits=8, axis=axis)).to(self.device)
        quantizer.enable_calib()
        quantizer.disable_quant()
        with torch.no_grad():
            for b in batches:
                quantizer(b.to(self.device))
        quantizer.load_calib_amax()
        return quantizer.amax.detach().reshape(-1 if axis == 0 else ()).cpu()

    # -- internals ----------------------------------------------------------------------------

    def _check_options(self, fmt: str, options: dict) -> dict:
        if fmt not in self.formats:
            raise ValueError(f"{self.name} does not run {fmt}; it runs {sorted(self.formats)}")
        opts = dict(options)
        variant = opts.pop("variant", None)
        if variant not in (None, "default"):
            raise ValueError(f"{self.name} is one implementation and has no variant {variant!r}")
        unknown = set(opts) - _OPTIONS[fmt]
        if unknown:
            raise TypeError(f"{self.name} {fmt} does not take option(s) {sorted(unknown)}; it takes {sorted(_OPTIONS[fmt])}")
        return opts

    def _one(self, w: torch.Tensor, a: torch.Tensor, fmt: str, *, pass_through_bwd: bool, **opts) -> torch.Tensor:
        if w.numel() == 0:
            return torch.empty_like(w)
        if self.path == "cuda":
            ok, why = self.format_available(fmt)
            if not ok:
                raise RuntimeError(why)
        tq, why = try_import(_TENSOR_QUANT)
        if tq is None:
            raise RuntimeError(why)
        a = a.to(device=w.device, dtype=torch.float32)
        a_mo = a.reshape(-1, 1) if a.dim() == 1 else a
        spec = format_spec(fmt)
        if spec.is_int:
            return tq.fake_tensor_quant(
                w, a_mo, None, spec.grid.bits, bool(opts.get("unsigned", False)), bool(opts.get("narrow_range", False)),
                None, pass_through_bwd,
            )
        if fmt == "fp8_e4m3":
            return tq.scaled_e4m3(w, a_mo, None, 4, 3, None, pass_through_bwd)
        return self._nvfp4(tq, w, a, pass_through_bwd=pass_through_bwd, block_size=int(opts.get("block_size", NVFP4_BLOCK)))

    def _nvfp4(self, tq, w: torch.Tensor, g: torch.Tensor, *, pass_through_bwd: bool, block_size: int) -> torch.Tensor:
        ok, why = self.format_available("nvfp4")
        if not ok:
            raise RuntimeError(why)
        if g.dim() != 0:
            raise ValueError("NVFP4 takes one global amax per expert, not per channel")
        if w.shape[-1] % block_size:
            raise ValueError(f"modelopt's static NVFP4 kernel needs the last dim ({w.shape[-1]}) to be a multiple of {block_size}")
        # blocks as their own axis, as TensorQuantizer lays them out: the kernel reads the flat
        # buffer either way, and the clipped backward (|x| <= block amax) then broadcasts per block
        blocks = w.reshape(*w.shape[:-1], -1, block_size)
        bamax = block_amax(w.detach(), block_size).unsqueeze(-1)
        y = tq.static_blockwise_fp4_fake_quant(blocks, bamax, g, True, E4M3_MAX, None, pass_through_bwd)
        return y.reshape(w.shape)


modelopt = ModeloptBackend("cuda")
"""Model-Optimizer's CUDA extension (INT, FP8) and Triton (NVFP4) path."""

modelopt_eager = ModeloptBackend("eager")
"""Model-Optimizer's eager torch path on CPU tensors (INT, FP8)."""
