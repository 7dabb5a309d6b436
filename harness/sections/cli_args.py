"""Argument types of the sections' ``python -m`` entry points (``dist``, ``moe``,
``external.variant_match``, ``selftest.seeds``).

Each is an ``argparse`` type: a bad value is a one-line usage error naming the option (exit 2)
before any work starts, never a traceback from inside the run.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Callable

import torch

from moe_fq_parity.cases.catalogue import parse_suite


def device(text: str) -> str:
    """``cpu``, ``cuda`` or ``cuda:N`` that exists here (the CUDA device count is read without
    initialising CUDA: ``torch.cuda.device_count``)."""
    try:
        dev = torch.device(text)
    except (RuntimeError, ValueError):
        raise argparse.ArgumentTypeError(f"unknown device {text!r}; expected cpu, cuda or cuda:N") from None
    if dev.type not in ("cpu", "cuda"):
        raise argparse.ArgumentTypeError(f"device {text!r} is not supported; expected cpu, cuda or cuda:N")
    if dev.type == "cuda":
        gpus = gpu_count()
        if gpus == 0:
            raise argparse.ArgumentTypeError(f"{text!r}: no CUDA device here ({cuda_state()})")
        if dev.index is not None and dev.index >= gpus:
            raise argparse.ArgumentTypeError(f"{text!r}: only {gpus} CUDA device(s) here (cuda:0..cuda:{gpus - 1})")
    return text


def gpu_count() -> int:
    """CUDA devices visible here (0 on a CPU-only torch)."""
    return torch.cuda.device_count() if torch.version.cuda is not None else 0


def cuda_state() -> str:
    """Why there may be no GPU, for messages: the torch build and the visible device count."""
    built = f"CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
    return f"torch {torch.__version__}, {built}, {gpu_count()} device(s) visible"


def json_path(text: str) -> Path:
    """A file path whose folder exists and is writable (checked before the run, not after it)."""
    path = Path(text)
    folder = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r} is a directory; expected a file path")
    if not folder.is_dir():
        raise argparse.ArgumentTypeError(f"folder {str(folder)!r} of {text!r} does not exist")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise argparse.ArgumentTypeError(f"{text!r} is not writable")
    return path


def at_least(minimum: int) -> Callable[[str], int]:
    """An integer type accepting ``minimum`` or more."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected an integer >= {minimum}, got {value}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def suite(text: str) -> str:
    """A suite name (``cases.SUITE_NAMES``)."""
    try:
        return parse_suite(text).value
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
