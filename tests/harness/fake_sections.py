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


def cpus(suite: str, seed: int, device: str) -> Section:
    """Passes; its row says how many CPUs the section's process may keep busy (``cpu_share``)."""
    from moe_fq_parity.harness.core.processes import cpu_share

    return Section("cpus", "fake section reporting its CPU share", ["cpu_share"], [SectionRow("cpus/1", "pass", {"cpu_share": cpu_share()})])


SPLIT_BLOCKS = ((2,), (0,), (1, 0), (1, 1), (1, 2))
"""Block keys of ``split``, deliberately not in key order (the section is its blocks sorted by key)."""


def split(suite: str, seed: int, device: str, part=None) -> Section:
    """A splittable section: block ``k`` has ``len(key)`` rows, one failing in block ``(1, 1)``;
    a part runs the blocks it owns (weights 3, 1, 1, 1, 1: part 1 of 2 gets the heavy block alone)."""
    from moe_fq_parity.harness.sections import section_from_blocks

    owned = part.owned([3.0, 1.0, 1.0, 1.0, 1.0]) if part is not None else [True] * len(SPLIT_BLOCKS)
    blocks = []
    for key, own in zip(SPLIT_BLOCKS, owned):
        if own:
            tag = "-".join(map(str, key))
            blocks.append((key, [SectionRow(f"split/{tag}/{j}", "fail" if key == (1, 1) and j == 0 else "pass", {"key": tag, "seed": seed},
                                            message=f"block {tag} row {j}") for j in range(len(key))]))
    return section_from_blocks("split", "fake split section", ["key", "seed"], blocks, notes=f"seed {seed}", part=part)
