"""The MoE calibration-semantics section of the report: ``run(suite, seed, device) -> Section``.

For every layer (``fc1``, ``fc2``) of the suite and every recipe (format, granularity, STE mode)
it builds the calibrated models of ``bench`` with the grouped layer from the twin -- and, on a
CUDA device where Transformer Engine imports, from the real ``GroupedLinear`` too -- and runs
the weight, input and state-dict checks.  Row ids:
``{backend}/{spec}/{N}/{out}x{in}/{module_type}/{tensor_type}/{name}/{check}/s{seed}``.

With the real module, ``te_vs_twin/...`` rows compare every model's amax and outputs between the
two backends bitwise.  Without it one ``skip`` row gives the reason.

``run(..., part=Part(i, n))`` runs part ``i`` of ``n`` (a shard's share): the section's blocks are
the TE skip row ``(0,)``, each layer's layout rows ``(1, layer, 0)`` and each (layer, recipe)
``(1, layer, 1 + recipe)``; a part runs the blocks it owns (``Part.owned`` with ``block_weight``),
building a layer's expert data only when it owns one of that layer's blocks.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from typing import Optional

import torch

from moe_fq_parity.cases.catalogue import parse_suite, suite_table
from moe_fq_parity.cases.inputs import seed_for_id
from moe_fq_parity.cases.shapes import NEMOTRON, NEMOTRON_EXPERTS
from moe_fq_parity.harness.core.equality import bit_diff
from moe_fq_parity.harness.sections import Part, Section, SectionRow, section_from_blocks
from moe_fq_parity.reference.formats import format_spec

from .bench import Bench, build_bench
from .checks_input import input_rows
from .checks_loss import loss_rows
from .checks_state import layout_rows, quantizer_state_rows
from .checks_te_roles import te_role_rows
from .checks_weight import ROUTINGS, weight_rows
from .compare import RowSink
from .data import ExpertShape, make_expert_data
from .roles import QuantSpec, Recipe, Role
from .te_adapter import te_available
from .upstream_hook import backend_rows

COLUMNS = ["backend", "spec", "shape", "role", "check", "expected", "measured", "mismatches"]


@dataclass(frozen=True)
class SuiteConfig:
    """Layers ``(name, shape)`` and ``(weight spec, input spec)`` pairs of one suite."""

    layers: tuple[tuple[str, ExpertShape], ...]
    specs: tuple[tuple[QuantSpec, QuantSpec], ...]


def _pair(fmt: str, gran: str, ste: str = "pass_through", variant: str | None = None) -> tuple[QuantSpec, QuantSpec]:
    return QuantSpec(fmt, gran, ste, variant), QuantSpec(fmt, "per_tensor", ste, variant)


_CORE = (_pair("fp8_e4m3", "per_tensor"), _pair("int8", "per_channel"), _pair("nvfp4", "per_tensor"))
_CI = _CORE + (_pair("int8", "per_tensor", "clipped"), _pair("fp8_e4m3", "per_channel", "clipped"), _pair("int4", "per_channel"))


def _mlp(n: int, hidden: int, ffn: int, tokens: int) -> tuple[tuple[str, ExpertShape], ...]:
    return (("fc1", ExpertShape(n, ffn, hidden, tokens)), ("fc2", ExpertShape(n, hidden, ffn, tokens)))


def _nemotron(model: str, ep: int, tokens: int) -> tuple[tuple[str, ExpertShape], ...]:
    """The routed-expert layers of Nemotron 3 ``model`` (``cases.shapes.NEMOTRON``) at expert
    parallelism ``ep``: ``NEMOTRON_EXPERTS[model] // ep`` local experts."""
    n = NEMOTRON_EXPERTS[model] // ep
    return tuple((fc, ExpertShape(n, *NEMOTRON[model][fc], tokens)) for fc in ("fc1", "fc2"))


SUITES: dict[str, SuiteConfig] = suite_table({
    "smoke": SuiteConfig(_mlp(4, 64, 32, 48), _CORE),
    "ci": SuiteConfig(_mlp(8, 72, 96, 160), _CI),
    "nightly": SuiteConfig(_mlp(16, 1024, 512, 2048), _CI + (_pair("nvfp4", "per_tensor", variant="modelopt_static"),)),
    "ultra": SuiteConfig(_nemotron("nano", 4, 4096), _CORE),
}, what="MoE section SUITES")
"""``ci`` uses in/out features that are not multiples of 16 (short NVFP4 blocks); ``ultra`` is
Nemotron 3 Nano's routed expert at EP=4 (N=32, fc1 ``[1856, 2688]``, fc2 ``[2688, 1856]``)."""


LAYOUT_WEIGHT, BLOCK_SCALED_WEIGHT = 0.5, 1.6
"""Cost of a block relative to a recipe's, for cutting the section into parts: a layer's layout rows
cost about half a recipe, a recipe of a two-level block-scaled format (``FormatSpec.block``: NVFP4)
about 1.6 (its reference computes block scales).  Chosen by measurement: docs/measured.md §13."""


def block_weight(cfg: SuiteConfig, recipe: int) -> float:
    """The partition weight of block ``(1, layer, recipe)`` (0: the layout rows)."""
    if recipe == 0:
        return LAYOUT_WEIGHT
    return BLOCK_SCALED_WEIGHT if format_spec(cfg.specs[recipe - 1][0].fmt).block is not None else 1.0


def te_vs_twin_rows(twin: Bench, te: Bench, sink: RowSink) -> None:
    """Every model's amax and outputs: real TE bench vs twin bench, bitwise."""
    role = Role("grouped_linear", "weight", twin.name)
    models = {**{f"weight_layout/{k}": v for k, v in twin.weight_models.items()}, **{f"input_layout/{k}": v for k, v in twin.input_models.items()}}
    te_models = {**{f"weight_layout/{k}": v for k, v in te.weight_models.items()}, **{f"input_layout/{k}": v for k, v in te.input_models.items()}}
    for label, m in models.items():
        check = f"te_vs_twin/{label}"
        with sink.guard(role, check):
            t = te_models[label]
            exp = m.weight_amax() + m.input_amax() + [twin.outputs(m, r) for r in ROUTINGS]
            got = t.weight_amax() + t.input_amax() + [te.outputs(t, r) for r in ROUTINGS]
            sink.add_diff(role, check, bit_diff(exp, got, label="weight amax, input amax, outputs #"))


def run(suite: str, seed: int, device: str, part: Optional[Part] = None) -> Section:
    """All MoE rows for ``suite`` (smoke/ci/nightly/ultra) from ``seed`` on ``device``, or ``part``
    of them (see the module docstring)."""
    cfg = SUITES[parse_suite(suite)]
    dev = torch.device(device)
    te_ok, te_why = te_available() if dev.type == "cuda" else (False, f"device {device} is not CUDA")
    backends = ["twin"] + (["te"] if te_ok else [])
    plan = [(li, ri) for li in range(len(cfg.layers)) for ri in range(1 + len(cfg.specs))]  # ri 0: the layer's layout rows
    owned = dict(zip(plan, part.owned([block_weight(cfg, ri) for _, ri in plan]) if part is not None else [True] * len(plan)))
    blocks: list[tuple[tuple[int, ...], list[SectionRow]]] = []
    if not te_ok and (part is None or part.index == 1):
        blocks.append(((0,), [SectionRow(id=f"te/real_grouped_linear/s{seed}", verdict="skip",
                                         fields={"backend": "te", "check": "real GroupedLinear checks", "measured": te_why}, message=te_why)]))
    with tempfile.TemporaryDirectory(prefix="moe_sd_") as tmp:
        for li, (name, shape) in enumerate(cfg.layers):
            if not any(owned[(li, ri)] for ri in range(1 + len(cfg.specs))):
                continue
            data = make_expert_data(shape, seed_for_id(f"{name}/{shape.id}", seed), dev)
            if owned[(li, 0)]:
                base = dict(backend="twin", spec="any", shape=shape.id)
                sink = RowSink(f"twin/any/{shape.id}", suite, seed, device, base)
                layout_rows(shape, data, name, sink, tmp, dev)
                backend_rows(sink, name)
                blocks.append(((1, li, 0), sink.rows))
            for ri, (wspec, ispec) in enumerate(cfg.specs, start=1):
                if not owned[(li, ri)]:
                    continue
                rows: list[SectionRow] = []
                recipe = Recipe.uniform([name], wspec, ispec)
                benches: dict[str, Bench] = {}
                for backend in backends:
                    sink = RowSink(f"{backend}/{wspec.id}/{shape.id}", suite, seed, device,
                                   dict(backend=backend, spec=f"{wspec.id} ({wspec.ste_mode})", shape=shape.id))
                    with sink.guard(Role("grouped_linear", "weight", name), "build_and_calibrate"):
                        benches[backend] = bench = build_bench(recipe, name, shape, data, backend=backend, device=dev)
                        weight_rows(bench, sink)
                        input_rows(bench, sink)
                        loss_rows(bench, sink)
                        te_role_rows(bench, sink)
                        if backend == "twin":
                            quantizer_state_rows(bench, sink, tmp, dev)
                    rows += sink.rows
                if "te" in benches and "twin" in benches:
                    sink = RowSink(f"te/{wspec.id}/{shape.id}", suite, seed, device, dict(backend="te", spec=wspec.id, shape=shape.id))
                    te_vs_twin_rows(benches["twin"], benches["te"], sink)
                    rows += sink.rows
                blocks.append(((1, li, ri), rows))
    notes = (
        f"seed {seed}; grouped layer: twin" + (" and real transformer_engine GroupedLinear" if te_ok else f" only ({te_why})")
        + ". Experts that receive no calibration tokens keep input amax +0 (max over the empty set); fake quant then applies "
        "the format's zero-amax rule (INT: zeros, FP8: amax treated as 1, NVFP4: tiny values); Model-Optimizer 0.47 instead leaves "
        "such a quantizer unset and quantizes it dynamically. Per-expert opt-in is explicit per model; routing 'all_routed' sends "
        "tokens to experts that were empty during calibration."
    )
    return section_from_blocks("moe", "MoE calibration semantics: grouped vs sequential experts", COLUMNS, blocks, notes, part)
