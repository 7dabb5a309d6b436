"""Resolve an external backend by name (``harness.external.BACKENDS``) or ``module:object``."""

from __future__ import annotations

import importlib
from typing import Optional

from moe_fq_parity.harness.core.contract import backend_available, check_backend

from . import BACKENDS


def resolve(spec: str) -> object:
    """The backend object named by ``spec``; ``ValueError`` for a malformed or unknown one."""
    target = BACKENDS.get(spec, spec)
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"backend {spec!r} is neither one of {sorted(BACKENDS)} nor 'module:object'")
    obj = getattr(importlib.import_module(module), attr)
    check_backend(obj, origin=target)
    return obj


def load_backend(spec: str) -> tuple[Optional[object], str]:
    """``(backend, "")`` when it can run here, else ``(None, reason)``."""
    obj = resolve(spec)
    ok, why = backend_available(obj)
    return (obj, "") if ok else (None, why or "available() said no")
