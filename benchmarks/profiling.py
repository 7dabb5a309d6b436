"""Beyond the case table: the tile sweep at the production case, a plain Triton copy through the
kernels' tiling, and per format the arithmetic ceiling (data L2-resident) with compiled-kernel facts."""

from __future__ import annotations

from dataclasses import asdict

import torch

from moe_fq_parity.kernels import api, launch, tables
from moe_fq_parity.kernels.amax import amax_for_list
from moe_fq_parity.kernels.formats import FMT_FP8, FMT_NVFP4, parse_spec
from moe_fq_parity.kernels.geometry import grid_for
from moe_fq_parity.kernels.launch import BWD_CONFIG, FWD_CONFIG, KernelConfig, tile_for

from .cases import EAGER_FORMATS, FORMATS, PRODUCTION, make_experts
from .measure import KernelRunner, graph_ms, pct


SWEEP_TILES = ((4096, 4, 1), (4096, 4, 4), (2048, 4, 1), (2048, 4, 2), (2048, 4, 8), (8192, 8, 1), (8192, 8, 2))
"""(elements per tile, warps, tiles per program) tried per kernel at the production case."""


def sweep(copy_gbps: float, kinds: str = "") -> tuple[list[dict], dict[str, object]]:
    """Tile configurations at the Ultra production case; returns the rows and the fastest
    ``KernelConfig`` per kernel (``int8`` stands for INT, ``bwd_clipped`` for the backward)."""
    _, n, shape = PRODUCTION
    runner = KernelRunner([make_experts(n, shape, seed=0)])
    grads = [torch.randn_like(w) for w in runner.sets[0][0]]
    numel = n * shape[0] * shape[1]
    defaults = {**{f: FWD_CONFIG[parse_spec(f, None, {}).code] for f in EAGER_FORMATS}, "bwd_clipped": BWD_CONFIG}
    plan = [(kind, KernelConfig(b, w, tiles_per_program=t, nvfp4_int_recip=defaults[kind].nvfp4_int_recip))
            for b, w, t in SWEEP_TILES for kind in defaults]  # fmt: skip
    plan += [("int8", KernelConfig(4096, 4, tiles_per_program=4, scalar_int_div=True)),
             ("nvfp4", KernelConfig(4096, 8, tiles_per_program=4, nvfp4_int_recip=True))]  # fmt: skip
    wanted = {k for k in kinds.split(",") if k}
    plan += [("nvfp4", KernelConfig(b, w, tiles_per_program=t, nvfp4_int_recip=False)) for b, w, t in ((1024, 4, 8), (2048, 8, 8), (4096, 4, 8))]
    plan = [(k, c) for k, c in plan if not wanted or k in wanted]
    rows, best = [], {}
    for kind, cfg in plan:
        fns = runner.bwd(grads, cfg) if kind == "bwd_clipped" else runner.fwd(kind, cfg)
        ms = graph_ms(fns)
        pct = 100 * (6 if kind == "bwd_clipped" else 4) * numel / ms / 1e6 / copy_gbps
        rows.append({"kind": kind, **asdict(cfg), "ms": ms, "pct_copy": pct})
        if kind not in best or ms < best[kind][0]:
            best[kind] = (ms, cfg)
        print(f"  sweep {kind:12s} block={cfg.block:6d} warps={cfg.num_warps:2d} tpp={cfg.tiles_per_program} "
              f"int_div={cfg.scalar_int_div:d} int_recip={cfg.nvfp4_int_recip:d}  {ms:7.3f} ms  {pct:5.1f}%", flush=True)  # fmt: skip
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


def profile_formats(copy_gbps: float, n: int = 256, shape: tuple[int, int] = (512, 2048)) -> dict:
    """Per format: the arithmetic ceiling, i.e. the kernel's throughput with (almost) no HBM traffic:
    ``n`` experts that are all the same 2 MB tensor, every output written to one 2 MB buffer (the
    table's output offsets zeroed), so loads and stores stay in L2 while the programs, tiles and
    instructions are those of an ``n`` x ``shape`` launch (1 GB of nominal traffic); the same for a
    plain Triton copy with that tiling.  Reported as nominal GB/s and as % of the measured HBM copy
    bandwidth: a format whose ceiling is below 100% cannot reach copy bandwidth on this GPU (and on
    a GPU with the same SMs and faster HBM, it reaches at most ceiling/copy there).  Also registers,
    spills, warps and PTX instruction counts of the production-case launch."""
    from moe_fq_parity.kernels.copy_kernel import tiled_copy_kernel  # deferred: imports Triton

    out: dict = {}
    w = make_experts(1, shape, seed=3)[0][0]
    ws = [w] * n
    amax = torch.full((n,), float(w.float().abs().amax()), device="cuda")
    table = tables.expert_table(ws)
    table.meta[1].zero_()  # every expert writes the same buffer
    flat = torch.empty(shape[0] * shape[1], dtype=torch.bfloat16, device="cuda")
    nominal = 4 * n * shape[0] * shape[1]
    for bf in FORMATS:
        spec = parse_spec(bf.fmt, None, bf.options)
        if bf.takes_amax:
            view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=spec.code == FMT_NVFP4)
        else:
            view = api.expert_amax(spec, None, table)
        ms = graph_ms([lambda s=spec, v=view: launch.fwd_list(table, ws, flat, v, s, check=False)])
        out[bf.key] = {"ceiling_gbps": nominal / ms / 1e6, "ceiling_pct_of_hbm_copy": pct(nominal, ms, copy_gbps)}
    tile = tile_for(table.shapes, FWD_CONFIG[parse_spec("fp8_e4m3", None, {}).code], w.device)
    grid = grid_for(table.shapes, tile)
    xi, fi = w.view(torch.int16), flat.view(torch.int16)
    ms = graph_ms([lambda: tiled_copy_kernel[grid](xi, fi, table.meta, n, VEC=table.xvec, BR=tile.br, BC=tile.bc, TPP=tile.tpp,
                                                    num_warps=tile.num_warps)])  # fmt: skip
    out["triton_copy"] = {"ceiling_gbps": nominal / ms / 1e6, "ceiling_pct_of_hbm_copy": pct(nominal, ms, copy_gbps)}
    _, n, shape = PRODUCTION
    prod = KernelRunner([make_experts(n, shape, seed=0)])
    for bf in FORMATS:
        fmt = bf.key
        k = prod.fwd(bf)[0]()
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
