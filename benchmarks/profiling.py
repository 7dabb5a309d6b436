"""Beyond the case table: the tile sweep at the production case, a plain Triton copy through the
kernels' tiling, and per format the arithmetic ceiling (data L2-resident) with compiled-kernel facts."""

from __future__ import annotations

from dataclasses import asdict, replace
from typing import Callable

import torch

from moe_fq_parity.kernels import api, launch, tables
from moe_fq_parity.kernels.amax import amax_for_list
from moe_fq_parity.kernels.formats import FMT_FP8, FMT_NVFP4, parse_spec
from moe_fq_parity.kernels.geometry import grid_for
from moe_fq_parity.kernels.launch import BWD_CONFIG, FWD_CONFIG, KernelConfig, fwd_config, tile_for

from .cases import BY_KEY, FORMATS, PRODUCTION, BenchFormat, make_experts
from .measure import KernelRunner, bwd_matches, graph_ms, matches_reference, pct


SWEEP_CHANGES: tuple[tuple[str, dict], ...] = (
    ("tpp1", {"tiles_per_program": 1}),
    ("tpp2", {"tiles_per_program": 2}),
    ("tpp4", {"tiles_per_program": 4}),
    ("1024x1", {"block": 1024, "num_warps": 1}),
    ("2048x2", {"block": 2048, "num_warps": 2}),
    ("2048x4", {"block": 2048, "num_warps": 4}),
    ("4096x4", {"block": 4096, "num_warps": 4}),
    ("8192x8", {"block": 8192, "num_warps": 8}),
)
"""Changes to a kernel's default ``KernelConfig`` that ``--sweep`` times (a change that leaves the
default as it is is skipped): tiles per program, and elements per tile x warps (for square 2-D
blocks the tile is rows x columns of about that many elements)."""


def sweep_plan(kinds: str = "") -> list[tuple[str, str, KernelConfig]]:
    """``(column, name, config)`` of every configuration ``sweep`` times: per bench column (and
    ``bwd_clipped``, the backward) its default first, then each of ``SWEEP_CHANGES`` that changes
    it; ``kinds``: comma-separated columns (default all)."""
    wanted = {k for k in kinds.split(",") if k}
    known = [b.key for b in FORMATS] + ["bwd_clipped"]
    unknown = sorted(wanted - set(known))
    if unknown:
        raise ValueError(f"--sweep-kinds: unknown {unknown}; known: {', '.join(known)}")
    plan = []
    for key in known:
        if wanted and key not in wanted:
            continue
        base = BWD_CONFIG if key == "bwd_clipped" else fwd_config(parse_spec(BY_KEY[key].fmt, None, BY_KEY[key].options))
        plan.append((key, "default", base))
        seen = {base}
        for name, change in SWEEP_CHANGES:
            cfg = replace(base, **change)
            if cfg not in seen:
                seen.add(cfg)
                plan.append((key, name, cfg))
    return plan


class L2Resident:
    """The L2-resident setup of the ceilings (see ``profile_formats``): ``n`` experts that are all
    one ``shape`` tensor, every output written to one buffer; ``nominal``: the bytes such a launch
    would move from and to HBM."""

    def __init__(self, n: int, shape: tuple[int, int], device: str = "cuda"):
        self.w = make_experts(1, shape, seed=3, device=device)[0][0]
        self.ws = [self.w] * n
        self.amax = torch.full((n,), float(self.w.float().abs().amax()), device=device)
        self.table = tables.expert_table(self.ws)
        self.table.meta[1].zero_()  # every expert writes the same buffer
        self.flat = torch.empty(shape[0] * shape[1], dtype=torch.bfloat16, device=device)
        self.nominal = 4 * n * shape[0] * shape[1]

    def launch(self, bf: BenchFormat, config: KernelConfig | None = None) -> Callable[[], None]:
        spec = parse_spec(bf.fmt, None, bf.options)
        if bf.takes_amax:
            view = amax_for_list(self.amax, [r for r, _ in self.table.shapes], self.amax.device, nvfp4=spec.code == FMT_NVFP4)
        else:
            view = api.expert_amax(spec, None, self.table)
        return lambda: launch.fwd_list(self.table, self.ws, self.flat, view, spec, check=False, config=config)


def sweep(copy_gbps: float, kinds: str = "", *, case: tuple[int, tuple[int, int]] = PRODUCTION[1:],
          l2: tuple[int, tuple[int, int]] = (256, (512, 2048)), timer: Callable[[list[Callable[[], None]]], float] = graph_ms,
          device: str = "cuda") -> tuple[list[dict], dict[str, KernelConfig]]:
    """Every ``sweep_plan`` configuration at ``case`` (the Ultra production case): the kernel alone
    (``timer``, a CUDA graph over two input sets) as % of copy, whether its output is the
    reference's bit for bit (first and last expert of both sets), and for the forward the
    L2-resident ceiling (``l2``, as ``profile_formats``).  A configuration that fails to launch is a
    row with its error.  Returns the rows and, per column, the configuration fastest at ``case``
    among the bit-exact ones."""
    n, shape = case
    runner = KernelRunner([make_experts(n, shape, seed=s, device=device) for s in range(2)])
    grads = [torch.randn_like(w) for w in runner.sets[0][0]]
    numel = n * shape[0] * shape[1]
    resident = L2Resident(*l2, device=device)
    rows, best = [], {}
    for key, name, cfg in sweep_plan(kinds):
        row: dict = {"kind": key, "config_name": name, **asdict(cfg)}
        try:
            if key == "bwd_clipped":
                row["ms"] = timer(runner.bwd(grads, cfg))
                row["pct_copy"] = pct(6 * numel, row["ms"], copy_gbps)
                row["exact"] = bwd_matches(*runner.sets[0], grads, cfg)
            else:
                bf = BY_KEY[key]
                row["ms"] = timer(runner.fwd(bf, cfg))
                row["pct_copy"] = pct(4 * numel, row["ms"], copy_gbps)
                row["exact"] = all(matches_reference(bf, ws, amax, outs) for (ws, amax), (_, outs) in zip(runner.sets, runner.outs))
                row["ceiling_pct"] = pct(resident.nominal, timer([resident.launch(bf, cfg)]), copy_gbps)
        except Exception as exc:  # noqa: BLE001  (a configuration the kernel refuses is a row, not the end of the sweep)
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        rows.append(row)
        if row.get("exact") and (key not in best or row["ms"] < best[key][0]):
            best[key] = (row["ms"], cfg)
        ceiling = f"{row['ceiling_pct']:5.1f}%" if "ceiling_pct" in row else "  n/a"  # the backward has no L2 ceiling here
        shown = f"{row['pct_copy']:5.1f}%  ceiling {ceiling}  exact {row['exact']}" if "error" not in row else row["error"]
        print(f"  sweep {key:16s} {name:8s} block={cfg.block:5d} warps={cfg.num_warps:2d} tpp={cfg.tiles_per_program}  {shown}", flush=True)
    return rows, {k: v[1] for k, v in best.items()}


def triton_copypct(copy_gbps: float) -> float:
    """A plain Triton copy through the same tensor-of-pointers tiling (no arithmetic): what the
    access pattern alone reaches at the Ultra production case, as % of copy bandwidth."""
    from moe_fq_parity.kernels.copy_kernel import tiled_copy_kernel  # deferred: imports Triton

    _, n, shape = PRODUCTION
    runner = KernelRunner([make_experts(n, shape, seed=0)])
    (ws, _), table, (flat, _) = runner.sets[0], runner.tables[0], runner.outs[0]
    cfg = FWD_CONFIG[FMT_FP8]
    tile = tile_for(table.shapes, cfg, ws[0].device)
    grid = grid_for(table.shapes, tile)
    xi, fi = ws[table.base].view(torch.int16), flat.view(torch.int16)
    launch_copy = lambda: tiled_copy_kernel[grid](xi, fi, table.meta, n, VEC=table.xvec, BR=tile.br, BC=tile.bc, TPP=tile.tpp,  # noqa: E731
                                                  num_warps=tile.num_warps)
    ms = graph_ms([launch_copy])
    return 100 * 4 * n * shape[0] * shape[1] / ms / 1e6 / copy_gbps


def profile_formats(copy_gbps: float, n: int = 256, shape: tuple[int, int] = (512, 2048), *, case: tuple[int, tuple[int, int]] = PRODUCTION[1:],
                    timer: Callable[[list[Callable[[], None]]], float] = graph_ms, device: str = "cuda") -> dict:
    """Per format: the arithmetic ceiling, i.e. the kernel's throughput with (almost) no HBM traffic:
    ``n`` experts that are all the same 2 MB tensor, every output written to one 2 MB buffer (the
    table's output offsets zeroed), so loads and stores stay in L2 while the programs, tiles and
    instructions are those of an ``n`` x ``shape`` launch (1 GB of nominal traffic); the same for a
    plain Triton copy with that tiling.  Reported as nominal GB/s and as % of the measured HBM copy
    bandwidth: a format whose ceiling is below 100% cannot reach copy bandwidth on this GPU (and on
    a GPU with the same SMs and faster HBM, it reaches at most ceiling/copy there).  Also registers,
    spills, warps and PTX instruction counts of the ``case`` launch (the Ultra production case)."""
    from moe_fq_parity.kernels.copy_kernel import tiled_copy_kernel  # deferred: imports Triton

    out: dict = {}
    l2 = L2Resident(n, shape, device=device)
    table, w, flat, nominal = l2.table, l2.w, l2.flat, l2.nominal
    for bf in FORMATS:
        ms = timer([l2.launch(bf)])
        out[bf.key] = {"ceiling_gbps": nominal / ms / 1e6, "ceiling_pct_of_hbm_copy": pct(nominal, ms, copy_gbps)}
    tile = tile_for(table.shapes, FWD_CONFIG[parse_spec("fp8_e4m3", None, {}).code], w.device)
    grid = grid_for(table.shapes, tile)
    xi, fi = w.view(torch.int16), flat.view(torch.int16)
    ms = timer([lambda: tiled_copy_kernel[grid](xi, fi, table.meta, n, VEC=table.xvec, BR=tile.br, BC=tile.bc, TPP=tile.tpp,
                                                 num_warps=tile.num_warps)])  # fmt: skip
    out["triton_copy"] = {"ceiling_gbps": nominal / ms / 1e6, "ceiling_pct_of_hbm_copy": pct(nominal, ms, copy_gbps)}
    prod = KernelRunner([make_experts(case[0], case[1], seed=0, device=device)])
    for bf in FORMATS:
        fmt = bf.key
        k = prod.fwd(bf)[0]()
        if device == "cuda":
            torch.cuda.synchronize()
        try:
            ptx = k.asm.get("ptx", "")
            instr = [ln for ln in ptx.splitlines() if ln.strip().endswith(";") and not ln.strip().startswith((".", "//"))]
            regs, warps = int(k.n_regs), int(k.metadata.num_warps)
            blocks = min(32, 65536 // max(1, regs * 32 * warps))  # register-limited blocks per SM
            out[fmt].update(n_regs=regs, n_spills=int(k.n_spills), num_warps=warps, ptx_instructions=len(instr),
                            ptx_lines_fma_mul_add=sum(1 for ln in instr if any(t in ln for t in ("fma.", "mul.", "add.", "sub."))),
                            theoretical_warps_per_sm=min(64, blocks * warps))  # fmt: skip
        except Exception as exc:  # noqa: BLE001  (compiled-kernel attributes differ across Triton versions)
            out[fmt]["compiled_facts_error"] = f"{type(exc).__name__}: {exc}"
    return out
