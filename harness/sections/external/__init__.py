"""The external section: implementations we did not write (``harness.backends.registry``), judged
against the reference.

This package holds what the section itself decides: the probes (``probes``), the match cases and
their fingerprints (``match_cases``), which reference variant each backend matches
(``variant_match``), the calibration / STE / clip-rule checks (``checks``) and the report section
(``section``).  The backends themselves live in ``harness.backends``; their registry is re-exported
here for the section's modules.  Importing this package imports none of the optional extras.
"""

from __future__ import annotations

from moe_fq_parity.harness.backends.registry import BACKENDS, FAMILIES, INSTALL_HINTS, TORCHAO_BACKENDS

__all__ = ["BACKENDS", "FAMILIES", "INSTALL_HINTS", "TORCHAO_BACKENDS"]
