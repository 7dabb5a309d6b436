"""Backends by name or by ``package.module:object``.

Names: the built-ins (``reference``, ``triton``, ``eager-loop``) and the external implementations
judged against the reference (``modelopt``, ``modelopt-eager``, ``te``, ``te-current``;
``harness.backends.registry``).  Every place that takes a backend (``run --backend``,
``selftest --backend``, ``variant_match --backend``, pytest ``--parity-backend``) resolves it here.

``load(spec)`` returns a ``LoadedBackend`` saying whether it can run here and, when not, the exact
reason and what to install (``hint``); unavailable backends are skipped with that reason, never
passed.  A ``package.module:object`` spec that does not import or does not meet the contract, or an
unknown name, raises ``BackendLoadError`` (the user asked for it: that is an error).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Iterable, Optional

from moe_fq_parity.harness.core.contract import backend_available, backend_device, check_backend
from moe_fq_parity.harness.core.guard import BuiltState, building

from .eager_loop import EagerLoopBackend
from .external import BackendLoadError, load_external
from .reference_backend import ReferenceBackend
from .registry import BACKENDS as EXTERNAL
from .registry import INSTALL_HINTS as _EXTERNAL_HINTS
from .triton_backend import TritonBackend

BUILTINS: dict[str, Callable[[], object]] = {
    "reference": ReferenceBackend,
    "triton": TritonBackend,
    "eager-loop": EagerLoopBackend,
}
NAMES: tuple[str, ...] = (*BUILTINS, *EXTERNAL)
"""Every backend name ``load`` accepts, built-ins first (``list`` shows them in this order)."""
INSTALL_HINTS: dict[str, str] = {"triton": "pip install 'moe-fq-parity[triton]' (and a CUDA GPU)", **_EXTERNAL_HINTS}
"""What makes a named backend available, shown with its reason when it is not (a backend that says
it in its own reason takes it from here: ``registry``)."""
_HINT_OF_SPEC: dict[str, str] = {EXTERNAL[name]: hint for name, hint in _EXTERNAL_HINTS.items()}
"""The same hints for an external backend named by its ``package.module:object``."""


@dataclass(frozen=True)
class LoadedBackend:
    """A backend resolved from its spec: the object, where it runs, and whether it can run here."""

    spec: str
    obj: Optional[object]
    available: bool
    reason: str
    device: str
    hint: str = ""
    """What to install to make it available (empty when available or unknown)."""
    built: Optional[BuiltState] = None
    """The process-global numeric settings building it changed (``harness.core.guard.building``):
    its calls run with them (``state``), the reference and the harness without."""

    @property
    def state(self) -> tuple:
        """Settings the backend's calls run with (``guarded``'s ``state``)."""
        return self.built.chosen if self.built is not None else ()

    @property
    def name(self) -> str:
        return getattr(self.obj, "name", self.spec) if self.obj is not None else self.spec

    @property
    def why_not(self) -> str:
        """The reason it is unavailable, with the install hint when there is one and the reason does
        not say it already (the Model-Optimizer and torchao backends name it in their own reason)."""
        return self.reason + (f"; to enable: {self.hint}" if self.hint and self.hint not in self.reason else "")

    def to_json(self) -> dict:
        note = self.built.note() if self.built is not None else ""
        return {"spec": self.spec, "name": self.name, "available": self.available, "reason": self.reason, "device": self.device,
                "formats": sorted(getattr(self.obj, "formats", ()) or ())} | ({"note": note} if note else {})


def load(spec: str) -> LoadedBackend:
    """Resolve a backend name (``NAMES``) or ``package.module:object`` (see the module docstring).
    Process-global numeric settings changed while building it are set back (``LoadedBackend.built``)."""
    with building() as built:
        loaded = _load(spec)
    return replace(loaded, built=built[0])


def _load(spec: str) -> LoadedBackend:
    hint = INSTALL_HINTS.get(spec) or _HINT_OF_SPEC.get(spec, "")
    if spec in BUILTINS:
        try:
            obj = BUILTINS[spec]()
            check_backend(obj, origin=spec)
        except Exception as exc:  # noqa: BLE001 - a built-in that cannot be built is unavailable, with why
            return LoadedBackend(spec, None, False, f"{type(exc).__name__}: {exc}", "", hint)
    elif spec in EXTERNAL:
        obj = load_external(EXTERNAL[spec])
    elif ":" in spec:
        obj = load_external(spec)
    else:
        raise BackendLoadError(f"unknown backend {spec!r}: use one of {', '.join(NAMES)} or 'package.module:object'")
    ok, reason = backend_available(obj)
    device, why = usable_device(obj)
    if device is None:  # its own reason first when it has one
        return LoadedBackend(spec, obj, False, reason if not ok else why, str(getattr(obj, "device", "")), hint)
    return LoadedBackend(spec, obj, ok, reason, device, "" if ok else hint)


def usable_device(obj: object) -> tuple[Optional[str], str]:
    """``(device, "")`` when the backend's device exists here, else ``(None, reason)``: an invalid device
    string or a device this host lacks makes the backend unavailable with that reason, never a crash."""
    import torch

    try:
        dev = backend_device(obj)
    except Exception as exc:  # noqa: BLE001 - torch.device's own message names the bad string
        return None, f"device {getattr(obj, 'device', None)!r} is not a device: {type(exc).__name__}: {exc}"
    try:
        torch.empty(1, device=dev)
    except Exception as exc:  # noqa: BLE001 - e.g. "Torch not compiled with CUDA enabled"
        return None, f"device {str(dev)!r} is not usable here: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return str(dev), ""


def load_all(specs: Optional[Iterable[str]] = None) -> list[LoadedBackend]:
    """Load ``specs`` (default: every built-in)."""
    return [load(s) for s in (list(specs) if specs else list(BUILTINS))]


__all__ = ["BUILTINS", "EXTERNAL", "INSTALL_HINTS", "NAMES", "BackendLoadError", "LoadedBackend", "load", "load_all", "load_external"]
