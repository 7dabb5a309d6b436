"""Transformer Engine's quantizer roles and a role-addressed quantizer factory, in pure Python.

TE names every tensor slot a module asks a quantizer for with a ``QuantizerRole(module_type,
tensor_type, name)`` (all fields default ``""``).  Modules list their slots with
``get_quantizer_roles(fwd=..., num_quantizers=...)``: a base pattern repeated cyclically up to
``num_quantizers`` (per GEMM: 3 forward slots, 2 backward); the slot of a module's own output
(forward) and of its grad-input (backward) is ``None`` (consumer unknown) unless set.  A custom
recipe's factory gets each role and returns a quantizer (``recipe_state_create`` models
``RecipeState.create(..., roles=...)``: one factory call per role, in order).

Base patterns (``ROLE_PATTERNS``; ``name`` is the module's name, ``N`` its GEMM count):

=================  ============================================================  ==========================================
module kind        forward                                                       backward
=================  ============================================================  ==========================================
``linear``         linear/input, linear/weight, None                            linear/grad_output, None
``grouped_linear`` grouped_linear/input, grouped_linear/weight, None (x N)       grouped_linear/grad_output, None (x N)
``layernorm_mlp``  fc1 input, fc1 weight, fc2 input, fc2 input, fc2 weight, None  fc1 grad_output, None, fc2 grad_output,
                   (module_type ``linear``, names ``{name}.fc1``/``{name}.fc2``)  fc1 grad_output
=================  ============================================================  ==========================================

(``Linear`` and ``LayerNormLinear`` are ``linear``; LayerNormMLP labels internal boundary tensors by
their consumer: fc1's output is fc2's input, fc2's grad-input is fc1's grad_output.)

Factories (``QuantizerSpec``), as TE documents its built-in-equivalent factories:

* ``current_scaling_factory`` -- FP8 current scaling: ``grad_output`` -> E5M2, every other role
  (``None`` included) -> E4M3 (our reference format ``fp8_e4m3``, variant ``te_current``);
* ``nvfp4_factory`` -- E2M1: ``linear``/``grouped_linear`` weights 16x16 2-D tiles, no RHT, no
  stochastic rounding; ``grad_output`` 1x16 with RHT and stochastic rounding; inputs and unknown
  roles 1x16 with RHT.

Transformer Engine itself imports only with CUDA and cuDNN; ``real_te()`` gives it where it does,
the reason otherwise.  The report row built on these roles is ``checks_te_roles``'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional, Sequence

from .te_adapter import te_available

TE_MODULE_KINDS: tuple[str, ...] = ("linear", "grouped_linear", "layernorm_mlp")
TE_TENSOR_TYPES: tuple[str, ...] = ("input", "weight", "grad_output")


@dataclass(frozen=True)
class QuantizerRole:
    """TE's role of one quantizer slot; empty fields are unknown (``str`` joins the known ones)."""

    module_type: str = ""
    tensor_type: str = ""
    name: str = ""

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in (("module_type", self.module_type), ("tensor_type", self.tensor_type), ("name", self.name)) if v]
        return "|".join(parts) if parts else "QuantizerRole()"


def _pattern(kind: str, name: str, fwd: bool) -> list[Optional[QuantizerRole]]:
    if kind not in TE_MODULE_KINDS:
        raise ValueError(f"module kind must be one of {TE_MODULE_KINDS}, got {kind!r}")
    if kind == "layernorm_mlp":
        fc1, fc2 = (f"{name}.fc1", f"{name}.fc2") if name else ("fc1", "fc2")
        r = lambda t, n: QuantizerRole("linear", t, n)  # noqa: E731
        if fwd:
            return [r("input", fc1), r("weight", fc1), r("input", fc2), r("input", fc2), r("weight", fc2), None]
        return [r("grad_output", fc1), None, r("grad_output", fc2), r("grad_output", fc1)]
    if fwd:
        return [QuantizerRole(kind, "input", name), QuantizerRole(kind, "weight", name), None]
    return [QuantizerRole(kind, "grad_output", name), None]


ROLE_PATTERNS = {(k, fwd): _pattern(k, "{name}", fwd) for k in TE_MODULE_KINDS for fwd in (True, False)}
"""The base patterns with the placeholder name ``{name}`` (documentation and tests)."""


def num_quantizers(kind: str, fwd: bool, num_gemms: int = 1) -> int:
    """Slots a module asks for: 3 forward / 2 backward per GEMM (LayerNormMLP: 2 GEMMs)."""
    gemms = 2 if kind == "layernorm_mlp" else (num_gemms if kind == "grouped_linear" else 1)
    return (3 if fwd else 2) * gemms


def quantizer_roles(kind: str, name: str = "", *, fwd: bool, num_quantizers: int) -> list[Optional[QuantizerRole]]:
    """``get_quantizer_roles``: the base pattern of ``kind`` repeated up to ``num_quantizers``."""
    base = _pattern(kind, name, fwd)
    return [base[i % len(base)] for i in range(num_quantizers)]


@dataclass(frozen=True)
class QuantizerSpec:
    """What a factory returns for a role: element dtype, scaling tile ``(rows, cols)`` (``None``:
    per tensor), randomized Hadamard transform, stochastic rounding, and the reference format and
    variant that computes it here (``None`` where the reference has no such format)."""

    recipe: str
    dtype: str
    tile: Optional[tuple[int, int]] = None
    rht: bool = False
    stochastic_rounding: bool = False
    reference: Optional[tuple[str, str]] = None


def current_scaling_factory(role: Optional[QuantizerRole]) -> QuantizerSpec:
    """E5M2 for ``grad_output``, E4M3 otherwise (``None`` included)."""
    if role is not None and role.tensor_type == "grad_output":
        return QuantizerSpec("current_scaling", "e5m2")
    return QuantizerSpec("current_scaling", "e4m3", reference=("fp8_e4m3", "te_current"))


def nvfp4_factory(role: Optional[QuantizerRole]) -> QuantizerSpec:
    """16x16 tiles for GEMM weights of linear/grouped_linear, 1x16 otherwise (see module docstring)."""
    gemm = role is not None and role.module_type in ("linear", "grouped_linear")
    if gemm and role.tensor_type == "weight":
        return QuantizerSpec("nvfp4", "e2m1", (16, 16), rht=False, stochastic_rounding=False)
    if gemm and role.tensor_type == "grad_output":
        return QuantizerSpec("nvfp4", "e2m1", (1, 16), rht=True, stochastic_rounding=True)
    return QuantizerSpec("nvfp4", "e2m1", (1, 16), rht=True, stochastic_rounding=False, reference=("nvfp4", "te"))


FACTORIES: dict[str, Callable[[Optional[QuantizerRole]], QuantizerSpec]] = {
    "current_scaling": current_scaling_factory,
    "nvfp4": nvfp4_factory,
}


def recipe_state_create(factory: Callable[[Optional[QuantizerRole]], QuantizerSpec], roles: Sequence[Optional[QuantizerRole]]) -> list[QuantizerSpec]:
    """One quantizer per role, in role order (``RecipeState.create(recipe, mode, num, roles=roles)``
    of a custom recipe); ``ValueError`` when ``roles`` is empty."""
    if not roles:
        raise ValueError("roles must not be empty: one quantizer is made per role")
    return [factory(r) for r in roles]


def real_te() -> tuple[Optional[object], str]:
    """``(transformer_engine.pytorch, "")`` when it imports here with ``QuantizerRole``, else ``(None, reason)``."""
    ok, why = te_available()
    if not ok:
        return None, f"{why}; roles and factories checked against TE's documented behaviour only"
    import transformer_engine.pytorch as te  # an optional extra: imported only where te_available() says it can be

    if not hasattr(getattr(te, "quantization", None), "QuantizerRole"):
        return None, "this transformer_engine has no quantization.QuantizerRole"
    return te, ""
