"""Module adapter: a grouped linear layer whose N expert weights are fake-quantized in one launch.

Names follow Transformer Engine's ``GroupedLinear`` (parameters ``weight{i}`` ``[out, in]``,
``bias{i}``) and Model-Optimizer 0.47's per-expert quantizers (``weight_quantizer.{i}._amax``), so
checkpoints keep their keys.

amax cache.  The kernel wants one fp32 amax vector (``[N]``, or ``[N, out]`` per channel).  It is
gathered once and each ``weight_quantizer.{i}._amax`` buffer is then re-registered as a *view* of
it, so every in-place write to a buffer (``copy_``, ``.data.copy_``, ``load_state_dict``,
calibration) lands in the vector itself: the cached vector cannot go stale.  A buffer that is
*replaced* (``q._amax = t``, ``module.to(...)``, ``.half()``, ``q._amax.data = t``) no longer
aliases the vector; every forward checks the aliasing (per expert an identity and an address
comparison, no device work) and re-gathers when it broke.  Values (finite, >= 0) are checked by the
kernel on every forward without a host sync (``check_values``, default ``True``; see
``kernels/checks.py``): a bad amax makes the quantized weights NaN and raises ``ValueError`` from a
later call or ``kernels.raise_pending_errors()``; ``check_values="sync"`` raises in the forward
itself (one device sync, not capturable in a CUDA graph).

Host cost and CUDA graphs: the expert table is cached by ``tables.table_for``, and the forward and
the clipped backward neither synchronise nor copy host memory to the device once the tables exist,
so after one eager step a forward + backward can be captured in ``torch.cuda.CUDAGraph`` and
replayed (bit-identical to eager: the same kernels on the same addresses; ``docs/kernels_performance.md``
section 4).  The backward's host time is dominated by the autograd engine; measured host time of
the fake-quant forward (``quantized_weights()``) and backward: ``docs/kernels_performance.md`` section 2.

Stacked weights (``stacked=True``).  One parameter ``weight`` ``[N, out, in]`` (and ``bias``
``[N, out]``) instead of N: the fake quant is one stacked call (``kernels.fake_quant``, one autograd
node with one input), so its host cost does not grow with N the way a list's does (N output views,
N table keys and an N-input autograd node; ``docs/kernels_performance.md`` section 2).  The state dict keeps the per-expert keys ``weight{i}`` /
``bias{i}`` (views of the rows), and ``load_state_dict`` takes them (or the stacked key), so either
layout loads the other's checkpoints.  Same bits as the list layout.  Host time of both layouts,
forward and clipped backward: ``docs/kernels_performance.md`` section 2.

Soft gate.  While calibrating, or where the Triton kernels cannot run (no Triton, no GPU and no
interpreter), the per-expert reference loop is used instead; it gives the same bits.

Formats without amax (``mxfp8``, ``mxfp4``, ``fp8_block``, ``int4_group``: each tile's scale comes
from its own data).  The layer holds no amax: ``weight_quantizer`` is empty, the state dict holds the
weights (and biases) alone, ``amax_vector()`` is ``None``, the kernel and the reference loop are
called with ``amax=None``, and calibration has nothing to observe.
"""

from __future__ import annotations

import contextlib
import operator
from typing import Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from . import checks, env
from .autograd import fake_quant_experts_ste, fake_quant_stacked_ste
from .formats import format_spec, parse_spec

BACKENDS = ("auto", "kernel", "reference")
_data_ptr = torch.Tensor.data_ptr


class WeightAmax(nn.Module):
    """One expert's weight quantizer state: the ``_amax`` buffer (fp32, ``()`` or ``[out]``)."""

    def __init__(self, shape: tuple[int, ...], device: torch.device | str | None = None) -> None:
        super().__init__()
        self.register_buffer("_amax", torch.zeros(shape, dtype=torch.float32, device=device))


class QuantGroupedLinear(nn.Module):
    """Grouped linear layer (``y_i = x_i @ fq(w_i)^T + b_i`` per expert) with weight fake quant.

    * ``num_gemms``, ``in_features``, ``out_features``, ``bias``, ``params_dtype``, ``device``: as TE.
    * ``fmt``: a format of ``kernels.FORMATS`` (``int8``, ``int4``, ``fp8_e4m3``, ``nvfp4``, and the
      formats without amax: ``mxfp8``, ``mxfp4``, ``fp8_block``, ``int4_group``, which hold no amax
      buffers); ``options`` as ``kernels.fake_quant_experts`` (``tile_2d`` included).
    * ``per_channel``: amax ``[out]`` per expert instead of a scalar (not for NVFP4 nor the formats without amax).
    * ``ste_mode``: ``pass_through`` (default) or ``clipped``.
    * ``backend``: ``auto`` (kernel unless calibrating or unsupported), ``kernel`` or ``reference``.
    * ``check_values``: the kernel's value checks (``True``: asynchronous, ``"sync"``, ``False``).
    * ``stacked``: one ``[N, out, in]`` parameter instead of N (see the module docstring).
    """

    def __init__(
        self,
        num_gemms: int,
        in_features: int,
        out_features: int,
        fmt: str,
        *,
        bias: bool = False,
        params_dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str | None = None,
        per_channel: bool = False,
        ste_mode: str = "pass_through",
        backend: str = "auto",
        check_values: bool | str = True,
        stacked: bool = False,
        **options,
    ) -> None:
        super().__init__()
        parse_spec(fmt, None, options)
        if per_channel:
            format_spec(fmt).check_granularity("per_channel")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        self.num_gemms, self.in_features, self.out_features = num_gemms, in_features, out_features
        self.fmt, self.options, self.ste_mode, self.backend = fmt, dict(options), ste_mode, backend
        self.per_channel, self.stacked = per_channel, stacked
        if stacked:
            w = torch.empty(num_gemms, out_features, in_features, dtype=params_dtype, device=device)
            self.weight = nn.Parameter(nn.init.normal_(w, 0.0, 0.023))
            if bias:
                self.bias = nn.Parameter(torch.zeros(num_gemms, out_features, dtype=params_dtype, device=device))
        for i in range(0 if stacked else num_gemms):
            w = torch.empty(out_features, in_features, dtype=params_dtype, device=device)
            self.register_parameter(f"weight{i}", nn.Parameter(nn.init.normal_(w, 0.0, 0.023)))
            if bias:
                self.register_parameter(f"bias{i}", nn.Parameter(torch.zeros(out_features, dtype=params_dtype, device=device)))
        shape = (out_features,) if per_channel else ()
        self.takes_amax = format_spec(fmt).takes_amax
        """``False`` for a format whose scales come from the data: no amax buffers (``weight_quantizer`` empty)."""
        self.weight_quantizer = nn.ModuleList([WeightAmax(shape, device) for _ in range(num_gemms if self.takes_amax else 0)])
        self.use_bias = bias
        self.check_values = checks.check_mode(check_values)
        self._calibrating = False
        self._vec: torch.Tensor | None = None
        self._rows: tuple[torch.Tensor, ...] = ()
        self._row_ptrs: list[int] = []
        self._wnames = tuple(f"weight{i}" for i in range(num_gemms))
        self._bnames = tuple(f"bias{i}" for i in range(num_gemms)) if bias else ()
        self.register_load_state_dict_post_hook(lambda module, keys: module.invalidate_amax_cache())

    # ---- experts -------------------------------------------------------------------------
    def weights(self) -> list[torch.Tensor]:
        """The N expert weights ``[out, in]`` (with ``stacked``: views of the rows of ``weight``)."""
        if self.stacked:
            return list(self.weight.unbind(0))
        p = self._parameters
        return [p[k] for k in self._wnames]

    def biases(self) -> list[torch.Tensor]:
        """The N expert biases ``[out]`` (``[]`` without bias)."""
        if not self.use_bias:
            return []
        if self.stacked:
            return list(self.bias.unbind(0))
        p = self._parameters
        return [p[k] for k in self._bnames]

    def _device(self) -> torch.device:
        return self.weight.device if self.stacked else self.weight0.device

    # ---- state dict: per-expert keys in both layouts -------------------------------------
    def _save_to_state_dict(self, destination, prefix, keep_vars):  # type: ignore[override]
        super()._save_to_state_dict(destination, prefix, keep_vars)
        if self.stacked:
            for name in ("weight", "bias"):
                t = destination.pop(prefix + name, None)
                for i, row in enumerate(() if t is None else t.unbind(0)):
                    destination[f"{prefix}{name}{i}"] = row

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):  # type: ignore[override]
        """With ``stacked``: ``weight{i}`` / ``bias{i}`` are stacked into ``weight`` / ``bias``
        (a key left out keeps the current row, and is reported missing)."""
        if self.stacked:
            for name in ("weight", "bias") if self.use_bias else ("weight",):
                keys = [f"{prefix}{name}{i}" for i in range(self.num_gemms)]
                if prefix + name in state_dict or not any(k in state_dict for k in keys):
                    continue
                current = getattr(self, name).detach()
                rows = []
                for i, k in enumerate(keys):
                    if k in state_dict:
                        rows.append(state_dict.pop(k))
                    else:
                        missing_keys.append(k)
                        rows.append(current[i])
                try:
                    state_dict[prefix + name] = torch.stack([r.to(current.device) for r in rows])
                except RuntimeError as exc:
                    error_msgs.append(f"{name}0..{name}{self.num_gemms - 1} do not stack into {prefix}{name} {tuple(current.shape)}: {exc}")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def amax_buffers(self) -> list[torch.Tensor]:
        return [q._buffers["_amax"] for q in self.weight_quantizer._modules.values()]

    # ---- amax cache ----------------------------------------------------------------------
    def invalidate_amax_cache(self) -> None:
        """Forget the gathered vector (the next forward re-gathers)."""
        self._vec = None
        self._rows = ()

    def _aliased(self, bufs: Sequence[torch.Tensor]) -> bool:
        """Every buffer is still the row view registered at the last gather and still points at it
        (``.data =`` keeps the object but moves the storage)."""
        rows = self._rows
        if self._vec is None or len(bufs) != len(rows):
            return False
        return all(map(operator.is_, bufs, rows)) and list(map(_data_ptr, bufs)) == self._row_ptrs

    def amax_vector(self) -> torch.Tensor | None:
        """The experts' amax as one fp32 ``[N]`` / ``[N, out]`` tensor (cached; see the module docstring);
        ``None`` for a format without amax."""
        if not self.takes_amax:
            return None
        bufs = self.amax_buffers()
        if not self._aliased(bufs):
            device = self._device() if self.num_gemms else torch.device("cpu")
            vec = torch.stack([b.detach().to(device=device, dtype=torch.float32) for b in bufs]) if bufs else torch.zeros(0)
            for q, row in zip(self.weight_quantizer, vec):
                q._amax = row
            self._vec = vec
            self._rows = tuple(self.amax_buffers())
            self._row_ptrs = [b.data_ptr() for b in self._rows]
        return self._vec

    # ---- calibration ---------------------------------------------------------------------
    @contextlib.contextmanager
    def calibrate(self) -> Iterator[None]:
        """Within the block, each forward folds ``max |w|`` into the amax buffers (running max) and
        quantizes with the reference loop (the soft gate)."""
        self._calibrating = True
        try:
            yield
        finally:
            self._calibrating = False

    def _observe_weights(self) -> None:
        from moe_fq_parity.reference import max_calibrate, update_running_amax  # soft-gate path only

        if not self.takes_amax:
            return  # scales from the data: nothing to calibrate
        gran = "per_channel" if self.per_channel else "per_tensor"
        with torch.no_grad():
            for q, w in zip(self.weight_quantizer, self.weights()):
                new = max_calibrate(w, gran).to(q._amax.device)
                q._amax.copy_(update_running_amax(q._amax, new))

    # ---- forward -------------------------------------------------------------------------
    def use_kernel(self) -> bool:
        """Whether the next forward runs the Triton kernel (else the reference loop)."""
        if self.backend == "reference" or self._calibrating:
            return False
        if self.backend == "kernel":
            return True
        return self.num_gemms > 0 and env.kernel_supported(self._device())

    def quantized_weights(self) -> list[torch.Tensor]:
        """The N fake-quantized weights, differentiable through the straight-through estimator."""
        if self.stacked:
            return list(self.quantized_weight().unbind(0)) if self.num_gemms else []
        if self._calibrating:
            self._observe_weights()
        ws = self.weights()
        amax = self.amax_vector()
        return fake_quant_experts_ste(
            ws, amax, self.fmt, ste_mode=self.ste_mode, use_kernel=self.use_kernel(), check_values=self.check_values, **self.options
        )

    def quantized_weight(self) -> torch.Tensor:
        """With ``stacked``: the fake-quantized ``[N, out, in]`` weight, differentiable through the
        straight-through estimator (one autograd node, one launch)."""
        if not self.stacked:
            raise AttributeError("quantized_weight() is the stacked layer's; this layer has N weights: use quantized_weights()")
        if self._calibrating:
            self._observe_weights()
        return fake_quant_stacked_ste(self.weight, self.amax_vector(), self.fmt, ste_mode=self.ste_mode, use_kernel=self.use_kernel(),
                                      check_values=self.check_values, **self.options)

    def forward(self, inp: torch.Tensor, m_splits: Sequence[int]) -> torch.Tensor:
        """``inp`` ``[T, in]`` split by ``m_splits`` (N non-negative ints summing to T) -> ``[T, out]``."""
        if len(m_splits) != self.num_gemms or sum(m_splits) != inp.shape[0] or min(m_splits, default=0) < 0:
            raise ValueError(f"m_splits {list(m_splits)} does not split {inp.shape[0]} rows over {self.num_gemms} experts")
        # unbind: one autograd node whose backward stacks the N gradients (indexing row by row
        # would give each row's backward a zero-filled [N, out, in] tensor)
        wq = self.quantized_weight().unbind(0) if self.stacked and self.num_gemms else self.quantized_weights()
        xs = inp.split(list(m_splits))
        if self.use_bias:
            ys = [F.linear(x, w, b) for x, w, b in zip(xs, wq, self.biases())]
        else:
            ys = [F.linear(x, w) for x, w in zip(xs, wq)]
        return torch.cat(ys) if ys else inp.new_zeros(0, self.out_features)
