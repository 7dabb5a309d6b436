"""The report's vocabulary and JSON schema: check names, verdicts, ULP histogram edges, the overall
verdict, strict JSON encoding, validation, loading.

This module is the one place the harness (which produces reports) and ``reports`` (which renders,
merges and reads them) share: both import it, and nothing in ``reports`` imports the harness.

Strict JSON: every JSON file the project writes parses with a strict parser (``jq``, JavaScript,
``json.loads(s, parse_constant=<raise>)``).  Non-finite floats are written as the strings ``"nan"``,
``"inf"`` and ``"-inf"`` (``json_safe``); ``dumps`` refuses anything else that is not JSON.
"""

from __future__ import annotations

import json
import math
import re
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

SCHEMA_VERSION = "1.4"
"""1.1: check "invariant.recalibrate".  1.2: record ``outcome`` (``checked``/``oom``), ``peak_bytes``,
``case_bytes``; ``meta.shard`` (a shard of a sharded run) and ``meta.merged`` (a merged report).
1.3: strict JSON -- a non-finite float anywhere in the report is the string ``"nan"``, ``"inf"`` or
``"-inf"`` (never a bare ``NaN``/``Infinity`` token); the element class ``nan_bits`` (NaN with other
bits than the reference's, counted only under ``--nan-bits strict``), offender ``expected_bits`` /
``got_bits`` (hex) and a ``null`` offender input, ``meta.nan_bits``.  1.4: ``meta.copy_curve`` (device copies
from 4 KiB to 2 GiB timed as the perf samples) and perf ``copy_same_us`` / ``pct_of_same_copy`` (the call
against a copy of its size).  Reports of 1.0-1.3 still load (every later field is optional; bare
non-finite tokens in old files are read as floats)."""
SCHEMA_PATH = Path(__file__).with_name("schema") / "report.schema.json"

VERDICTS = ("pass", "fail", "skip")
"""Verdict of a record, a section row, a section and a report."""
CHECKS = ("forward", "backward.pass_through", "backward.clipped", "invariant.layout", "invariant.grouped", "invariant.recalibrate", "perf")
"""Check names, in report order."""
HIST_EDGES = (0, 1, 2, 4, 8, 16, 32, 64, 128)
"""ULP histogram buckets: [0], [1], [2,4), [4,8), ..., [64,128), [128, inf) (finite pairs only);
a record's ``histogram`` has one count per edge."""


def hist_labels() -> list[str]:
    """Bucket labels of ``HIST_EDGES``: ``0``, ``1``, ``2-3``, ..., ``>=128``."""
    labels = []
    for lo, hi in zip(HIST_EDGES, HIST_EDGES[1:] + (None,)):
        labels.append(f">={lo}" if hi is None else (str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}"))
    return labels


def section_verdict(row_verdicts: Iterable[str]) -> str:
    """A section's verdict from its rows' verdicts: ``fail`` when any row failed, ``skip`` when every
    row (at least one) skipped, else ``pass``."""
    verdicts = list(row_verdicts)
    if "fail" in verdicts:
        return "fail"
    return "skip" if verdicts and all(v == "skip" for v in verdicts) else "pass"


def overall_verdict(report: dict[str, Any]) -> str:
    """``fail`` when any record or section failed or a baseline regression exists; else ``pass`` when
    some record passed, ``skip`` when nothing was checked.  The run's exit status follows it."""
    if any(r["verdict"] == "fail" for r in report["records"]) or any(s["verdict"] == "fail" for s in report["sections"]):
        return "fail"
    if report.get("baseline") and report["baseline"]["regressions"]:
        return "fail"
    return "pass" if any(r["verdict"] == "pass" for r in report["records"]) else "skip"


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


def dumps(obj: Any, *, indent: int | None = 1) -> str:
    """Strict JSON text of ``obj``: non-finite floats become strings (``json_safe``), and anything
    else that JSON cannot hold raises (``allow_nan=False``, no ``default=``).

    ``indent=None`` uses the C encoder (faster: docs/measured.md §13); ``json_safe``'s copy is
    made only when the object holds a non-finite float."""
    try:
        return json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError:  # a non-finite float somewhere (strict JSON has none): replace, then encode
        return json.dumps(json_safe(obj), indent=indent, allow_nan=False)


def _reject_constant(token: str) -> Any:
    raise ValueError(f"not strict JSON: bare {token} token")


def loads_strict(text: str) -> Any:
    """Parse ``text`` as strict JSON: a bare ``NaN``/``Infinity``/``-Infinity`` token raises ``ValueError``."""
    return json.loads(text, parse_constant=_reject_constant)


def validate(report: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` when ``report`` does not follow the schema."""
    import jsonschema

    jsonschema.validate(report, schema())


def check_version(report: Any) -> None:
    """``ValueError`` unless ``report["schema_version"]`` is ``1.N`` with ``N`` at most this reader's
    minor version (``SCHEMA_VERSION``): a newer report may hold fields or outcomes this code would
    misread, so it is refused instead of half understood."""
    version = report.get("schema_version") if isinstance(report, dict) else None
    m = re.fullmatch(r"1\.(0|[1-9][0-9]*)", version) if isinstance(version, str) else None
    if m is None:
        raise ValueError(f"schema_version {version!r} is not a report schema version (1.0 to {SCHEMA_VERSION} are read)")
    if int(m.group(1)) > int(SCHEMA_VERSION.split(".")[1]):
        raise ValueError(f"schema_version {version!r} is newer than this reader's {SCHEMA_VERSION}: upgrade moe-fq-parity to read it")


PASS_MAX_ULP = {"strict": 0, "1-ulp": 1}
"""The most ULP a passing record may show per verdict mode (the same numbers as
``harness.core.tolerances.MAX_ULP``, which the harness decides with; a test keeps them equal)."""
FAILING_CLASSES = ("error", "tie_flip", "nan_bits")
"""Element classes that fail a comparison in every mode (``harness.core.ulp.Comparison.passes``)."""
EVERY_ELEMENT_CHECKS = ("forward", "backward.pass_through", "backward.clipped")
"""Checks that compare every element of the case: a pass of one counts ``numel`` elements, or none
where the spec rejects the input and the backend rejected it too (NVFP4 NaN input)."""
NO_VERDICT = {"oom": "it ran out of memory", "crash": "its worker died", "timeout": "its backend call timed out"}
"""Why a record of each outcome but ``checked`` has no parity verdict and fails (``harness.core.records.OUTCOMES``)."""
CASE_ID = re.compile(r"(?P<fmt>[^./|]+)\.[^/]+/[^/]+/[^/]+/N(?P<n>[0-9]+)/(?P<out>[0-9]+)x(?P<inn>[0-9]+)(?=[./+])")
"""What a report reads from a record's ``case_id``: its format, expert count and largest expert, the
head of ``{fmt}.{variant}[+opt..]/{granularity}/{layout}/N{n}/{out}x{in}[.{dtype}][+e{empty}]/...``
(the grammar of ``cases.case``; ``tests/harness/test_gate.py`` keeps the two in step)."""


def _case_id_problems(r: dict[str, Any]) -> list[str]:
    """Where ``fmt``, ``n`` and ``numel`` contradict the case id (every case has a non-empty expert,
    none larger than the id's ``out x in``)."""
    m = CASE_ID.match(r["case_id"])
    if m is None:
        return [f"case_id {r['case_id']!r} is not a case id ({{fmt}}.{{variant}}/{{granularity}}/{{layout}}/N{{n}}/{{out}}x{{in}}/...)"]
    out = []
    if r["fmt"] != m["fmt"]:
        out.append(f"fmt {r['fmt']!r} contradicts the case id (format {m['fmt']!r})")
    if r["n"] != int(m["n"]):
        out.append(f"n {r['n']} contradicts the case id (N{m['n']})")
    most = int(m["n"]) * int(m["out"]) * int(m["inn"])
    if not 1 <= r["numel"] <= most:
        out.append(f"numel {r['numel']} contradicts the case id (1 to {most}: N{m['n']} experts of at most {m['out']}x{m['inn']})")
    return out


def _count_problems(r: dict[str, Any]) -> list[str]:
    """Where the element counts contradict ``numel`` or each other: a negative count, more elements
    compared than the case has, a pass of an every-element check that counted some but not all,
    per-expert entries of an expert outside ``0..n-1`` or named twice, whose counts do not add up to
    their own ``numel`` or, class by class, to the record's counts."""
    counts, out = r["counts"], []
    negative = [f"{k} {v}" for k, v in counts.items() if v < 0] + [f"expert {e['expert']} {k} {v}" for e in r["per_expert"]
                                                                  for k, v in e["counts"].items() if v < 0]
    if negative:
        return [f"negative counts ({', '.join(negative)})"]
    compared = sum(counts.values())
    if compared > r["numel"]:
        out.append(f"counts {compared} elements, more than its numel {r['numel']}")
    elif r["verdict"] == "pass" and r["check"] in EVERY_ELEMENT_CHECKS and compared not in (0, r["numel"]):
        out.append(f"verdict pass of {r['check']} (which compares every element or, where the spec rejects the input, none) counts "
                   f"{compared} of its numel {r['numel']} elements")
    experts = [e["expert"] for e in r["per_expert"]]
    if len(set(experts)) != len(experts) or not all(0 <= i < r["n"] for i in experts):
        out.append(f"per_expert names experts {experts} (N{r['n']}: 0 to {r['n'] - 1}, each at most once)")
    for e in r["per_expert"]:
        if sum(e["counts"].values()) != e["numel"]:
            out.append(f"per_expert expert {e['expert']} counts {sum(e['counts'].values())} elements of its numel {e['numel']}")
    if experts:
        summed = {k: sum(e["counts"].get(k, 0) for e in r["per_expert"]) for k in {*counts, *(k for e in r["per_expert"] for k in e["counts"])}}
        if any(summed[k] != counts.get(k, 0) for k in summed):
            out.append(f"per_expert counts add up to {dict(sorted(summed.items()))}, not the record's {dict(sorted(counts.items()))}")
    return out


def record_problems(r: dict[str, Any]) -> list[str]:
    """Why record ``r`` (a schema-valid ``records[]`` entry) contradicts itself; empty when it does not.

    The key must be ``case_id|backend|check``; ``fmt``, ``n`` and ``numel`` must agree with the case id
    (``_case_id_problems``) and the counts with ``numel`` and each other (``_count_problems``); an
    ``oom``, ``crash`` or ``timeout`` record fails; a ``pass`` may not count an element of a failing
    class, a NaN/inf disagreement, more than ``PASS_MAX_ULP[mode]`` ULP (max or histogram), a
    sign-of-zero difference under ``strict``, or list an offender that such a count would have
    produced (under ``strict`` any offender)."""
    out = []
    key = f"{r['case_id']}|{r['backend']}|{r['check']}"
    if r["key"] != key:
        out.append(f"key {r['key']!r} is not case_id|backend|check ({key!r})")
    out += _case_id_problems(r) + _count_problems(r)
    outcome = r.get("outcome", "checked")
    if outcome != "checked" and r["verdict"] != "fail":
        why = NO_VERDICT.get(outcome, "not checked")
        out.append(f"outcome {outcome} with verdict {r['verdict']!r} ({why}: there is no parity verdict, the record fails)")
    if r["verdict"] != "pass":
        return out
    limit = PASS_MAX_ULP[r["mode"]]
    counts = r["counts"]
    bad = {c: counts[c] for c in FAILING_CLASSES if counts.get(c)}
    if limit == 0 and counts.get("ulp1"):
        bad["ulp1"] = counts["ulp1"]
    for name in ("nan_mismatch", "inf_mismatch") + (("signed_zero",) if limit == 0 else ()):
        if r.get(name):
            bad[name] = r[name]
    if bad:
        out.append(f"verdict pass under {r['mode']} with {', '.join(f'{k} {v}' for k, v in bad.items())}")
    if r["max_ulp"] > limit:
        out.append(f"verdict pass under {r['mode']} with max_ulp {r['max_ulp']} (at most {limit})")
    over = sum(n for edge, n in zip(HIST_EDGES, r["histogram"]) if edge > limit)
    if over:
        out.append(f"verdict pass under {r['mode']} with {over} histogram entries above {limit} ULP")
    offenders = [o for o in r["offenders"] if limit == 0 or o["cls"] in FAILING_CLASSES]
    if offenders:
        out.append(f"verdict pass under {r['mode']} with {len(offenders)} offenders of class {sorted({o['cls'] for o in offenders})}")
    return out


MAX_PROBLEMS = 5
"""``check_consistency`` names this many problems (and counts the rest)."""


def check_consistency(report: dict[str, Any]) -> None:
    """``ValueError`` when a schema-valid report contradicts itself: two records with one key (a
    reader would keep one of them), a record that contradicts its verdict (``record_problems``), two
    sections of one name or two rows of one id in a section.  The message names the first
    ``MAX_PROBLEMS`` and counts all.  Cost: linear in the records, a small fraction of the
    JSON-schema validation's (docs/measured.md §13)."""
    problems: list[str] = []
    seen: dict[str, int] = {}
    for k, r in enumerate(report["records"]):
        if r["key"] in seen:
            problems.append(f"records[{seen[r['key']]}] and records[{k}] have one key {r['key']!r}")
        seen.setdefault(r["key"], k)
        problems += [f"records[{k}] ({r['key']}): {p}" for p in record_problems(r)]
    names: set[str] = set()
    for s in report["sections"]:
        if s["name"] in names:
            problems.append(f"section {s['name']!r} appears twice")
        names.add(s["name"])
        ids: set[str] = set()
        for row in s["rows"]:
            if row["id"] in ids:
                problems.append(f"section {s['name']!r} has two rows {row['id']!r}")
            ids.add(row["id"])
    if problems:
        more = f" (and {len(problems) - MAX_PROBLEMS} more)" if len(problems) > MAX_PROBLEMS else ""
        raise ValueError(f"{len(problems)} inconsistencies: " + "; ".join(problems[:MAX_PROBLEMS]) + more)


def load(path: str | Path) -> dict[str, Any]:
    """Read, validate and check a report; ``ValueError`` naming the file when it is not one (not
    JSON, a schema version newer than this reader, not following the schema, or contradicting
    itself: ``check_consistency``)."""
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable JSON report ({exc})") from exc
    try:
        check_version(report)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from exc
    try:
        validate(report)
    except Exception as exc:  # jsonschema.ValidationError
        raise ValueError(f"{path}: does not follow report schema {SCHEMA_VERSION}: {getattr(exc, 'message', exc)}") from exc
    try:
        check_consistency(report)
    except ValueError as exc:
        raise ValueError(f"{path}: refused: {exc}") from exc
    return report
