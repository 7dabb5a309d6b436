"""Run metadata: git commit, library versions, device."""

from __future__ import annotations

import platform
import subprocess
import sys
from pathlib import Path
from typing import Any, Optional

import torch

from .processes import share_count, usable_cpus
from .triton_env import prepare

REPO = Path(__file__).resolve().parent.parent


def _git(*args: str) -> Optional[str]:
    try:
        out = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def triton_version() -> Optional[str]:
    prepare()
    try:
        import triton
    except Exception:  # noqa: BLE001 - absent or broken triton is reported as None
        return None
    return getattr(triton, "__version__", "unknown")


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda:{device.index or 0} {torch.cuda.get_device_name(device)}"
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def run_meta(device: torch.device) -> dict[str, Any]:
    """The environment part of the report's ``meta``."""
    status = _git("status", "--porcelain")
    return {
        "git_commit": _git("rev-parse", "HEAD"),
        "git_dirty": None if status is None else bool(status),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version(),
        "device": device_name(device),
        "cpu": cpu_meta(),
    }


def cpu_meta() -> dict[str, int]:
    """The host CPUs this process may use, how many harness processes share them
    (``processes.share_cpus``) and this process's PyTorch intra-op threads: host-side timings
    depend on all three."""
    return {"usable": usable_cpus(), "share": share_count(), "torch_threads": torch.get_num_threads()}
