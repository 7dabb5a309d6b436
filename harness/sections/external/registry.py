"""Resolve a backend for the external section and ``variant_match``: any name the harness knows
(``harness.backends.NAMES``: built-ins and ``BACKENDS``) or ``module:object``, through
``harness.backends.load`` (one resolution rule everywhere)."""

from __future__ import annotations

from typing import Optional

from moe_fq_parity.harness.backends import BackendLoadError, load


def resolve(spec: str) -> object:
    """The backend object named by ``spec``; ``ValueError`` for a malformed, unknown or unbuildable one."""
    try:
        lb = load(spec)
    except BackendLoadError as exc:
        raise ValueError(str(exc)) from exc
    if lb.obj is None:
        raise ValueError(f"backend {spec!r} cannot be built here: {lb.why_not}")
    return lb.obj


def load_backend(spec: str) -> tuple[Optional[object], str]:
    """``(backend, "")`` when it can run here, else ``(None, reason)`` (the reason names what to install)."""
    try:
        lb = load(spec)
    except BackendLoadError as exc:
        raise ValueError(str(exc)) from exc
    return (lb.obj, "") if lb.available else (None, lb.why_not or "available() said no")
