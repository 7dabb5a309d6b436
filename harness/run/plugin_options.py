"""The pytest plugin's options, markers and resolved settings (``harness.run.pytest_plugin``).

Light on purpose: the plugin's entry module imports this at load, in every pytest session of any
project where the distribution is installed, so nothing here imports torch or numpy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import pytest

from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S, DEFAULT_NAN_BITS, GPU_SHARE_MIB, NAN_BITS_MODES, VERDICT_MODES

ENV_PREFIX = "PARITY_"
MARKERS = {
    "parity": "a parity check of a backend against the reference (set by the plugin on tests using parity_case)",
    "slow": "large shapes (Ultra, N=128) and long runs",
    "gpu": "needs a CUDA device; skipped with a reason without one; gpu(lease=False): puts nothing on the GPU, takes no GPU lease",
    "fuzz": "Hypothesis fuzzing (profile via --hypothesis-profile / HYPOTHESIS_PROFILE)",
    "dist": "spawns several processes",
}
ENV_NAMES = {"report": "REPORT", "seed": "SEED", "suite": "SUITE", "backend": "BACKENDS", "mode": "MODE", "timeout": "TIMEOUT",
             "nan_bits": "NAN_BITS", "in_process": "IN_PROCESS", "gpu_share_mib": "GPU_SHARE_MIB"}
"""Option ``--parity-X`` -> its environment variable ``PARITY_<name>``."""
FIXTURES = frozenset({"parity_case", "parity_backend", "parity_loaded_backend", "parity_check", "parity_record", "parity_settings"})
"""The plugin's fixtures: a test that uses one of them is a parity test, the only kind of test of
another project the plugin changes (its GPU skip)."""


@dataclass(frozen=True)
class ParitySettings:
    """Resolved plugin settings (command line > environment ``PARITY_*`` > default)."""

    report_dir: Optional[Path]
    seed: int
    suite: Optional[str]
    backends: tuple[str, ...]
    mode: str
    timeout_s: Optional[float]
    hypothesis_profile: Optional[str]
    """``None`` where Hypothesis is not installed."""
    nan_bits: str = DEFAULT_NAN_BITS
    explicit_backends: bool = False
    """The backends were named (option or environment): each must be available here."""
    in_process: bool = False
    """The parity tests call the backends in the pytest process (``--parity-in-process``), not in a
    supervised worker (``harness.run.isolation``)."""
    gpu_share_mib: int = GPU_SHARE_MIB
    """Parity cases of at most this many MiB (input + output bytes, ``core.memory.case_bytes``) share a
    GPU among pytest-xdist workers (``harness.run.gpu_lease``: a shared lease); larger ones, and every
    other GPU test, hold it alone.  0: every GPU test holds its GPU alone."""


def add_options(parser: pytest.Parser) -> None:
    """The ``parity`` option group.  The values are strings, checked at session start
    (``plugin_settings.resolve``) as the environment's are: a bad one is a one-line usage error
    naming the option and its variable, never argparse's usage text."""
    g = parser.getgroup("parity", "MoE fake-quant parity harness")
    g.addoption("--parity-report", metavar="DIR", default=None, help="write every parity check record to DIR/report.json and DIR/report.html")
    g.addoption("--parity-seed", default=None, help="global seed, an integer (env PARITY_SEED; default cases.DEFAULT_SEED)")
    g.addoption("--parity-suite", default=None, help="collect exactly this suite (env PARITY_SUITE); default: ci plus slow-marked larger cases")
    g.addoption("--parity-backend", action="append", default=None,
                help="backend spec (repeatable; env PARITY_BACKENDS comma-separated; default: all built-ins)")
    g.addoption("--parity-mode", default=None, help=f"forward verdict mode: {' or '.join(VERDICT_MODES)} (env PARITY_MODE; default strict)")
    g.addoption("--parity-timeout", default=None, help=f"per backend call timeout, s (env PARITY_TIMEOUT; default {CALL_TIMEOUT_S:g}; 0: none)")
    g.addoption("--parity-nan-bits", default=None,
                help=f"NaN payload/sign policy, {' or '.join(NAN_BITS_MODES)} (env PARITY_NAN_BITS; default any: not compared; "
                     "strict: counted as class nan_bits)")
    g.addoption("--parity-in-process", action="store_true", default=None,
                help="call the backends in the pytest process (env PARITY_IN_PROCESS=1); default: in a supervised worker process, "
                     "so a backend that crashes or hangs fails its test and the session goes on")
    g.addoption("--parity-gpu-share-mib", default=None, metavar="MIB",
                help="parity cases of at most MIB MiB (inputs + outputs) share a GPU among xdist workers; larger ones and other GPU "
                     f"tests hold it alone (env PARITY_GPU_SHARE_MIB; default {GPU_SHARE_MIB}; 0: never share)")


def usage(opt: str, message: str) -> pytest.UsageError:
    """A one-line usage error naming the option and its environment variable."""
    return pytest.UsageError(f"--parity-{opt.replace('_', '-')} / {ENV_PREFIX}{ENV_NAMES[opt]}: {message}")


def is_parity_test(item: pytest.Item) -> bool:
    """Whether ``item`` uses one of the plugin's fixtures."""
    return not FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))
