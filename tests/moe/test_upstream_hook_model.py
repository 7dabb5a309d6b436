"""Our grouped-key hook against the behaviour of Megatron-LM's hook as its source shows it.

The installed megatron-core (0.16.1 on Python 3.11) predates the hook (first in 0.18.0, Python
>= 3.12, and importable only with Transformer Engine), so ``EXPECTED`` (the upstream code's
outcome per case) is what our model is held to here; where the upstream hook imports,
``backend_rows`` runs both side by side (plumbing checked below with stand-ins).
"""

from __future__ import annotations

import pytest

from moe_fq_parity.harness.sections.moe import upstream_hook as uh
from moe_fq_parity.harness.sections.moe.compare import RowSink


@pytest.mark.parametrize("case", uh.HOOK_CASES, ids=lambda c: c.name)
def test_our_hook_matches_the_upstream_outcome(case):
    sd = uh.case_state_dict(case)
    got = uh.run_ours(case, sd)
    want = uh.EXPECTED[case.name]
    if isinstance(want, str):
        assert isinstance(got, str) and got.startswith(want), got
        return
    assert not isinstance(got, str), got
    assert sorted(got) == sorted(want)
    for k in got.keys() & sd.keys():
        assert got[k] is sd[k], f"{k} was rewritten though upstream leaves it alone"


def test_every_case_has_an_expectation():
    assert {c.name for c in uh.HOOK_CASES} == set(uh.EXPECTED)


def test_without_the_upstream_hook_one_skip_row_names_why():
    hooks, why = uh.upstream_hook()
    if hooks is not None:
        pytest.skip("the upstream hook imports here: backend rows run for real")
    sink = RowSink("twin/any/N3", "smoke", 0, "cpu")
    uh.backend_rows(sink, "fc1")
    assert [r.verdict for r in sink.rows] == ["skip"] and ("0.18.0" in why or "Transformer Engine" in why), why


def _stand_in(mutate: bool):
    """An upstream-shaped hook (``self`` with num_gemms/use_bias/single_grouped_*), delegating to ours."""

    def hook(self, state_dict, prefix, *rest):
        case = uh.HookCase("x", self.single_grouped_weight, self.use_bias, ())
        out = uh.run_ours(case, state_dict)
        if isinstance(out, str):
            raise RuntimeError(out[len("error: "):])
        state_dict.clear()
        state_dict.update(out)
        if mutate and "weight" in state_dict and "weight0" in state_dict:  # split anyway: overwrite weight0
            state_dict["weight0"] = state_dict["weight"][0]

    return hook, lambda self, t, k: list(t.unbind(0))


@pytest.mark.parametrize("mutate", [False, True])
def test_backend_rows_compare_both_hooks(monkeypatch, mutate):
    monkeypatch.setattr(uh, "upstream_hook", lambda: (_stand_in(mutate), ""))
    sink = RowSink("twin/any/N3", "smoke", 0, "cpu")
    uh.backend_rows(sink, "fc1")
    failed = {r.fields["check"] for r in sink.rows if r.verdict == "fail"}
    assert len(sink.rows) == len(uh.HOOK_CASES)
    assert failed == ({"megatron_hook/grouped_beside_partial_indexed", "megatron_hook/both_layouts_into_single"} if mutate else set())
