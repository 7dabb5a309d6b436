"""The many-seeds runner: a correct backend passes every seed, a broken one fails the run."""

from __future__ import annotations

from moe_fq_parity.harness.sections.selftest.seeds import main


def test_correct_backend_passes_every_seed(capsys):
    assert main(["--suite", "smoke", "--backend", "eager-loop", "--seeds", "3"]) == 0
    assert "3 seeds" in capsys.readouterr().out


def test_broken_backend_fails(capsys):
    assert main(["--suite", "smoke", "--backend", "tests.harness.broken_backends:OneUlpHigh", "--seeds", "2"]) == 1
    assert "moe-fq-parity run" in capsys.readouterr().out
