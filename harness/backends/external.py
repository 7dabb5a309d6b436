"""Load an outside backend from ``package.module:object`` (dotted attributes allowed after the colon).

The object is used as is when it meets the contract; a class or a zero-argument factory is called
first.  Every failure raises ``BackendLoadError`` with a message saying what to fix.  The current
directory is importable (as with ``python -m``, and as ``uvicorn``/``gunicorn`` do for their app
specs), so the ``moe-fq-parity run --backend my_kernel:Obj`` repro of a failing test works from the
project directory where the test ran.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys

from moe_fq_parity.harness.core.contract import ContractError, check_backend


class BackendLoadError(Exception):
    """An external backend spec that does not import or does not meet the contract."""


def load_external(spec: str) -> object:
    """Import ``spec`` = ``package.module:object`` and return a contract-checked backend object."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BackendLoadError(f"backend spec {spec!r} is not 'package.module:object' (nor a built-in name)")
    cwd = os.getcwd()
    if cwd not in sys.path and "" not in sys.path:
        sys.path.append(cwd)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported with its cause
        raise BackendLoadError(f"backend {spec!r}: cannot import module {module_name!r}: {type(exc).__name__}: {exc}") from exc
    obj: object = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise BackendLoadError(f"backend {spec!r}: {getattr(obj, '__name__', obj)!r} has no attribute {part!r}")
        obj = getattr(obj, part)
    if inspect.isclass(obj) or (callable(obj) and not hasattr(obj, "fake_quant")):
        try:
            obj = obj()
        except Exception as exc:  # noqa: BLE001
            raise BackendLoadError(f"backend {spec!r}: calling {attr}() to build the backend raised {type(exc).__name__}: {exc}") from exc
    try:
        check_backend(obj, origin=spec)
    except ContractError as exc:
        raise BackendLoadError(f"{exc}. See moe_fq_parity.harness.core.contract for the contract.") from exc
    return obj
