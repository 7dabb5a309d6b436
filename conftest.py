"""Root pytest configuration: puts the repo on sys.path and loads the harness plugin
(options, markers' skip reasons, seeds, Hypothesis profiles, the --parity-report collector)."""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

pytest_plugins = ["harness.pytest_plugin"]
