"""All acceptance thresholds, in one place.  Default: 0 ULP."""

from __future__ import annotations

VERDICT_MODES = ("strict", "1-ulp")
"""``strict``: every element bit-equal (up to ±0 equality and canonical NaN); our own kernel.
``1-ulp``: the upstream acceptance, every element within 1 output-dtype ULP; tie flips are
still counted and reported separately, never absorbed by this tolerance."""

MAX_ULP: dict[str, int] = {"strict": 0, "1-ulp": 1}

NAN_BITS_MODES = ("any", "strict")
"""NaN policy of every comparison (``harness.core.equality``): ``any``: NaN payload and sign are not
compared (default).  ``strict``: they are, as class ``nan_bits``."""
DEFAULT_NAN_BITS = "any"

TIE_WINDOW_FP32_ULPS = 4
"""A mismatch is a *tie flip* when the reference's pre-rounding value lies within this many
fp32 ulps of a rounding boundary of the format's grid (docs/measured.md §2: a one-ulp scale difference
moves ``x*s`` across a tie)."""

SLOWDOWN_THRESHOLD = 0.10
"""``compare``: a case whose time grew by more than 10% against the baseline is a regression."""

# --- Default timeouts (every default wall-clock limit of the harness, in one place) ---------------

CALL_TIMEOUT_S = 300.0
"""Per backend call (one ``fake_quant``/``ste_backward`` call on one case): ``run --timeout``, the pytest
plugin's ``--parity-timeout``, ``RunConfig``, ``CheckContext`` and the self-test's unmutated controls.
Generous: the largest nightly case through the Triton interpreter on a CPU stays below it."""

MUTANT_TIMEOUT_S = 60.0
"""Per call of a self-test mutant (a reference copy with one bug: as fast as the reference)."""

DIST_RUN_TIMEOUT_S = 180.0
"""One multi-process layout of the distributed section (spawn, save, load, report), wall clock."""

DIST_PG_TIMEOUT_S = 45.0
"""The process group's collective timeout inside a distributed layout run (a rank that waits longer
for its peers fails instead of hanging)."""

# --- Sharing one GPU among harness processes --------------------------------------------------------

GPU_SHARE_MIB = 64
"""Cases whose inputs + outputs (``core.memory.case_bytes``) are at most this many MiB share a GPU
(``harness.run.gpu_lease``): the pytest plugin's ``--parity-gpu-share-mib`` and the case workers of
``moe-fq-parity run --workers``.  Larger cases, and every timing, hold the GPU alone."""

RUN_GPU_SHARE_MIB = 1024
"""The case workers of ``moe-fq-parity run --workers`` (at most ``RUN_WORKERS_MAX`` of them) share a GPU
(on a CPU device the host's memory) for cases up to this many MiB, and up to 1/16 of the GPU's
memory per worker where that is less (a
check's peak was at most 3x its case's bytes in the nightly: docs/measured.md section 12b); larger
cases and every timing hold it alone.  Higher than ``GPU_SHARE_MIB``: pytest may run many more
workers than a run does."""

RUN_WORKERS_MAX = 4
"""``run --workers auto``: this many case workers at most (on a CUDA device one per 4 host CPUs, on
a CPU device one per CPU: ``harness.run.runner.auto_workers``; docs/measured.md section 12b)."""
