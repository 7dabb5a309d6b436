"""What a self-test run found: per mutant (killed or not, by which check on which case), per control
backend (its failures), and the run as a whole.  A leaf module: the runner and the hook mutants
both build these."""

from __future__ import annotations

from dataclasses import dataclass, field

from moe_fq_parity.harness.core.records import CheckRecord
from moe_fq_parity.harness.core.repro import selftest_command


@dataclass(frozen=True)
class MutantOutcome:
    """One mutant's run: ``killed`` by ``check`` on ``case_id`` (the first failure), or it survived
    ``cases_tried`` cases; ``message`` says what the check saw (or why it survived)."""

    name: str
    bug: str
    killed: bool
    check: str = ""
    case_id: str = ""
    message: str = ""
    cases_tried: int = 0
    seconds: float = 0.0

    def repro(self, suite: str, seed: int) -> str:
        """The command that reruns this mutant (on its killing case, when it was killed on one)."""
        return selftest_command(suite, seed, self.name, self.case_id)


@dataclass(frozen=True)
class ControlOutcome:
    """One unmutated control backend on the same cases: it must fail no check (``failures`` empty),
    else the kills prove nothing; ``available`` false with ``reason`` when it cannot run here."""

    backend: str
    available: bool
    reason: str
    failures: tuple[CheckRecord, ...] = ()
    records: int = 0


@dataclass(frozen=True)
class SelftestResult:
    """A self-test run: ``ok`` when every mutant was killed and no control failed."""

    suite: str
    seed: int
    mutants: tuple[MutantOutcome, ...]
    controls: tuple[ControlOutcome, ...] = field(default_factory=tuple)

    @property
    def ok(self) -> bool:
        return all(m.killed for m in self.mutants) and all(not c.failures for c in self.controls)
