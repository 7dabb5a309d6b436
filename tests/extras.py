"""Optional extras of ``moe-fq-parity`` in this test suite: the module each one provides and the pip
command that installs it.  Tests that need one skip with that command when it is absent."""

from __future__ import annotations

import importlib.util

import pytest

EXTRAS = {"triton": "triton", "modelopt": "modelopt", "transformer_engine": "te", "megatron": "megatron"}
"""Top-level module -> the extra of ``moe-fq-parity`` that installs it."""


def importable(module: str) -> bool:
    """Whether ``module`` (a top-level name of ``EXTRAS``) is installed here."""
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def install_hint(module: str) -> str:
    """``needs triton: pip install 'moe-fq-parity[triton]' (or -e '.[triton]' in a checkout)``."""
    extra = EXTRAS[module]
    return f"needs {module}: pip install 'moe-fq-parity[{extra}]' (or -e '.[{extra}]' in a checkout)"


def needs(module: str) -> pytest.MarkDecorator:
    """``@needs("triton")``: skip with the pip command when the extra is not installed."""
    return pytest.mark.skipif(not importable(module), reason=install_hint(module))
