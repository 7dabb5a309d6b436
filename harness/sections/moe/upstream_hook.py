"""Megatron-Core's grouped-key load pre-hook as a backend of the state-dict checks, beside ours.

Megatron-LM's ``TEGroupedLinear._normalize_grouped_parameter_keys`` (with
``_split_grouped_checkpoint_tensor``) first shipped in megatron-core **0.18.0** (it came with the
combined fused-MLP change of 2026-05-15); 0.16.x and 0.17.x do not have it, and 0.17+ needs
Python >= 3.12.  Importing it also needs Transformer Engine (the class is defined only when TE
imports), so on a CPU host ``upstream_hook()`` gives the reason instead.

``HOOK_CASES`` are the situations the hook decides on; ``EXPECTED`` is what the upstream code does
in each (read from its source: stack when the module is single-grouped, no grouped key and *all*
indexed keys are present; split when the module is indexed, the grouped key is present and *no*
indexed key is; ``bias`` only when the module uses a bias; split by unbind when dim 0 is N, by
chunk when a multiple of N, else an error naming the key and the shape).  ``tests/moe`` checks our
hook against ``EXPECTED``; ``backend_rows`` runs both hooks on every case where the upstream one
imports and reports where they differ.  Known difference, by design: upstream raises
``RuntimeError`` for an unsplittable tensor, ours ``ValueError`` (same message content).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from moe_fq_parity.cases.inputs import seed_for_id
from moe_fq_parity.harness.sections import SectionRow

from .compare import RowSink
from .layers import GroupedLinearTwin
from .roles import Role

N, OUT, IN = 3, 4, 5


@dataclass(frozen=True)
class HookCase:
    """A module (``single``: single grouped weight and bias; ``bias``: uses a bias) and the keys
    of the checkpoint handed to its pre-hook (``weight``/``bias``: grouped ``[N, ...]``,
    ``weight_packed``: ``[N*out, in]``, ``weight{i}``/``bias{i}``: indexed, ``weight_bad``: dim 0
    neither N nor a multiple)."""

    name: str
    single: bool
    bias: bool
    keys: tuple[str, ...]


HOOK_CASES: tuple[HookCase, ...] = (
    HookCase("indexed_to_single", True, True, ("weight0", "weight1", "weight2", "bias0", "bias1", "bias2")),
    HookCase("single_to_indexed", False, True, ("weight", "bias")),
    HookCase("packed_to_indexed", False, False, ("weight_packed",)),
    HookCase("grouped_beside_partial_indexed", False, False, ("weight", "weight0")),
    HookCase("partial_indexed_into_single", True, False, ("weight0", "weight1")),
    HookCase("both_layouts_into_single", True, False, ("weight", "weight0", "weight1", "weight2")),
    HookCase("bias_unused_indexed", False, False, ("weight", "bias")),
    HookCase("bias_unused_single", True, False, ("weight0", "weight1", "weight2", "bias0", "bias1", "bias2")),
    HookCase("unsplittable", False, False, ("weight_bad",)),
)

EXPECTED: dict[str, tuple[str, ...] | str] = {
    "indexed_to_single": ("weight", "bias"),
    "single_to_indexed": ("weight0", "weight1", "weight2", "bias0", "bias1", "bias2"),
    "packed_to_indexed": ("weight0", "weight1", "weight2"),
    "grouped_beside_partial_indexed": ("weight", "weight0"),
    "partial_indexed_into_single": ("weight0", "weight1"),
    "both_layouts_into_single": ("weight", "weight0", "weight1", "weight2"),
    "bias_unused_indexed": ("weight0", "weight1", "weight2", "bias"),
    "bias_unused_single": ("weight", "bias0", "bias1", "bias2"),
    "unsplittable": "error: Cannot split checkpoint tensor",
}
"""Keys after the upstream hook (as a set), or ``"error: <message start>"``."""


def case_state_dict(case: HookCase, seed: int = 0) -> dict[str, torch.Tensor]:
    """Distinct values for every key of ``case`` (so a moved or overwritten tensor is visible),
    drawn from ``seed`` (the rows use ``seed_for_id("megatron_hook/{case}", section seed)``)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(N, OUT, IN, generator=g)
    b = torch.randn(N, OUT, generator=g)
    make = {
        "weight": lambda: w.clone(), "bias": lambda: b.clone(), "weight_packed": lambda: w.reshape(N * OUT, IN).clone(),
        "weight_bad": lambda: torch.randn(N * OUT + 1, IN, generator=g),
        **{f"weight{i}": (lambda i=i: w[i].clone() + 100) for i in range(N)},
        **{f"bias{i}": (lambda i=i: b[i].clone() + 100) for i in range(N)},
    }
    return {("weight" if k in ("weight_packed", "weight_bad") else k): make[k]() for k in case.keys}


def _twin(case: HookCase) -> GroupedLinearTwin:
    return GroupedLinearTwin(N, IN, OUT, bias=case.bias, single_grouped_weight=case.single)


def run_ours(case: HookCase, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | str:
    """Our twin's load pre-hooks on a copy of ``sd``: the resulting dict, or ``"error: ..."``."""
    work = dict(sd)
    module = _twin(case)  # the hooks hold the module weakly: keep it alive while they run
    try:
        for hook in module._load_state_dict_pre_hooks.values():
            hook(work, "", {}, True, [], [], [])
    except (ValueError, RuntimeError) as exc:
        return f"error: {exc}"
    return work


UpstreamHook = Callable[..., None]


def upstream_hook() -> tuple[Optional[tuple[UpstreamHook, Callable]], str]:
    """``((hook, split), "")`` from the installed Megatron-Core, or ``(None, reason)``."""
    try:
        from importlib.metadata import version

        mcore = version("megatron-core")
    except Exception:
        return None, "megatron-core is not installed (pip install 'moe-fq-parity[megatron]'); the grouped-key hook ships from 0.18.0"
    try:
        with warnings.catch_warnings():  # megatron-core warns about every optional accelerator it lacks
            warnings.simplefilter("ignore")
            from megatron.core.extensions.transformer_engine import TEGroupedLinear
    except Exception as exc:  # TE missing: the class is not defined
        return None, f"megatron-core {mcore}: TEGroupedLinear not importable here ({type(exc).__name__}: {exc}); it needs Transformer Engine"
    hook = getattr(TEGroupedLinear, "_normalize_grouped_parameter_keys", None)
    split = getattr(TEGroupedLinear, "_split_grouped_checkpoint_tensor", None)
    if hook is None or split is None:
        return None, f"megatron-core {mcore} has no TEGroupedLinear._normalize_grouped_parameter_keys (first shipped in 0.18.0)"
    return (hook, split), ""


class _UpstreamSelf:
    """What the upstream hook reads from ``self``: counts, layout flags and the split helper."""

    def __init__(self, case: HookCase, split: Callable) -> None:
        self.num_gemms, self.use_bias = N, case.bias
        self.single_grouped_weight = self.single_grouped_bias = case.single
        self._split = split

    def _split_grouped_checkpoint_tensor(self, tensor: torch.Tensor, key: str) -> list[torch.Tensor]:
        return self._split(self, tensor, key)


def run_upstream(hooks: tuple[UpstreamHook, Callable], case: HookCase, sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | str:
    hook, split = hooks
    work = dict(sd)
    try:
        hook(_UpstreamSelf(case, split), work, "", {}, True, [], [], [])
    except (ValueError, RuntimeError) as exc:
        return f"error: {exc}"
    return work


def outcome_diff(a: dict[str, torch.Tensor] | str, b: dict[str, torch.Tensor] | str) -> str:
    """Empty when both hooks left the same keys with bitwise-equal tensors, or both raised an
    error with the same message start; else what differs."""
    if isinstance(a, str) or isinstance(b, str):
        same = isinstance(a, str) and isinstance(b, str) and a[:36] == b[:36]
        return "" if same else f"{str(a)[:120] if isinstance(a, str) else sorted(a)} vs {str(b)[:120] if isinstance(b, str) else sorted(b)}"
    if set(a) != set(b):
        return f"keys {sorted(a)} vs {sorted(b)}"
    bits = lambda t: t.contiguous().view(-1).view(torch.int32)  # noqa: E731
    bad = [k for k in a if a[k].shape != b[k].shape or not torch.equal(bits(a[k]), bits(b[k]))]
    return f"tensors differ: {bad}" if bad else ""


def backend_rows(sink: RowSink, name: str) -> None:
    """``megatron_hook/{case}`` rows: the upstream hook vs ours on every case, or one skip row."""
    role = Role("grouped_linear", "weight", name)
    hooks, why = upstream_hook()
    if hooks is None:
        rid = sink.row_id(role, "megatron_hook")
        sink.rows.append(SectionRow(id=rid, verdict="skip", fields={**sink.base_fields, "role": role.id, "check": "megatron_hook", "measured": why},
                                    repro=sink.repro(rid), message=why))
        return
    for case in HOOK_CASES:
        check = f"megatron_hook/{case.name}"
        with sink.guard(role, check):
            sd = case_state_dict(case, seed_for_id(f"megatron_hook/{case.name}", sink.seed))
            diff = outcome_diff(run_upstream(hooks, case, sd), run_ours(case, sd))
            sink.add(role, check, ok=not diff, expected="upstream hook and ours leave the same keys and bits", measured=diff or "same", detail=diff)
