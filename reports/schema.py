"""The report's JSON schema: version, validation, JSON-safe encoding, loading."""

from __future__ import annotations

import json
import math
from functools import lru_cache
from pathlib import Path
from typing import Any

SCHEMA_VERSION = "1.2"
"""1.1: check "invariant.recalibrate".  1.2: record ``outcome`` (``checked``/``oom``), ``peak_bytes``,
``case_bytes``; ``meta.shard`` (a shard of a sharded run) and ``meta.merged`` (a merged report).
Reports of 1.0 and 1.1 still load (every 1.2 field is optional)."""
SCHEMA_PATH = Path(__file__).with_name("schema") / "report.schema.json"


@lru_cache(maxsize=1)
def schema() -> dict[str, Any]:
    return json.loads(SCHEMA_PATH.read_text())


def json_safe(obj: Any) -> Any:
    """Replace non-finite floats by the strings ``"nan"``, ``"inf"``, ``"-inf"`` (strict JSON has none)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def validate(report: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` when ``report`` does not follow the schema."""
    import jsonschema

    jsonschema.validate(report, schema())


def load(path: str | Path) -> dict[str, Any]:
    """Read and validate a report; ``ValueError`` naming the file when it is not one."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON report ({exc})") from exc
    try:
        validate(report)
    except Exception as exc:  # jsonschema.ValidationError
        raise ValueError(f"{path}: does not follow report schema {SCHEMA_VERSION}: {getattr(exc, 'message', exc)}") from exc
    return report
