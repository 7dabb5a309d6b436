"""Output quoted in the README, the docs and the example's README, checked against what the code prints.

A quoted sample is a fenced block with no language, right after a line ``<!-- sample: NAME -->``.
Inside it, ``...`` stands for any text: a line that is only ``...`` for any number of lines, and
``...`` within a line for any part of that line (a duration, a path).  A sample whose first line is
``$ moe-fq-parity ...`` is that command and what it prints (``test_samples.py`` runs each); any
other sample is printed by the test that ``PRODUCERS`` names, which compares it (``assert_quoted``).
Every fenced block with no language is a sample (a diagram says ``text``), so no quoted output
escapes the comparison.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DOCUMENTS = ("README.md", "docs/*.md", "examples/*/README.md")
MARKER = re.compile(r"^<!-- sample: ([\w.-]+) -->$")

PRODUCERS = {
    "own-kernel-smoke": "tests/harness/test_outside_project.py::test_correct_backend_passes_in_a_project_outside_the_repository",
    "own-kernel-tie-failure": "tests/harness/test_outside_project.py::test_backend_off_by_one_on_ties_fails_with_offender_table_and_repro",
}
"""Samples printed by a test of their own (not a ``$ moe-fq-parity`` command): name -> that test."""


@dataclass(frozen=True)
class Sample:
    """One quoted block: where it is, its marker's name (``None``: no marker) and its lines."""

    path: Path
    line: int
    name: str | None
    lines: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO)}:{self.line}"


def fenced_blocks() -> list[Sample]:
    """Every fenced block with no language in the ``DOCUMENTS``."""
    out = []
    for pattern in DOCUMENTS:
        for path in sorted(REPO.glob(pattern)):
            lines = path.read_text().splitlines()
            k = 0
            while k < len(lines):
                if lines[k].startswith("```"):
                    end = next(j for j in range(k + 1, len(lines)) if lines[j].startswith("```"))
                    if lines[k] == "```":
                        m = MARKER.match(lines[k - 1]) if k else None
                        out.append(Sample(path, k + 1, m.group(1) if m else None, tuple(lines[k + 1:end])))
                    k = end
                k += 1
    return out


def quoted(name: str) -> Sample:
    """The one sample named ``name``."""
    found = [s for s in fenced_blocks() if s.name == name]
    assert len(found) == 1, f"sample {name!r} is quoted {len(found)} times: {[s.where for s in found]}"
    return found[0]


def _line_matches(pattern: str, line: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pattern.split("..."))), line) is not None


def mismatch(expected: tuple[str, ...], produced: list[str]) -> str | None:
    """Where ``produced`` leaves the quoted ``expected`` (``...`` as in the module docstring), or ``None``."""

    def match(i: int, j: int) -> bool:
        if i == len(expected):
            return j == len(produced)
        if expected[i].strip() == "...":
            return any(match(i + 1, k) for k in range(j, len(produced) + 1))
        return j < len(produced) and _line_matches(expected[i], produced[j]) and match(i + 1, j + 1)

    if match(0, 0):
        return None
    for i, line in enumerate(expected):  # the first quoted line with no match at all, for the message
        if line.strip() != "..." and not any(_line_matches(line, p) for p in produced):
            return f"quoted line {i + 1} is not printed: {line!r}"
    return "the quoted lines are printed, but not in this order or with other lines between them"


def assert_quoted(name: str, produced: str) -> None:
    """The sample ``name`` is what ``produced`` says, line for line."""
    sample = quoted(name)
    why = mismatch(sample.lines, produced.splitlines())
    assert why is None, f"{sample.where}: sample {name!r} has drifted from the output: {why}\n--- printed:\n{produced}"
