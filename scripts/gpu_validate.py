#!/usr/bin/env python3
"""Validate the GPU tiers on a GPU host: memory budget at Ultra scale, pytest tiers serial and with
xdist, and (on a two-GPU host) xdist scaling and the sharded nightly.

    python3 scripts/gpu_validate.py PHASE [PHASE ...]

One-GPU phases (each fits a 10-minute job; run them one by one or several at once):

* ``ultra``       -- every check of the Ultra case (N=32 x [5120, 8192] bf16, all formats) on every
                     built-in backend through ``moe-fq-parity run``; prints the peak GPU memory per
                     backend and check against the budget (3x input + output bytes), and the peak of
                     building the case's tensors.
* ``gpu``, ``gpu-xdist``   -- ``pytest -m gpu`` over the whole tree, serial / ``-n auto``.
* ``slow``, ``slow-xdist`` -- ``pytest -m slow`` over the whole tree, serial / ``-n auto``.
* ``tiers``, ``tiers-xdist`` -- both tiers in one session, ``pytest -m "gpu or slow"``, serial / ``-n auto``
                              (the ``gpu`` tests are nearly all ``slow`` ones too).

Two-GPU phases:

* ``slow-n1``, ``slow-n2`` -- ``pytest -m slow -n 1`` and ``-n 2`` wall times (the speed-up is
                              printed once both exist); ``tiers-n1``, ``tiers-n2`` the same for
                              ``-m "gpu or slow"``.
* ``nightly-full``   -- ``moe-fq-parity run --suite nightly`` on GPU 0 (``CUDA_VISIBLE_DEVICES=0``).
* ``nightly-shards`` -- ``--shard 1/2`` and ``--shard 2/2`` at once on GPUs 0 and 1, then ``merge``,
                        then ``compare`` against the ``nightly-full`` report and a record-for-record
                        verdict comparison (when ``nightly-full`` ran before).
* ``nightly-compare`` -- that comparison, for the order ``nightly-shards nightly-full nightly-compare``.
* ``nightly-full-warm``, ``nightly-shards-warm``, ``nightly-compare-warm`` -- the same on the Triton
  cache the first cold phase filled (kept as ``OUT/nightly-warm-triton-cache``): every kernel
  compiled, so the walls compare the work itself.
  The unsharded run and the two shards start from empty Triton caches (the shards share one, as
  shards on one host do by default), so the wall times compare: on one warm cache the phase run
  first paid the compilation the other did not (the walls measured: docs/measured.md §13).

Environment: ``OUT`` (default ``./gpu-validate``) receives ``<phase>.json`` (the numbers), the
reports and the logs; ``BACKENDS`` (default ``triton``) are the nightly's backends.  Loading reports
(``merge``, ``compare``) needs ``jsonschema``, a dependency of the package: on a host without an
index, install it from a wheelhouse (``pip install --no-index --find-links DIR jsonschema``).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
OUT = Path(os.environ.get("OUT") or "gpu-validate").resolve()
ULTRA_GLOB = "*/N32/5120x8192/*"
BUDGET_FACTOR = 3
CLI = [sys.executable, "-m", "moe_fq_parity.harness"]
"""The ``moe-fq-parity`` command, run with this interpreter."""


def _say(text: str) -> None:
    print(text, flush=True)


def _save(phase: str, data: dict) -> None:
    from moe_fq_parity.reports.schema import dumps  # strict JSON: non-finite floats as strings

    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"{phase}.json").write_text(dumps(data))
    _say(f"-> {OUT / (phase + '.json')}")


def _run(cmd: list[str], log: Path, env: dict | None = None) -> tuple[int, float, str]:
    """Run ``cmd`` with its output in ``log``; exit code, wall seconds, last 40 lines."""
    log.parent.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with open(log, "w") as fh:
        rc = subprocess.call(cmd, cwd=REPO, stdout=fh, stderr=subprocess.STDOUT, env=env)
    wall = time.monotonic() - start
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
    return rc, wall, tail


def _devices() -> dict:
    import torch

    return {"torch": torch.__version__, "cuda": torch.version.cuda, "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
            "triton": _version("triton")}


def _version(mod: str) -> str | None:
    try:
        return __import__(mod).__version__
    except Exception:  # noqa: BLE001
        return None


def _junit_counts(path: Path) -> dict:
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    get = lambda k: sum(int(s.get(k, 0)) for s in suites)  # noqa: E731
    tests, failures, errors, skipped = get("tests"), get("failures"), get("errors"), get("skipped")
    return {"passed": tests - failures - errors - skipped, "failed": failures, "errors": errors, "skipped": skipped}


def _triton_cache_entries(path: str | None) -> int:
    """Kernels in the Triton cache a phase starts with (timings of phases compare only at equal
    cache states: compiling what a warm cache holds is a large part of the slow tier's time,
    docs/measured.md §13)."""
    root = Path(path) if path else Path.home() / ".triton" / "cache"
    return sum(1 for _ in root.iterdir()) if root.is_dir() else 0


def pytest_phase(phase: str, mark: str, xdist: str | None, *, cold_cache: bool = False) -> dict:
    """``pytest -m MARK [-n XDIST]`` over the whole tree; ``cold_cache``: with an empty Triton
    cache of its own (``TRITON_CACHE_DIR``), so phases whose times are compared each compile the
    same kernels (in a run on a warm cache the first phase pays the compilation the second does
    not: docs/measured.md §13)."""
    junit = OUT / f"{phase}.xml"
    cmd = [sys.executable, "-m", "pytest", "-m", mark, "-p", "no:cacheprovider", "-q", f"--junitxml={junit}"]
    if xdist:
        cmd += ["-n", xdist]
    env = None
    if cold_cache:
        cache = OUT / f"{phase}-triton-cache"
        shutil.rmtree(cache, ignore_errors=True)
        env = dict(os.environ, TRITON_CACHE_DIR=str(cache))
    entries = _triton_cache_entries((env or os.environ).get("TRITON_CACHE_DIR"))
    _say(f"=== {phase}: {' '.join(cmd[1:])}" + (" (empty Triton cache)" if cold_cache else f" (Triton cache: {entries} entries)"))
    rc, wall, tail = _run(cmd, OUT / f"{phase}.log", env)
    if cold_cache:
        shutil.rmtree(OUT / f"{phase}-triton-cache", ignore_errors=True)
    counts = _junit_counts(junit) if junit.exists() else {}
    oom = len(re.findall(r"OutOfMemoryError|out of memory", (OUT / f"{phase}.log").read_text(errors="replace")))
    data = {"phase": phase, "command": " ".join(["pytest", *cmd[3:]]), "exit_code": rc, "wall_s": round(wall, 1), "cold_triton_cache": cold_cache,
            "triton_cache_entries_at_start": entries, **counts,
            "oom_mentions": oom, "devices": _devices(), "tail": tail}
    _say(f"{phase}: exit {rc}, {wall:.0f} s, {counts}, out-of-memory mentions {oom}")
    return data


def _peak_of_building_the_case() -> list[dict]:
    """Peak memory of make_inputs + reference outputs of each Ultra case (what precedes the checks)."""
    import torch

    from moe_fq_parity.cases import make_inputs, select, suite
    from moe_fq_parity.harness.checks import expected_forward

    rows = []
    for case in select(suite("ultra"), patterns=[ULTRA_GLOB]):
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        inputs = make_inputs(case, 1234, "cuda")
        expected = expected_forward(inputs)
        peak = torch.cuda.max_memory_allocated() - base
        rows.append({"case": case.id, "case_bytes": inputs.nbytes, "build_peak_bytes": peak, "ratio": round(peak / inputs.nbytes, 3)})
        del inputs, expected
    torch.cuda.empty_cache()
    return rows


def ultra_phase() -> dict:
    out = OUT / "ultra-report"
    cmd = [*CLI, "run", "--suite", "ultra", "--cases", ULTRA_GLOB, "--backend", "reference", "--backend", "triton",
           "--backend", "eager-loop", "--no-sections", "--no-progress", "--out", str(out)]
    _say(f"=== ultra: {' '.join(cmd)}")
    rc, wall, tail = _run(cmd, OUT / "ultra.log")
    report = json.loads((out / "report.json").read_text())
    table: dict[tuple[str, str], dict] = {}
    for r in report["records"]:
        row = table.setdefault((r["backend"], r["check"]), {"backend": r["backend"], "check": r["check"], "max_peak_bytes": None,
                                                            "max_ratio": None, "pass": 0, "fail": 0, "skip": 0, "oom": 0})
        row[r["verdict"]] += 1
        row["oom"] += r.get("outcome") == "oom"
        if r.get("peak_bytes") is not None and r.get("case_bytes"):
            row["max_peak_bytes"] = max(row["max_peak_bytes"] or 0, r["peak_bytes"])
            row["max_ratio"] = round(max(row["max_ratio"] or 0, r["peak_bytes"] / r["case_bytes"]), 3)
    rows = list(table.values())
    over = [r for r in rows if r["max_ratio"] is not None and r["max_ratio"] > BUDGET_FACTOR]
    build = _peak_of_building_the_case()
    _say(f"{'backend':<12} {'check':<22} {'max peak GB':>11} {'x in+out':>9} {'pass':>5} {'fail':>5} {'skip':>5} {'oom':>4}")
    for r in rows:
        peak = f"{r['max_peak_bytes'] / 1e9:.2f}" if r["max_peak_bytes"] is not None else "-"
        ratio = f"{r['max_ratio']:.2f}" if r["max_ratio"] is not None else "-"
        _say(f"{r['backend']:<12} {r['check']:<22} {peak:>11} {ratio:>9} {r['pass']:>5} {r['fail']:>5} {r['skip']:>5} {r['oom']:>4}")
    for b in build:
        _say(f"building {b['case']}: peak {b['build_peak_bytes'] / 1e9:.2f} GB = {b['ratio']:.2f}x in+out")
    _say(f"ultra: exit {rc}, {wall:.0f} s; checks over the {BUDGET_FACTOR}x budget: {len(over)}")
    return {"phase": "ultra", "command": " ".join(cmd), "exit_code": rc, "wall_s": round(wall, 1), "budget_factor": BUDGET_FACTOR,
            "rows": rows, "over_budget": over, "building": build, "devices": _devices(), "tail": tail}


def scaling(phase: str, mark: str, n: str) -> dict:
    """``pytest -m MARK -n N`` from an empty Triton cache; once both the ``-n1`` and ``-n2`` phases of
    ``phase``'s family exist, the speed-up of ``-n 2`` over ``-n 1``."""
    data = pytest_phase(phase, mark, n, cold_cache=True)
    family = phase.rsplit("-", 1)[0]
    other = OUT / (f"{family}-n1.json" if phase.endswith("-n2") else f"{family}-n2.json")
    if other.exists():
        o = json.loads(other.read_text())
        one, two = (o, data) if phase.endswith("-n2") else (data, o)
        data["speedup_n2_over_n1"] = round(one["wall_s"] / two["wall_s"], 2)
        _say(f"pytest -m {mark!r}: -n 1 {one['wall_s']} s, -n 2 {two['wall_s']} s: {data['speedup_n2_over_n1']}x")
    return data


def _empty_cache(name: str) -> str:
    """A new empty Triton cache folder for one nightly run (``OUT/<name>-triton-cache``)."""
    path = OUT / f"{name}-triton-cache"
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return str(path)


WARM_CACHE = "nightly-warm-triton-cache"
"""The Triton cache of the ``-warm`` nightly phases: the one the first cold nightly phase filled (the
cold shards: every kernel of the suite, their union), kept in place for them.  Never moved: Triton's
cache records its files by absolute path, so a moved cache misses (a full run on a moved cache
recompiles: docs/measured.md §13)."""


def _cache_for(name: str, warm: bool) -> str:
    """An empty cache of the run's own for a cold run (the warm cache itself while none exists yet,
    so the first cold run fills it); the warm cache for a warm run."""
    path = OUT / WARM_CACHE
    if warm:
        if not path.is_dir() or not any(path.iterdir()):
            raise SystemExit(f"{name}: no warm cache at {path}; run a cold nightly phase first")
        return str(path)
    if not path.exists():
        path.mkdir(parents=True)
        return str(path)
    return _empty_cache(name)


def _retire_cache(path: str) -> None:
    """Delete a cold run's own cache (the warm cache stays)."""
    if Path(path) != OUT / WARM_CACHE:
        shutil.rmtree(path, ignore_errors=True)


def _nightly_cmd(out: Path, *extra: str) -> list[str]:
    backends = [b for spec in (os.environ.get("BACKENDS") or "triton").split(",") for b in ("--backend", spec)]
    return [*CLI, "run", "--suite", "nightly", *backends, "--no-progress", "--out", str(out), *extra]


def nightly_full(tag: str = "") -> dict:
    name = f"nightly-full{tag}"
    cmd = _nightly_cmd(OUT / name)
    cache = _cache_for(name, bool(tag))
    entries = _triton_cache_entries(cache)
    _say(f"=== {name} (GPU 0, Triton cache {entries} entries): {' '.join(cmd)}")
    rc, wall, tail = _run(cmd, OUT / f"{name}.log", dict(os.environ, CUDA_VISIBLE_DEVICES="0", TRITON_CACHE_DIR=cache))
    _retire_cache(cache)
    _say(f"{name}: exit {rc}, {wall:.0f} s")
    return {"phase": name, "command": "CUDA_VISIBLE_DEVICES=0 " + " ".join(cmd), "exit_code": rc, "wall_s": round(wall, 1),
            "triton_cache_entries_at_start": entries, "devices": _devices(), "tail": tail}


def nightly_shards(tag: str = "") -> dict:
    name = f"nightly-shards{tag}"
    procs, logs = [], []
    cache = _cache_for(name, bool(tag))  # one host: the shards share the cache, as they do by default
    entries = _triton_cache_entries(cache)
    start = time.monotonic()
    for i in (1, 2):
        cmd = _nightly_cmd(OUT / f"nightly-shard{i}{tag}", "--shard", f"{i}/2")
        _say(f"=== shard {i}/2 on GPU {i - 1} (Triton cache {entries} entries): {' '.join(cmd)}")
        log = open(OUT / f"nightly-shard{i}{tag}.log", "w")
        logs.append(log)
        procs.append((subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT,
                                       env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(i - 1), TRITON_CACHE_DIR=cache)), time.monotonic()))
    walls, rcs = [None] * len(procs), [None] * len(procs)
    while None in rcs:  # each shard's own wall (waiting in order gave a shard that ended first the later one's)
        for i, (p, t0) in enumerate(procs):
            if rcs[i] is None and p.poll() is not None:
                rcs[i], walls[i] = p.returncode, round(time.monotonic() - t0, 1)
        time.sleep(0.1)
    for log in logs:
        log.close()
    _retire_cache(cache)
    wall = time.monotonic() - start
    merge = [*CLI, "merge", str(OUT / f"nightly-shard1{tag}" / "report.json"), str(OUT / f"nightly-shard2{tag}" / "report.json"),
             "--out", str(OUT / f"nightly-merged{tag}")]
    merge_rc, _, merge_tail = _run(merge, OUT / f"nightly-merge{tag}.log")
    data = {"phase": name, "shard_exit_codes": rcs, "shard_wall_s": walls, "wall_s": round(wall, 1), "merge_exit_code": merge_rc,
            "merge_tail": merge_tail, "triton_cache_entries_at_start": entries, "devices": _devices()}
    if (OUT / f"nightly-full{tag}.json").exists():
        _compare_with_full(data, tag)
    else:
        _say(f"{name}: {wall:.0f} s (shards {walls}); merge exit {merge_rc}; run nightly-full{tag}, then nightly-compare{tag}")
    return data


def _compare_with_full(data: dict, tag: str = "") -> dict:
    """Add to ``data`` (the nightly-shards numbers) the comparison of the merged report with the
    nightly-full one: ``compare``'s exit code, record-for-record verdicts, section verdicts and the
    sharded wall time over the unsharded one."""
    full = OUT / f"nightly-full{tag}" / "report.json"
    merged = OUT / f"nightly-merged{tag}" / "report.json"
    cmp_rc, _, cmp_tail = _run([*CLI, "compare", str(full), str(merged)], OUT / f"nightly-compare{tag}.log")
    a, b = json.loads(full.read_text()), json.loads(merged.read_text())
    va = {r["key"]: (r["verdict"], r.get("outcome", "checked")) for r in a["records"]}
    vb = {r["key"]: (r["verdict"], r.get("outcome", "checked")) for r in b["records"]}
    sa = {s["name"]: s["verdict"] for s in a["sections"]}
    sb = {s["name"]: s["verdict"] for s in b["sections"]}
    ra = {s["name"]: [(r["id"], r["verdict"]) for r in s["rows"]] for s in a["sections"]}
    rb = {s["name"]: [(r["id"], r["verdict"]) for r in s["rows"]] for s in b["sections"]}
    fw = json.loads((OUT / f"nightly-full{tag}.json").read_text())["wall_s"]
    timing = {"full": {"phase_s": a["meta"].get("phase_s"), "sections_s": {s["name"]: s.get("seconds") for s in a["sections"]}}}
    for i in (1, 2):
        shard = json.loads((OUT / f"nightly-shard{i}{tag}" / "report.json").read_text())
        timing[f"shard{i}"] = {"phase_s": shard["meta"].get("phase_s"),
                               "sections_s": {s["name"] + (f" part {s['part']['index']}" if s.get("part") else ""): s.get("seconds")
                                              for s in shard["sections"]}}
    data.update(compare_exit_code=cmp_rc, compare_tail=cmp_tail, records_full=len(va), records_merged=len(vb),
                verdicts_equal=va == vb, section_verdicts_equal=sa == sb, section_rows_equal=ra == rb,
                section_rows={k: len(v) for k, v in ra.items()}, timing=timing, unsharded_wall_s=fw,
                sharded_over_unsharded=round(data["wall_s"] / fw, 3),
                differing=[k for k in sorted(set(va) | set(vb)) if va.get(k) != vb.get(k)][:50])
    _say(f"nightly-shards{tag}: {data['wall_s']:.0f} s (shards {data['shard_wall_s']}) = {data['wall_s'] / fw:.0%} of the unsharded {fw} s; "
         f"merge exit {data['merge_exit_code']}; compare exit {cmp_rc}; verdicts equal: {va == vb}, sections equal: {sa == sb}, "
         f"section rows (id, verdict) equal: {ra == rb}")
    for name, t in timing.items():
        _say(f"  {name}: phases {t['phase_s']}; sections {t['sections_s']}")
    return data


def nightly_compare(tag: str = "") -> dict:
    """The shards-vs-full comparison when ``nightly-shards`` ran first (so the unsharded run is not
    the only one to find Triton's compilation cache warm)."""
    return _compare_with_full(json.loads((OUT / f"nightly-shards{tag}.json").read_text()), tag)


PHASES = {
    "ultra": ultra_phase,
    "gpu": lambda: pytest_phase("gpu", "gpu", None),
    "gpu-xdist": lambda: pytest_phase("gpu-xdist", "gpu", "auto"),
    "slow": lambda: pytest_phase("slow", "slow", None),
    "slow-xdist": lambda: pytest_phase("slow-xdist", "slow", "auto"),
    "tiers": lambda: pytest_phase("tiers", "gpu or slow", None),
    "tiers-xdist": lambda: pytest_phase("tiers-xdist", "gpu or slow", "auto"),
    "slow-n1": lambda: scaling("slow-n1", "slow", "1"),
    "slow-n2": lambda: scaling("slow-n2", "slow", "2"),
    "tiers-n1": lambda: scaling("tiers-n1", "gpu or slow", "1"),
    "tiers-n2": lambda: scaling("tiers-n2", "gpu or slow", "2"),
    "nightly-full": nightly_full,
    "nightly-shards": nightly_shards,
    "nightly-compare": nightly_compare,
    "nightly-full-warm": lambda: nightly_full("-warm"),
    "nightly-shards-warm": lambda: nightly_shards("-warm"),
    "nightly-compare-warm": lambda: nightly_compare("-warm"),
}


def main(argv: list[str]) -> int:
    unknown = [p for p in argv if p not in PHASES]
    if not argv or unknown:
        print(f"usage: gpu_validate.py PHASE [PHASE ...]; phases: {', '.join(PHASES)}" + (f" (unknown: {unknown})" if unknown else ""),
              file=sys.stderr)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("error: no CUDA device", file=sys.stderr)
        return 2
    OUT.mkdir(parents=True, exist_ok=True)
    rc = 0
    for phase in argv:
        data = PHASES[phase]()
        _save(phase, data)
        # compare exits 1 on timing changes alone (shards share a host, the unsharded run has it to
        # itself): that is information; a compare that could not run (2) or unequal verdicts fail
        bad = (data.get("exit_code", 0) or any(data.get(k) for k in ("over_budget", "merge_exit_code"))
               or data.get("compare_exit_code") not in (None, 0, 1) or any(data.get("shard_exit_codes", []))
               or any(data.get(k) is False for k in ("verdicts_equal", "section_verdicts_equal", "section_rows_equal")))
        rc = rc or (1 if bad else 0)
    return rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
