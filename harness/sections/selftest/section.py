"""Report section entry point (see ``harness.sections.SECTION_RUNNERS``)."""

from .report import run

__all__ = ["run"]
