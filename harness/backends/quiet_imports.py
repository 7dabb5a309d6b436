"""Import a third-party module once and remember why it failed (for ``available()`` reasons)."""

from __future__ import annotations

import importlib
import logging
import re
import warnings
from contextlib import contextmanager
from functools import lru_cache
from types import ModuleType
from typing import Iterator, Optional


@contextmanager
def quiet_import() -> Iterator[None]:
    """Hide the warnings a third-party package gives while *we* import it (Megatron-Core, reached
    from Model-Optimizer, warns five times that Apex and Transformer Engine are missing; in a run's
    section processes 87 lines), and only those: the filter is scoped to the import and is restored
    after it, so the user's own warnings and those of later calls show as before.  Log records up
    to WARNING are held back the same way (torchao logs two "Failed to load ..." lines for its
    CUDA-only libraries on a CPU host, and torch two deprecation lines, on import)."""
    before = logging.root.manager.disable
    logging.disable(logging.WARNING)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        logging.disable(before)



@contextmanager
def quiet_upstream(package: str, category: type[Warning] = Warning, messages: tuple[str, ...] = ()) -> Iterator[None]:
    """Hide, inside the block, the ``category`` warnings that ``package``'s own modules give (say,
    Megatron-Core's checkpoint loader calling a deprecated torch API: one ``FutureWarning`` per rank
    and load, 162 lines in a run) and the log records below ERROR of ``package``'s loggers and of
    its modules that log on the root logger (torch's checkpoint loader: a warning with a traceback
    per unreadable metadata file); ``messages``: also the warnings of any module whose text starts with one of these (torch's
    warnings about how ``package`` calls it).  Any other warning or record shows as before."""
    log = logging.getLogger(package)
    level = log.level
    log.setLevel(logging.ERROR)
    where = "/" + package.replace(".", "/") + "/"

    def theirs_on_root(record: logging.LogRecord) -> bool:  # some modules log on the root logger (torch's checkpoint loader)
        return record.levelno >= logging.ERROR or where not in record.pathname.replace("\\", "/")

    root = logging.getLogger()
    root.addFilter(theirs_on_root)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=category, module=rf"{package}(\.|$)")
            for text in messages:
                warnings.filterwarnings("ignore", message=re.escape(text))
            yield
    finally:
        root.removeFilter(theirs_on_root)
        log.setLevel(level)


@lru_cache(maxsize=None)
def try_import(module: str) -> tuple[Optional[ModuleType], str]:
    """``(module, "")`` or ``(None, reason)``; the reason names the module and the error.

    Any exception counts (Transformer Engine raises ``OSError``/``RuntimeError`` without CUDA),
    so a probe never crashes the run that asked.
    """
    try:
        with quiet_import():
            return importlib.import_module(module), ""
    except BaseException as exc:  # noqa: BLE001 - a failed import of any kind is a reason
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        return None, f"import {module} failed: {type(exc).__name__}: {first}"[:300]
