"""Run the extra report sections of ``harness.sections.SECTION_RUNNERS`` (lazily imported).

A runner whose module is missing or fails to import gives a *skipped* section with the reason; a
runner that raises gives a *failed* section with the error.  Neither stops the run.
"""

from __future__ import annotations

import importlib
import traceback
from typing import Any, Iterable, Optional

from .sections import SECTION_RUNNERS, Section, SectionRow


def _single(name: str, verdict: str, message: str) -> Section:
    return Section(name=name, title=name, columns=[], rows=[SectionRow(id=name, verdict=verdict, message=message)])


def run_section(name: str, target: str, suite: str, seed: int, device: str) -> Section:
    """One section, never raising (see the module docstring)."""
    module_name, _, fn_name = target.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), fn_name)
    except (ImportError, AttributeError) as exc:
        return _single(name, "skip", f"section runner {target} unavailable: {type(exc).__name__}: {exc}")
    try:
        section = fn(suite=suite, seed=seed, device=device)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - a broken section is a failed section
        tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
        return _single(name, "fail", f"section runner {target} raised {tb}")
    if not isinstance(section, Section):
        return _single(name, "fail", f"section runner {target} returned {type(section).__name__}, not harness.sections.Section")
    return section


def run_sections(suite: str, seed: int, device: str, names: Optional[Iterable[str]] = None) -> list[dict[str, Any]]:
    """JSON of the selected sections (default: all of ``SECTION_RUNNERS``)."""
    chosen = list(names) if names is not None else list(SECTION_RUNNERS)
    unknown = [n for n in chosen if n not in SECTION_RUNNERS]
    if unknown:
        raise ValueError(f"unknown sections {unknown}; known: {sorted(SECTION_RUNNERS)}")
    return [run_section(n, SECTION_RUNNERS[n], suite, seed, device).to_json() for n in chosen]
