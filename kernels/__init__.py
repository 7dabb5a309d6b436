"""Triton grouped fake-quant kernels: one launch for N experts, bit-exact with ``reference``.

Public API (mirrors ``reference.api``):

* ``fake_quant(x, amax, fmt, variant=None, *, check_values=True, **options)`` -- one tensor
  ``[..., out, in]`` (stacked ``[N, out, in]``);
* ``fake_quant_experts(weights, amax, fmt, variant=None, *, check_values=True, **options)`` -- N experts;
* ``ste_backward(x, amax, grad_out, mode)``, ``ste_backward_experts(weights, amax, grads, mode)``;
* ``fake_quant_experts_ste(weights, amax, fmt, *, ste_mode, use_kernel, **options)`` -- autograd;
  ``fake_quant_stacked_ste(weight, amax, fmt, ...)`` the same for one stacked ``[N, out, in]`` weight;
* ``QuantGroupedLinear`` -- module adapter with the cached amax vector and the soft gate (N weights,
  or one stacked weight with ``stacked=True``);
* ``raise_pending_errors(device=None)`` -- raise what an asynchronously checked call found
  (``check_values=True``, the default, never blocks the host: ``kernels/checks.py``).

Importing this package does not import Triton; the kernels are compiled on first use.
"""

from .api import STE_MODES, fake_quant, fake_quant_experts, ste_backward, ste_backward_experts, variants
from .autograd import FakeQuantExpertsFn, FakeQuantStackedFn, fake_quant_experts_ste, fake_quant_stacked_ste
from .checks import raise_pending_errors
from .env import kernel_supported
from .formats import FORMATS
from .module import QuantGroupedLinear, WeightAmax

__all__ = [
    "FORMATS",
    "STE_MODES",
    "FakeQuantExpertsFn",
    "FakeQuantStackedFn",
    "QuantGroupedLinear",
    "WeightAmax",
    "fake_quant",
    "fake_quant_experts",
    "fake_quant_experts_ste",
    "fake_quant_stacked_ste",
    "kernel_supported",
    "raise_pending_errors",
    "ste_backward",
    "ste_backward_experts",
    "variants",
]
