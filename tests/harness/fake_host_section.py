"""A section runner whose module declares ``host_only`` (``harness.sections.processes._host_only``): it uses no
GPU when the environment variable ``FAKE_HOST_ONLY`` is ``1``.  Where ``FAKE_HOST_DIR`` names a folder,
``prepare()`` and ``run`` each leave a file there (``prepared-<pid>``, ``started-<pid>``), so a test
can wait for the section processes instead of sleeping."""

import os
import time

from moe_fq_parity.harness.sections import Section, SectionRow


def host_only(device: str) -> bool:
    return os.environ.get("FAKE_HOST_ONLY") == "1"


def _mark(what: str) -> None:
    folder = os.environ.get("FAKE_HOST_DIR")
    if folder:
        with open(os.path.join(folder, f"{what}-{os.getpid()}"), "w"):
            pass


def prepare() -> None:
    _mark("prepared")


def run(suite: str, seed: int, device: str) -> Section:
    _mark("started")
    return Section("host", "fake host-only section", ["started"], [SectionRow("host/1", "pass", {"started": time.time()})])


def siblings(suite: str, seed: int, device: str) -> Section:
    """Passes; its row says how many sibling CPUs its process counts as taken (``processes.siblings``)."""
    from moe_fq_parity.harness.core.processes import siblings as taken

    return Section("host", "fake host-only section", ["siblings"], [SectionRow("host/1", "pass", {"siblings": taken()})])
