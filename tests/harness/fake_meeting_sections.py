"""Section runners for the scheduling tests that wait for each other instead of sleeping.

``meet`` leaves a marker file in the folder named by ``FAKE_MEET_DIR`` when it starts, then waits until
``FAKE_MEET_COUNT`` markers are there (every section of the run started) or ``FAKE_MEET_WAIT_S`` seconds
passed.  Sections that run at once therefore overlap by construction (each ends after all of them
started) and end as soon as the last one starts, with no fixed sleep; sections that run one after the
other cannot meet: the first waits out ``FAKE_MEET_WAIT_S`` and ends before the next one starts.

``host`` is ``fake_host_section``'s host-only runner (``host_only``, ``prepare`` and the ``started-<pid>``
marker in ``FAKE_HOST_DIR``) whose row also says how many sibling CPUs its process counts as taken, so one
run of the sections answers both what the host-only and the sibling tests ask.
"""

from __future__ import annotations

import os
import time
import uuid

from moe_fq_parity.harness.sections import Section, SectionRow
from tests.harness.fake_host_section import host_only, prepare  # noqa: F401 - read from this module by harness.sections.processes

DIR_ENV, COUNT_ENV, WAIT_ENV = "FAKE_MEET_DIR", "FAKE_MEET_COUNT", "FAKE_MEET_WAIT_S"


def meet(suite: str, seed: int, device: str) -> Section:
    """Passes; its row says when it ran (wall clock: ``start`` before its marker, ``end`` after it saw the
    others' or gave up) and whether it met the others."""
    folder = os.environ[DIR_ENV]
    count, wait_s = int(os.environ.get(COUNT_ENV, "2")), float(os.environ[WAIT_ENV])
    start = time.time()
    with open(os.path.join(folder, f"started-{uuid.uuid4().hex}"), "w"):  # unique: serial sections share a pid
        pass
    met = False
    while not (met := len([f for f in os.listdir(folder) if f.startswith("started-")]) >= count) and time.time() < start + wait_s:
        time.sleep(0.02)
    return Section("meet", "fake meeting section", ["start", "end", "met"], [SectionRow("meet/1", "pass", {"start": start, "end": time.time(), "met": met})])


def host(suite: str, seed: int, device: str) -> Section:
    """``fake_host_section.run`` (marker ``started-<pid>``, row field ``started``) plus ``siblings``
    (``harness.core.processes.siblings``)."""
    from moe_fq_parity.harness.core.processes import siblings

    folder = os.environ.get("FAKE_HOST_DIR")
    if folder:
        with open(os.path.join(folder, f"started-{os.getpid()}"), "w"):
            pass
    return Section("host", "fake host-only section", ["started", "siblings"], [SectionRow("host/1", "pass", {"started": time.time(), "siblings": siblings()})])
