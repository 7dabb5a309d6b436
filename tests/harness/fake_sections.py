"""Section runners for the report tests (``harness.sections`` interface)."""

from moe_fq_parity.harness.sections import Section, SectionRow


def passing(suite: str, seed: int, device: str) -> Section:
    return Section("ok", "fake passing section", ["suite", "seed"], [SectionRow("ok/1", "pass", {"suite": suite, "seed": seed})])


def failing(suite: str, seed: int, device: str) -> Section:
    return Section("bad", "fake failing section", ["x"], [SectionRow("bad/1", "fail", {"x": "<b>not bold</b>"}, repro="echo", message="broken")])


def interrupted(suite: str, seed: int, device: str) -> Section:
    raise KeyboardInterrupt  # a run cut off (Ctrl-C) while this section runs


def sleepy(suite: str, seed: int, device: str) -> Section:
    """Passes after 2 s; its row says when it ran (wall clock), for overlap checks."""
    import time

    start = time.time()
    time.sleep(2.0)
    return Section("sleepy", "fake sleeping section", ["start", "end"], [SectionRow("sleepy/1", "pass", {"start": start, "end": time.time()})])


def dies(suite: str, seed: int, device: str) -> Section:
    import os

    os._exit(3)  # the process ends without reporting (a crash, an OOM kill)


def threads(suite: str, seed: int, device: str) -> Section:
    """Passes; its row says how many PyTorch threads the section's process runs with."""
    import torch

    return Section("threads", "fake section reporting its threads", ["threads"], [SectionRow("threads/1", "pass", {"threads": torch.get_num_threads()})])
