"""Quantizer roles and recipes: which format, granularity and STE mode each consumed tensor gets.

A *role* names one quantized tensor of an expert layer: ``(module_type, tensor_type, name)``,
e.g. ``("grouped_linear", "weight", "fc1")``.  Only tensors a linear layer really consumes are
roles: its ``weight`` and its ``input``.  There is no ``output`` or ``grad_input`` role, and no
``grad_output`` role either, because this package does not quantize gradients (the backward is
only the straight-through estimator of the forward quantizers, ``reference.ste``).

These are the roles *this package* quantizes; Transformer Engine's own vocabulary (module types
``linear``/``grouped_linear``, tensor types ``input``/``weight``/``grad_output``, the slot order of
``get_quantizer_roles`` and role-addressed factories) is ``te_roles``; ``Role.quantizer_role``
maps one to the other.

A *recipe* maps roles to a ``QuantSpec``.  Grouped and sequential layers of the same ``name``
must resolve to the same spec (``Recipe.interchangeable``), otherwise comparing them is
meaningless and the recipe is rejected.

Granularity is that of *one expert's* tensor: ``per_tensor`` gives one amax per expert
(a scalar), ``per_channel`` one amax per output row (``[out]``, weights only).  Whether
experts share an amax is the *layout*'s business (``harness.sections.moe.quantizers``), not the spec's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from moe_fq_parity.reference import FORMATS, STE_MODES, format_spec, variants

from .te_roles import QuantizerRole

MODULE_TYPES: tuple[str, ...] = ("grouped_linear", "sequential_linear")
"""``grouped_linear``: Transformer Engine ``GroupedLinear`` (or its twin); ``sequential_linear``:
one ``nn.Linear``-like module per expert (Megatron SequentialMLP's ``local_experts.{i}``)."""

TENSOR_TYPES: tuple[str, ...] = ("weight", "input")
"""Tensors a linear layer consumes and this package quantizes."""

GRANULARITIES: tuple[str, ...] = ("per_tensor", "per_channel")


@dataclass(frozen=True)
class Role:
    """One quantized tensor of one expert layer; ``id`` is ``module_type/tensor_type/name``."""

    module_type: str
    tensor_type: str
    name: str

    def __post_init__(self) -> None:
        if self.module_type not in MODULE_TYPES:
            raise ValueError(f"module_type must be one of {MODULE_TYPES}, got {self.module_type!r}")
        if self.tensor_type not in TENSOR_TYPES:
            raise ValueError(
                f"tensor_type must be one of {TENSOR_TYPES} (tensors that are consumed and quantized), "
                f"got {self.tensor_type!r}"
            )
        if not self.name or "/" in self.name:
            raise ValueError(f"name must be non-empty and contain no '/', got {self.name!r}")

    @property
    def id(self) -> str:
        return f"{self.module_type}/{self.tensor_type}/{self.name}"

    def quantizer_role(self) -> QuantizerRole:
        """The same slot as Transformer Engine names it (``te_roles.QuantizerRole``): a grouped
        layer is TE's ``grouped_linear``, one module per expert is TE's ``linear``."""
        return QuantizerRole("grouped_linear" if self.module_type == "grouped_linear" else "linear", self.tensor_type, self.name)

    def counterpart(self) -> "Role":
        """The same tensor of the other module type (grouped <-> sequential)."""
        other = MODULE_TYPES[1 - MODULE_TYPES.index(self.module_type)]
        return Role(other, self.tensor_type, self.name)


@dataclass(frozen=True)
class QuantSpec:
    """How one role is fake-quantized.

    * ``fmt``: a ``reference.FORMATS`` name.
    * ``granularity``: ``per_tensor`` | ``per_channel`` (per expert tensor), one the format takes
      (``FormatSpec.amax_granularities``: NVFP4 ``per_tensor`` only); inputs: ``per_tensor`` only.
    * ``ste_mode``: ``pass_through`` | ``clipped`` (``reference.STE_MODES``).
    * ``variant``: a ``reference.variants(fmt)`` name, ``None`` for the default.
    * ``options``: format options passed to ``reference.fake_quant`` as sorted ``(key, value)`` pairs.
    """

    fmt: str
    granularity: str
    ste_mode: str = "pass_through"
    variant: str | None = None
    options: tuple[tuple[str, Any], ...] = field(default=())

    def __post_init__(self) -> None:
        if self.fmt not in FORMATS:
            raise ValueError(f"fmt must be one of {FORMATS}, got {self.fmt!r}")
        if self.granularity not in GRANULARITIES:
            raise ValueError(f"granularity must be one of {GRANULARITIES}, got {self.granularity!r}")
        format_spec(self.fmt).check_granularity(self.granularity)
        if self.ste_mode not in STE_MODES:
            raise ValueError(f"ste_mode must be one of {STE_MODES}, got {self.ste_mode!r}")
        if self.variant is not None and self.variant not in variants(self.fmt):
            raise ValueError(f"variant {self.variant!r} is not a variant of {self.fmt}: {variants(self.fmt)}")
        object.__setattr__(self, "options", tuple(sorted(dict(self.options).items())))

    @property
    def id(self) -> str:
        """``fmt[-variant]/granularity``, e.g. ``int8/per_channel``."""
        v = f"-{self.variant}" if self.variant else ""
        return f"{self.fmt}{v}/{self.granularity}"


@dataclass(frozen=True)
class Recipe:
    """An immutable role -> spec mapping, checked at construction.

    Raises ``ValueError`` when a role of one module type has no counterpart of the other type
    or a different spec for it (grouped and sequential layers must be quantized alike).
    """

    specs: tuple[tuple[Role, QuantSpec], ...]

    def __post_init__(self) -> None:
        table = dict(self.specs)
        if len(table) != len(self.specs):
            raise ValueError("a role appears twice in the recipe")
        for role, spec in table.items():
            if role.tensor_type == "input" and spec.granularity != "per_tensor":
                raise ValueError(f"{role.id}: input quantizers are per_tensor, got {spec.granularity}")
            other = table.get(role.counterpart())
            if other is None:
                raise ValueError(f"{role.id} has no counterpart {role.counterpart().id} in the recipe")
            if other != spec:
                raise ValueError(f"{role.id} ({spec}) and {role.counterpart().id} ({other}) differ")

    @classmethod
    def from_mapping(cls, table: Mapping[Role, QuantSpec]) -> "Recipe":
        return cls(tuple(table.items()))

    @classmethod
    def uniform(cls, names: Iterable[str], weight: QuantSpec, input: QuantSpec) -> "Recipe":
        """Every layer ``name`` of both module types gets ``weight`` / ``input`` specs."""
        table: dict[Role, QuantSpec] = {}
        for name in names:
            for mt in MODULE_TYPES:
                table[Role(mt, "weight", name)] = weight
                table[Role(mt, "input", name)] = input
        return cls.from_mapping(table)

    def spec_for(self, role: Role) -> QuantSpec:
        """The spec of ``role``; ``KeyError`` naming the role and the known roles otherwise."""
        for r, s in self.specs:
            if r == role:
                return s
        raise KeyError(f"no spec for role {role.id}; recipe has {[r.id for r, _ in self.specs]}")

    def roles(self) -> list[Role]:
        return [r for r, _ in self.specs]
