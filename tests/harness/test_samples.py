"""Quoted output cannot drift: every fenced block with no language in the README, the docs and the
example's README is a registered sample (``tests/samples.py``); the ``$ moe-fq-parity ...`` samples
run here and print exactly what they quote, the others are compared by the test that prints them.

Cost: reading the Markdown files and the quoted commands (usage errors: no case runs), well under a second."""

from __future__ import annotations

import shlex

import pytest

from moe_fq_parity.harness.run.cli import main
from tests.samples import PRODUCERS, REPO, Sample, fenced_blocks, mismatch

COMMAND = "$ moe-fq-parity "


def _commands() -> list[Sample]:
    return [s for s in fenced_blocks() if s.lines and s.lines[0].startswith(COMMAND)]


def test_every_quoted_output_is_a_sample_with_a_producer():
    blocks = fenced_blocks()
    unmarked = [s.where for s in blocks if s.name is None]
    assert not unmarked, f"output quoted without a '<!-- sample: NAME -->' line (a diagram: write ```text): {unmarked}"
    names = [s.name for s in blocks]
    assert len(names) == len(set(names)), names
    for s in blocks:
        assert s.lines and (s.lines[0].startswith(COMMAND) or s.name in PRODUCERS), f"{s.where}: no test prints sample {s.name!r}"
    for name, node in PRODUCERS.items():
        assert name in names, f"PRODUCERS names sample {name!r}, which nothing quotes"
        path, _, test = node.partition("::")
        assert f"def {test}(" in (REPO / path).read_text() and f'assert_quoted("{name}"' in (REPO / path).read_text(), node


def test_the_matcher_catches_a_drift():
    quoted = ("first", "...", "3 of 5 ... in ...s")
    assert mismatch(quoted, ["first", "a", "b", "3 of 5 elements in 0.2s"]) is None
    assert mismatch(quoted, ["first", "3 of 5 elements in 0.2s"]) is None
    assert "is not printed: '3 of 5 ... in ...s'" in mismatch(quoted, ["first", "4 of 5 elements in 0.2s"])
    assert mismatch(("a", "b"), ["b", "a"]) is not None and mismatch(("a",), ["a", "b"]) is not None


@pytest.mark.parametrize("sample", _commands(), ids=lambda s: s.name)
def test_quoted_command_prints_what_it_quotes(sample: Sample, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)  # a run that got past its checks would write its report here, not in the checkout
    capsys.readouterr()
    try:
        main(shlex.split(sample.lines[0][len(COMMAND):]))
    except SystemExit:  # argparse's usage errors
        pass
    out, err = capsys.readouterr()
    why = mismatch(sample.lines[1:], (out + err).splitlines())
    assert why is None, f"{sample.where}: sample {sample.name!r} has drifted: {why}\n--- printed:\n{out + err}"
