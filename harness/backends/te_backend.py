"""Transformer Engine's own quantizers as contract backends: quantize, then dequantize.

TE does not import without CUDA and cuDNN (``docs/measured.md`` §8); ``available()`` says so and
the harness skips these backends with that reason.  On a GPU host: ``pip install 'moe-fq-parity[te]'``
(without a package index: ``docs/offline-gpu-hosts.md``).  Two objects, one per TE scaling recipe:

* ``te`` -- FP8: ``Float8Quantizer`` (delayed scaling) given the scale ``RN(448 / amax)``
  (a true fp32 division on the GPU, amax <= 2**-24 taken as 1: the reference's ``cuda`` scale), so the
  contract's amax is honoured; TE casts ``x * scale`` to E4M3 and dequantizes with its own
  ``scale_inv``.  NVFP4: ``NVFP4Quantizer`` (1x16 blocks, no Hadamard transform, no 2-D blocks,
  no stochastic rounding), which computes its global amax from the tensor itself.
* ``te-current`` -- FP8 with ``Float8CurrentScalingQuantizer``: TE computes amax and scale.

Where TE takes its amax from the data, the backend accepts only ``amax == max|w|`` per expert
(``calibrated_only``) and raises ``ValueError`` otherwise.  Per-channel amax is not a TE recipe
for these quantizers: ``ValueError``.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Sequence

import torch

from moe_fq_parity.reference import split_expert_amax
from moe_fq_parity.reference.constants import E4M3_MAX, NVFP4_BLOCK, TINY_AMAX

from .quiet_imports import try_import

TE_VERSION_TESTED = "2.20.2"
"""The TE release measured in ``docs/measured.md`` §8."""


def te_version() -> str | None:
    """Installed ``transformer_engine`` version, or ``None``."""
    mod, _ = try_import("transformer_engine")
    return getattr(mod, "__version__", None) if mod is not None else None


@lru_cache(maxsize=None)
def _te() -> tuple[dict[str, Any], str]:
    """TE's quantizer classes and dtype enum, or the reason they cannot be had."""
    if not torch.cuda.is_available():
        return {}, "Transformer Engine needs a CUDA GPU (and cuDNN); none here"
    tep, why = try_import("transformer_engine.pytorch")
    if tep is None:
        return {}, why
    tex, why = try_import("transformer_engine_torch")
    if tex is None:
        return {}, why
    found: dict[str, Any] = {"tex": tex}
    for name, modules in {
        "Float8Quantizer": ("transformer_engine.pytorch", "transformer_engine.pytorch.tensor.float8_tensor"),
        "Float8CurrentScalingQuantizer": ("transformer_engine.pytorch", "transformer_engine.pytorch.tensor.float8_tensor"),
        "NVFP4Quantizer": ("transformer_engine.pytorch", "transformer_engine.pytorch.tensor.nvfp4_tensor"),
    }.items():
        for m in modules:
            mod, _ = try_import(m)
            if mod is not None and hasattr(mod, name):
                found[name] = getattr(mod, name)
                break
    return found, ""


class TEBackend:
    """One TE recipe (``"delayed"`` or ``"current"``) as a contract backend (see module docstring)."""

    def __init__(self, recipe: str) -> None:
        if recipe not in ("delayed", "current"):
            raise ValueError(f"recipe must be 'delayed' or 'current', got {recipe!r}")
        self.recipe = recipe
        self.name = "te" if recipe == "delayed" else "te-current"
        self.device = "cuda"
        self.formats = {"fp8_e4m3", "nvfp4"} if recipe == "delayed" else {"fp8_e4m3"}
        self.calibrated_only = frozenset({"nvfp4"} if recipe == "delayed" else {"fp8_e4m3"})

    @staticmethod
    def upstream_version() -> str | None:
        """Installed ``transformer_engine`` version, or ``None``."""
        return te_version()

    def __repr__(self) -> str:
        return f"TEBackend(recipe={self.recipe!r})"

    def available(self) -> tuple[bool, str]:
        """TE imports and has the quantizer classes this recipe needs."""
        found, why = _te()
        if why:
            return False, why
        need = "Float8Quantizer" if self.recipe == "delayed" else "Float8CurrentScalingQuantizer"
        return (True, "") if need in found else (False, f"transformer_engine has no {need}")

    def format_available(self, fmt: str) -> tuple[bool, str]:
        """Whether this recipe runs ``fmt`` here (NVFP4 may need a newer GPU than Hopper: tried, not assumed)."""
        if fmt not in self.formats:
            return False, f"{self.name} has no {fmt} quantizer"
        ok, why = self.available()
        if not ok:
            return False, why
        if fmt == "nvfp4":
            major, minor = torch.cuda.get_device_capability()
            if major < 10:
                # below Blackwell the probe below "runs" but the kernels return zeros (docs/measured.md §13)
                return False, f"TE's NVFP4 kernels need compute capability >= 10.0 (Blackwell); this GPU is {major}.{minor}"
            found = _te()[0]
            if "NVFP4Quantizer" not in found:
                return False, "transformer_engine has no NVFP4Quantizer"
            try:  # NVFP4 kernels may need a newer GPU than this one: ask TE, once
                probe = torch.ones(16, 16, dtype=torch.bfloat16, device="cuda")
                self._qdq(found, fmt, probe, torch.tensor(1.0, device="cuda"))
            except Exception as exc:  # noqa: BLE001 - the reason is the answer
                return False, f"TE's NVFP4 quantize->dequantize does not run here: {type(exc).__name__}: {exc}"[:300]
        return True, ""

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: torch.Tensor, fmt: str, **options) -> list[torch.Tensor]:
        """Quantize each expert with TE's quantizer and dequantize it back to the input dtype."""
        if fmt not in self.formats:
            raise ValueError(f"{self.name} does not run {fmt}; it runs {sorted(self.formats)}")
        opts = dict(options)
        if opts.pop("variant", None) not in (None, "default"):
            raise ValueError(f"{self.name} is one implementation and has no variants")
        block = opts.pop("block_size", NVFP4_BLOCK) if fmt == "nvfp4" else NVFP4_BLOCK
        if opts:
            raise TypeError(f"{self.name} {fmt} does not take option(s) {sorted(opts)}")
        if block != NVFP4_BLOCK:
            raise ValueError(f"TE's NVFP4 blocks are {NVFP4_BLOCK} long, not {block}")
        found, why = _te()
        if why:
            raise RuntimeError(why)
        out = []
        with torch.no_grad():
            for w, a in zip(weights, split_expert_amax(weights, amax)):
                if a.dim() != 0:
                    raise NotImplementedError(f"{self.name} quantizes per tensor: per-channel amax is not a TE recipe")
                if w.numel() == 0:
                    out.append(torch.empty_like(w))
                    continue
                if fmt in self.calibrated_only:
                    _require_calibrated(w, a, self.name)
                out.append(self._qdq(found, fmt, w, a.to(w.device)))
        return out

    def _qdq(self, found: dict[str, Any], fmt: str, w: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        """Quantize -> dequantize one expert, zero-padded to TE's tile shapes (zeros change no amax):
        FP8 elementwise as ``[-1, 16]`` rows; NVFP4 with rows padded to a multiple of 16."""
        if fmt == "nvfp4":
            if w.shape[-1] % NVFP4_BLOCK:
                raise ValueError(f"TE's NVFP4 quantizer needs the last dim ({w.shape[-1]}) to be a multiple of {NVFP4_BLOCK}")
            rows = w.reshape(-1, w.shape[-1])
        else:
            rows = w.reshape(-1)
            rows = torch.cat([rows, rows.new_zeros((-rows.numel()) % 256)]).reshape(-1, 16)
        n = rows.shape[0]
        padded = torch.cat([rows, rows.new_zeros(((-n) % 16, rows.shape[1]))]).contiguous()
        y = self._quantizer(found, fmt, a)(padded).dequantize(dtype=w.dtype)[:n]
        return y.reshape(-1)[: w.numel()].reshape(w.shape) if fmt != "nvfp4" else y.reshape(w.shape)

    def _quantizer(self, found: dict[str, Any], fmt: str, a: torch.Tensor):
        tex = found["tex"]
        if fmt == "nvfp4":
            return found["NVFP4Quantizer"](rowwise=True, columnwise=False)
        e4m3 = tex.DType.kFloat8E4M3
        if self.recipe == "current":
            return found["Float8CurrentScalingQuantizer"](e4m3, a.device, rowwise=True, columnwise=False)
        a = torch.where(a <= TINY_AMAX, torch.ones_like(a), a).reshape(1).to(torch.float32)
        scale = torch.full((1,), E4M3_MAX, dtype=torch.float32, device=a.device) / a
        return found["Float8Quantizer"](scale, torch.zeros(1, dtype=torch.float32, device=a.device), e4m3, rowwise=True, columnwise=False)


def _require_calibrated(w: torch.Tensor, a: torch.Tensor, name: str) -> None:
    top = w.detach().to(torch.float32).abs().amax()
    if float(top) != float(a):
        raise ValueError(f"{name} takes its amax from the data: amax must equal max|w| ({float(top)!r}), got {float(a)!r}")


te = TEBackend("delayed")
"""TE FP8 delayed-scaling quantizer (scale from the given amax) and NVFP4 quantizer."""

te_current = TEBackend("current")
"""TE FP8 current-scaling quantizer (amax from the data)."""
