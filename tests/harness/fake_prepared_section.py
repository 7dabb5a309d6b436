"""A section runner whose module has a ``prepare()`` (``harness.sections.processes.start_sections``)."""

import os
import time

from moe_fq_parity.harness.sections import Section, SectionRow

MARKER_ENV = "FAKE_PREPARED_MARKER"
"""File that ``prepare()`` writes when it is done (its path, from the environment)."""
PREPARE_S = 2.0
PREPARED: dict = {}


def prepare() -> None:
    """Takes ``PREPARE_S``; records when it ended, in which process, and writes the marker file."""
    time.sleep(PREPARE_S)
    PREPARED.update(pid=os.getpid(), end=time.time())
    marker = os.environ.get(MARKER_ENV)
    if marker:
        with open(f"{marker}.{os.getpid()}", "w") as f:
            f.write(str(PREPARED["end"]))


def run(suite: str, seed: int, device: str) -> Section:
    row = SectionRow("prepared/1", "pass", {"prepared_end": PREPARED.get("end"), "started": time.time(),
                                            "prepared_here": PREPARED.get("pid") == os.getpid()})
    return Section("prepared", "fake prepared section", ["prepared_end", "started", "prepared_here"], [row])
