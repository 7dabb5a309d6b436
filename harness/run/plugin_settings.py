"""The pytest plugin's settings: resolved once per session and checked the way the CLI checks its
options, so a bad value is a one-line usage error before any test runs.

Imported by the plugin at ``pytest_configure`` (it imports torch through the cases and the runner).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

import pytest

from moe_fq_parity.cases import DEFAULT_SEED, SUITE_NAMES

from moe_fq_parity.harness.backends import BUILTINS, BackendLoadError, load
from moe_fq_parity.harness.core.tolerances import CALL_TIMEOUT_S, DEFAULT_NAN_BITS

from .cli import unwritable
from .plugin_options import ENV_NAMES, ENV_PREFIX, ParitySettings, usage
from .runner import OutDirBusy, out_lock, validate_config

_CLI_OPTIONS = {"--mode": "mode", "--timeout": "timeout", "--nan-bits": "nan_bits"}
"""The CLI's option names in ``validate_config``'s messages -> the plugin's options."""


def _number(kind: Callable[[str], Any], what: str) -> Callable[[str], Any]:
    """``kind`` (``int``/``float``) whose ``ValueError`` says what was expected and what was given."""

    def cast(text: str) -> Any:
        try:
            return kind(text)
        except ValueError:
            raise ValueError(f"expected {what}, got {text!r}") from None

    return cast


def _flag(text: str) -> bool:
    """``1``/``true``/``yes`` or ``0``/``false``/``no`` (any case)."""
    value = text.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(f"expected 1 or 0, got {text!r}")


def hypothesis_profiles() -> Any:
    """``harness.run.hypothesis_profiles``, or ``None`` where Hypothesis is not installed (it comes with
    the ``test`` extra: the plugin loads, and runs the parity tests, without it)."""
    try:
        from . import hypothesis_profiles as profiles  # deferred: hypothesis is the optional test extra
    except ModuleNotFoundError as exc:
        if exc.name != "hypothesis":
            raise
        return None
    return profiles


def resolve(config: pytest.Config) -> ParitySettings:
    """Every setting from the command line, else ``PARITY_*``, else its default, checked the way the
    CLI checks its options (``harness.run.runner.validate_config``): a bad value is a one-line
    ``pytest.UsageError`` before any test runs.  An environment variable set to the empty string is
    refused (an empty ``PARITY_BACKENDS`` would otherwise mean "every built-in")."""

    def pick(opt: str, default: Any, cast: Callable[[str], Any] = str) -> Any:
        value = config.getoption("parity_" + opt)
        env = ENV_PREFIX + ENV_NAMES[opt]
        if value is None:
            if env not in os.environ:
                return default
            if not os.environ[env].strip():
                raise pytest.UsageError(f"{env} is set but empty: give a value or unset it")
            value = os.environ[env]
        if not isinstance(value, str):  # a flag, or the repeatable --parity-backend's list
            return value
        try:
            return cast(value)
        except ValueError as exc:
            raise usage(opt, f"{exc}") from None

    suite = pick("suite", None)
    if suite is not None and suite not in SUITE_NAMES:
        raise usage("suite", f"unknown suite {suite!r}; known: {', '.join(SUITE_NAMES)}")
    timeout = pick("timeout", CALL_TIMEOUT_S, _number(float, "seconds as a number"))
    nan_bits, mode = pick("nan_bits", DEFAULT_NAN_BITS), pick("mode", "strict")
    try:
        validate_config((), None, timeout, nan_bits, mode)
    except ValueError as exc:  # "--timeout: ..." -> "--parity-timeout / PARITY_TIMEOUT: ..."
        opt, _, message = str(exc).partition(": ")
        if opt not in _CLI_OPTIONS:
            raise pytest.UsageError(f"parity settings: {exc}") from None
        raise usage(_CLI_OPTIONS[opt], message) from None
    seed = pick("seed", DEFAULT_SEED, _number(int, "an integer"))
    backends = pick("backend", None, lambda s: [s])
    if backends is not None:  # repeatable and comma-separated, as the CLI's --backend
        backends = [b.strip() for arg in backends for b in arg.split(",")]
        if not all(backends):
            raise usage("backend", f"an empty backend name in {backends}: name each backend (`moe-fq-parity list` shows them)")
    report = pick("report", None)
    if report is not None and not report.strip():
        raise usage("report", "an empty folder name: name the folder for report.json and report.html")
    profiles = hypothesis_profiles()
    profile = (config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE")
               or (profiles.DEFAULT_PROFILE if profiles is not None else None))
    return ParitySettings(
        report_dir=Path(report) if report else None,
        seed=seed,
        suite=suite,
        backends=tuple(backends) if backends else tuple(BUILTINS),
        mode=mode,
        timeout_s=timeout or None,
        hypothesis_profile=profile,
        nan_bits=nan_bits,
        explicit_backends=backends is not None,
        in_process=bool(pick("in_process", False, _flag)),
        gpu_share_mib=_share_mib(pick("gpu_share_mib", ParitySettings.gpu_share_mib, _number(int, "an integer number of MiB"))),
    )


def _share_mib(value: int) -> int:
    if value < 0:
        raise usage("gpu_share_mib", f"{value} MiB: give 0 (never share a GPU) or a positive number of MiB")
    return value


def load_hypothesis_profile(config: pytest.Config, settings: ParitySettings) -> None:
    """Load the settings' Hypothesis profile where Hypothesis is installed and ``--hypothesis-profile``
    did not already name one."""
    if hypothesis_profiles() is not None and settings.hypothesis_profile and not config.getoption("hypothesis_profile", None):
        from hypothesis import settings as hsettings  # deferred: hypothesis is the optional test extra

        hsettings.load_profile(settings.hypothesis_profile)


def check_named_backends(settings: ParitySettings, loaded: dict[str, Any]) -> None:
    """A backend named by the user that cannot run here is a usage error (the CLI's exit 2), never a
    session of skips that exits 0; the loaded backends are kept in ``loaded`` for the tests."""
    for spec in settings.backends:
        try:
            lb = load(spec)
        except BackendLoadError as exc:
            raise pytest.UsageError(f"--parity-backend {spec}: {exc}") from None
        if not lb.available:
            raise pytest.UsageError(f"--parity-backend {spec}: unavailable here: {lb.why_not}")
        loaded[spec] = lb


def check_report_dir(report_dir: Path) -> None:
    """``--parity-report DIR`` must be a folder this session can write (the CLI's ``--out`` check)."""
    if (problem := unwritable(report_dir)) is not None:
        raise usage("report", f"cannot write the report to {report_dir}: {problem}")


def hold_run_lock(report_dir: Path) -> Any:
    """Hold the run lock of ``report_dir`` (``harness.run.runner.out_lock``, the CLI's ``--out`` lock)
    until the session ends (the caller exits it): two runs never write one report; a held lock is a
    usage error.  Returns the entered lock."""
    lock = out_lock(report_dir)
    try:
        lock.__enter__()
    except OutDirBusy as exc:
        raise usage("report", str(exc)) from None
    return lock
