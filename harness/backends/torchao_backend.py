"""torchao's MX and NVFP4 quantize -> dequantize (``torchao.prototype.mx_formats``), as contract backends.

``pip install 'moe-fq-parity[torchao]'`` (torchao 0.18.0; pure Python on CPU, it keeps the installed
torch).  Without torchao ``available()`` says so with that pip command and the harness skips.
One backend per ``ScaleCalculationMode``, so a report can say which reference variant each mode matches:

* ``torchao`` -- ``FLOOR`` (the OCP rule, torchao's default) for ``mxfp8``/``mxfp4``, plus NVFP4;
* ``torchao-ceil``, ``torchao-even``, ``torchao-rceil`` -- the other modes, MX only.

MX (``amax=None``: the scales come from the data): ``MXTensor.to_mx(w, elem, 32, scaling_mode=mode)``
with ``torch.float8_e4m3fn`` (``mxfp8``) or ``torch.float4_e2m1fn_x2`` (``mxfp4``) elements, then
``.dequantize(w.dtype)`` (torchao's ``to_dtype``: elements and the decoded E8M0 scale cast to the
output dtype, multiplied there).  torchao has 1x32 blocks only along the last dim, takes bf16 and
fp32 input, and refuses a last dim that is not a multiple of 32: such experts are declined
(``NotImplementedError``), as is ``tile_2d``.  On CPU (and on any GPU without ``torch.compile``)
``RCEIL`` runs torchao's eager fallback (``_to_mx_rceil``): ``d = RN(A / max)``,
``c = clamp(ceil(log2 d), -127, 127) + 127`` with fp32 ``torch.log2``, Inf -> 254, NaN -> 255, and
the reciprocal scale 1 for code 0; on Blackwell under ``torch.compile`` it runs
``cvt.rp.satfinite.ue8m0x2.f32`` instead (not this backend).  Each mode matches the reference variant
``torchao_<mode>`` of ``mxfp8`` / ``mxfp4`` bit for bit (``reference.mx`` states the op sequences).

NVFP4 (two-level, per-expert global amax ``g``): ``NVFP4Tensor.to_nvfp4(w, per_tensor_scale=RN(g /
2688))`` (torchao's ``per_tensor_amax_to_scale``), then ``.dequantize(w.dtype)``; blocks of 16 on
the last dim, which must be a multiple of 16 (else declined).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any, Optional, Sequence

import torch

from moe_fq_parity.reference import FORMATS
from moe_fq_parity.reference.constants import NVFP4_BLOCK

from .quiet_imports import try_import
from .registry import INSTALL_HINTS

TORCHAO_VERSION = "0.18.0"
"""The torchao release this backend was written and measured against."""
INSTALL = INSTALL_HINTS["torchao"]
MX_BLOCK = 32
"""torchao's MX block along the last dim (``to_mx``'s ``block_size``)."""
MODES = ("floor", "ceil", "even", "rceil")
"""torchao ``ScaleCalculationMode`` values, one backend each."""
_MX_ELEMENTS = {"mxfp8": "float8_e4m3fn", "mxfp4": "float4_e2m1fn_x2"}
_MX = "torchao.prototype.mx_formats.mx_tensor"
_NVFP4 = "torchao.prototype.mx_formats.nvfp4_tensor"
_CONFIG = "torchao.prototype.mx_formats.config"


def torchao_version() -> Optional[str]:
    """Installed ``torchao`` version, or ``None``."""
    try:
        from importlib.metadata import version

        return version("torchao")
    except Exception:  # noqa: BLE001 - not installed
        return None


@lru_cache(maxsize=None)
def _torchao() -> tuple[dict[str, Any], str]:
    """torchao's MX and NVFP4 entry points, or the reason they cannot be had."""
    found: dict[str, Any] = {}
    for key, module in (("mx", _MX), ("nvfp4", _NVFP4), ("config", _CONFIG)):
        mod, why = try_import(module)
        if mod is None:
            return {}, f"{why} ({INSTALL})"
        found[key] = mod
    return found, ""


def check_mx_call(name: str, upstream: str, fmt: str, amax: Optional[torch.Tensor], opts: dict) -> None:
    """The MX call of a backend with 1x32 blocks only: ``tile_2d`` is declined (``NotImplementedError``),
    any other option is a ``TypeError``, an amax a ``ValueError`` (MX scales come from the data)."""
    if opts.pop("tile_2d", False):
        raise NotImplementedError(f"{upstream} has 1x32 blocks along the last dim only (no 32x32 tiles)")
    if opts:
        raise TypeError(f"{name} {fmt} does not take option(s) {sorted(opts)}")
    if amax is not None:
        raise ValueError(f"{fmt} takes no amax (its scales come from the data); pass amax=None")


class TorchaoBackend:
    """torchao with one ``ScaleCalculationMode`` (``mode`` in ``MODES``) as a contract backend."""

    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.name = "torchao" if mode == "floor" else f"torchao-{mode}"
        self.device = "cpu"
        wanted = set(_MX_ELEMENTS) | ({"nvfp4"} if mode == "floor" else set())
        self.formats = wanted & set(FORMATS)

    @staticmethod
    def upstream_version() -> Optional[str]:
        return torchao_version()

    def __repr__(self) -> str:
        return f"TorchaoBackend(mode={self.mode!r})"

    def available(self) -> tuple[bool, str]:
        """torchao imports (its prototype MX and NVFP4 modules)."""
        _, why = _torchao()
        if why:
            return False, why
        return True, ""

    def fake_quant(self, weights: Sequence[torch.Tensor], amax: Optional[torch.Tensor], fmt: str, **options) -> list[torch.Tensor]:
        """Quantize each expert with torchao and dequantize it back to the input dtype."""
        if fmt not in self.formats:
            raise ValueError(f"{self.name} does not run {fmt}; it runs {sorted(self.formats)}")
        opts = dict(options)
        if opts.pop("variant", None) not in (None, "default"):
            raise ValueError(f"{self.name} is one implementation and has no variants")
        found, why = _torchao()
        if why:
            raise RuntimeError(why)
        if fmt == "nvfp4":
            block = opts.pop("block_size", NVFP4_BLOCK)
            if opts:
                raise TypeError(f"{self.name} nvfp4 does not take option(s) {sorted(opts)}")
            if block != NVFP4_BLOCK:
                raise NotImplementedError(f"torchao's NVFP4 blocks are {NVFP4_BLOCK} long, not {block}")
            if amax is None or amax.dim() != 1 or amax.numel() != len(weights):
                raise ValueError(f"{self.name} nvfp4 takes one global amax per expert ([N] with N = {len(weights)})")
            return [self._nvfp4(found, w, a) for w, a in zip(weights, amax)]
        check_mx_call(self.name, "torchao's to_mx", fmt, amax, opts)
        return [self._mx(found, w, fmt) for w in weights]

    def _check(self, w: torch.Tensor, block: int, fmt: str) -> None:
        if w.dtype not in (torch.bfloat16, torch.float32):
            raise NotImplementedError(f"torchao's {fmt} quantizer takes bf16 or fp32 input, not {w.dtype}")
        if w.shape[-1] % block:
            raise NotImplementedError(f"torchao's {fmt} quantizer needs the last dim ({w.shape[-1]}) to be a multiple of {block}")

    def _mx(self, found: dict[str, Any], w: torch.Tensor, fmt: str) -> torch.Tensor:
        if w.numel() == 0:
            return torch.empty_like(w)
        self._check(w, MX_BLOCK, fmt)
        mode = found["config"].ScaleCalculationMode(self.mode)
        elem = getattr(torch, _MX_ELEMENTS[fmt])
        with torch.no_grad():
            t = found["mx"].MXTensor.to_mx(w.contiguous(), elem, MX_BLOCK, scaling_mode=mode)
            return t.dequantize(w.dtype)

    def _nvfp4(self, found: dict[str, Any], w: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
        if w.numel() == 0:
            return torch.empty_like(w)
        self._check(w, NVFP4_BLOCK, "nvfp4")
        nv = found["nvfp4"]
        with torch.no_grad():
            pts = nv.per_tensor_amax_to_scale(g.reshape(()).to(torch.float32))
            t = nv.NVFP4Tensor.to_nvfp4(w.contiguous().reshape(-1, w.shape[-1]), NVFP4_BLOCK, per_tensor_scale=pts)
            return t.dequantize(w.dtype).reshape(w.shape)


torchao = TorchaoBackend("floor")
"""torchao ``ScaleCalculationMode.FLOOR`` (its default) for MX, and its NVFP4."""
torchao_ceil = TorchaoBackend("ceil")
torchao_even = TorchaoBackend("even")
torchao_rceil = TorchaoBackend("rceil")
