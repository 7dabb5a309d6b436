"""State-dict hook mutants: the grouped-key normalisation with one early return broken.

Each mutant swaps one step of ``harness.sections.moe.state_dict`` / ``layers`` for a mutated copy
while the MoE state-dict rows (``checks_state.layout_rows``) run on a small twin; it is *killed*
when some row fails.  The same rows without any mutant (the control) must all pass, or no kill
proves anything: a failing control marks every hook mutant as not killed, with the reason.

Mutants (each is a bug the grouped/indexed key normalisation could plausibly carry):

* ``hook-split-beside-partial-indexed`` -- an indexed module splits the grouped ``weight`` unless
  *all* indexed keys exist (upstream: unless *any* exists); on ``{weight, weight0}`` it overwrites
  ``weight0``;
* ``hook-bias-without-use-bias`` -- the load pre-hook remaps ``bias`` keys of a bias-free module;
* ``optimizer-split-beside-partial-indexed`` / ``optimizer-bias-without-use-bias`` -- the same two
  bugs in the optimizer-side normalisation of flat main params (``normalize_flat_grouped_params``).

Cost: one ``layout_rows`` pass (N=4, 16x32) per mutant plus the control (timed: docs/measured.md §13).
"""

from __future__ import annotations

import tempfile
import time
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from moe_fq_parity.cases.inputs import seed_for_id
from moe_fq_parity.harness.sections.moe import layers, state_dict
from moe_fq_parity.harness.sections.moe.checks_state import layout_rows
from moe_fq_parity.harness.sections.moe.compare import RowSink
from moe_fq_parity.harness.sections.moe.data import ExpertShape, make_expert_data

from .outcomes import MutantOutcome

SHAPE = ExpertShape(4, 16, 32, 24)


def _split_unless_all_indexed(sd, prefix, param, n):
    """``grouped_to_indexed`` whose early return needs *all* indexed keys (the mutation)."""
    keys = state_dict.indexed_keys(prefix, param, n)
    if all(k in sd for k in keys):
        return "target_present"
    if prefix + param not in sd:
        return "absent"
    pieces = state_dict.split_grouped_tensor(prefix + param, sd.pop(prefix + param), n)
    for k, p in zip(keys, pieces):
        sd[k] = p
    return "converted"


def _always_bias(module) -> tuple[str, ...]:
    return ("weight", "bias")


@dataclass(frozen=True)
class HookMutant:
    """``patches``: ``(module, attribute, replacement)`` applied while the rows run."""

    name: str
    bug: str
    patches: tuple[tuple[object, str, Callable], ...]

    @contextmanager
    def applied(self) -> Iterator[None]:
        with ExitStack() as stack:
            for mod, attr, repl in self.patches:
                old = getattr(mod, attr)
                setattr(mod, attr, repl)
                stack.callback(setattr, mod, attr, old)
            yield


HOOK_MUTANTS: tuple[HookMutant, ...] = (
    HookMutant("hook-split-beside-partial-indexed", "load pre-hook splits the grouped weight unless ALL indexed keys exist (upstream: ANY)",
               ((layers, "grouped_to_indexed", _split_unless_all_indexed),)),
    HookMutant("hook-bias-without-use-bias", "load pre-hook remaps bias keys of a module built with bias=False",
               ((layers, "remapped_params", _always_bias),)),
    HookMutant("optimizer-split-beside-partial-indexed", "optimizer-side normalisation splits unless ALL indexed keys exist",
               ((state_dict, "flat_split_blocked", lambda found, n: len(found) == n),)),
    HookMutant("optimizer-bias-without-use-bias", "optimizer-side normalisation remaps bias of a module built with bias=False",
               ((state_dict, "remapped_params", _always_bias),)),
)


def _rows(seed: int) -> list:
    data = make_expert_data(SHAPE, seed_for_id(f"selftest/hooks/{SHAPE.id}", seed))
    sink = RowSink(f"selftest/hooks/{SHAPE.id}", "smoke", seed, "cpu")
    with tempfile.TemporaryDirectory(prefix="hook_mutants_") as tmp:
        layout_rows(SHAPE, data, "fc1", sink, tmp, torch.device("cpu"))
    return sink.rows


def run_hook_mutants(seed: int, names: set[str] | None = None) -> list[MutantOutcome]:
    """Every hook mutant (or those in ``names``): killed by the first failing state-dict row."""
    chosen = [m for m in HOOK_MUTANTS if names is None or m.name in names]
    if not chosen:
        return []
    control = [r for r in _rows(seed) if r.verdict == "fail"]
    outcomes = []
    for m in chosen:
        start = time.perf_counter()
        if control:
            outcomes.append(MutantOutcome(m.name, m.bug, False, "", "",
                                          f"control state-dict rows fail without any mutant: {control[0].id}: {control[0].message[:200]}"))
            continue
        with m.applied():
            rows = _rows(seed)
        failed = [r for r in rows if r.verdict == "fail"]
        secs = time.perf_counter() - start
        if failed:
            check = failed[0].fields.get("check", failed[0].id)
            outcomes.append(MutantOutcome(m.name, m.bug, True, check, "", f"{SHAPE.id}: " + (failed[0].message or failed[0].fields.get("measured", ""))[:300],
                                          len(rows), secs))
        else:
            outcomes.append(MutantOutcome(m.name, m.bug, False, "", "", f"survived {len(rows)} state-dict rows", len(rows), secs))
    return outcomes
