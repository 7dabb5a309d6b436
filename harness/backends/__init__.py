"""Backends: built-ins (``reference``, ``triton``, ``eager-loop``) and ``package.module:object`` loading.

``load(spec)`` returns a ``LoadedBackend`` saying whether it can run here and why not; unavailable
backends are skipped with that reason, never passed.  An external spec that does not import or does
not meet the contract raises ``BackendLoadError`` (the user asked for it: that is an error).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterable, Optional

from moe_fq_parity.harness.core.contract import backend_available, backend_device, check_backend

from .eager_loop import EagerLoopBackend
from .external import BackendLoadError, load_external
from .reference_backend import ReferenceBackend
from .triton_backend import TritonBackend

BUILTINS: dict[str, Callable[[], object]] = {
    "reference": ReferenceBackend,
    "triton": TritonBackend,
    "eager-loop": EagerLoopBackend,
}


@dataclass(frozen=True)
class LoadedBackend:
    """A backend resolved from its spec: the object, where it runs, and whether it can run here."""

    spec: str
    obj: Optional[object]
    available: bool
    reason: str
    device: str

    @property
    def name(self) -> str:
        return getattr(self.obj, "name", self.spec) if self.obj is not None else self.spec

    def to_json(self) -> dict:
        return {"spec": self.spec, "name": self.name, "available": self.available, "reason": self.reason, "device": self.device,
                "formats": sorted(getattr(self.obj, "formats", ()) or ())}


def load(spec: str) -> LoadedBackend:
    """Resolve a built-in name or ``package.module:object`` (see the module docstring)."""
    if spec in BUILTINS:
        try:
            obj = BUILTINS[spec]()
            check_backend(obj, origin=spec)
        except Exception as exc:  # noqa: BLE001 - a built-in that cannot be built is unavailable, with why
            return LoadedBackend(spec, None, False, f"{type(exc).__name__}: {exc}", "")
    elif ":" in spec:
        obj = load_external(spec)
    else:
        raise BackendLoadError(f"unknown backend {spec!r}: use one of {sorted(BUILTINS)} or 'package.module:object'")
    ok, reason = backend_available(obj)
    return LoadedBackend(spec, obj, ok, reason, str(backend_device(obj)))


def load_all(specs: Optional[Iterable[str]] = None) -> list[LoadedBackend]:
    """Load ``specs`` (default: every built-in)."""
    return [load(s) for s in (list(specs) if specs else list(BUILTINS))]


__all__ = ["BUILTINS", "BackendLoadError", "LoadedBackend", "load", "load_all", "load_external"]
