"""Parity cases: declarative records (``Case``), their data (``make_inputs``), suites and strategies.

* ``case``          -- the plain, frozen ``Case`` record and its stable id (``Case.from_id`` parses it back);
* ``rules``         -- which records are valid cases (``validate``, ``make_case``, ``parse_case``): every
  validation rule, asking the format registry (``reference.formats``) and the distributions;
* ``shapes``        -- Nemotron shapes, ragged and empty experts;
* ``grids``         -- where each format's rounding ties sit (derived from ``reference``);
* ``distributions`` -- value distributions that find bugs (ties, specials, outliers, ...);
* ``amax``          -- amax policies (calibrated, clipping, tiny, zero, designed);
* ``inputs``        -- a case -> tensors, seeded by ``global seed + crc32(case id)``;
* ``catalogue``     -- suites ``smoke``, ``ci``, ``nightly``, ``ultra``;
* ``strategies``    -- Hypothesis strategies (import ``cases.strategies`` explicitly: needs hypothesis).
"""

from .case import AMAX_POLICIES, DTYPES, GRANULARITIES, LAYOUTS, Case
from .catalogue import SUITE_NAMES, SUITES, CatalogueError, Suite, marks, parse_suite, select, suite, suite_table
from .inputs import DEFAULT_SEED, CaseInputs, case_seed, make_inputs
from .rules import make_case, parse_case, validate

__all__ = [
    "AMAX_POLICIES",
    "DEFAULT_SEED",
    "DTYPES",
    "GRANULARITIES",
    "LAYOUTS",
    "SUITES",
    "SUITE_NAMES",
    "Suite",
    "parse_suite",
    "suite_table",
    "Case",
    "CaseInputs",
    "CatalogueError",
    "case_seed",
    "make_case",
    "make_inputs",
    "marks",
    "parse_case",
    "select",
    "suite",
    "validate",
]
