"""Backward and calibration checks of an external backend against the reference, as section rows.

* STE: ``backend.ste_backward`` vs ``reference.ste_backward_experts`` for both modes, bit for bit
  (pass-through must return the output gradient unchanged; clipped zeroes where ``|x| > amax``,
  inclusive at ``|x| == amax``, NaN ``x`` -> +0).  Inputs hold the special values that decide it.
* Calibration: ``backend.max_calibrate`` (Model-Optimizer's ``TensorQuantizer``) over two batches
  vs ``reference.max_calibrate`` + ``update_running_amax``, value for value, and the amax dtype
  (Model-Optimizer keeps the batches' dtype, docs/measured.md §5).
"""

from __future__ import annotations

import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.contract import backend_device
from moe_fq_parity.harness.sections import SectionRow
from moe_fq_parity.harness.core.ulp import bits_equal, compare

from .probes import generator

STE_SHAPE = (8, 48)
"""Per-expert weight shape of the STE data (48 = 3 NVFP4 blocks)."""


def ste_data(fmt: str, seed: int, *, per_channel: bool) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """3 bf16 experts, amax below max|w| (so some clip), an element at exactly ``|x| == amax``,
    and (except NVFP4, which rejects NaN) a NaN, +-inf and -0; gradients random bf16."""
    gen = generator(seed, f"ste/{fmt}/{'channel' if per_channel else 'expert'}")
    ws = [torch.randn(STE_SHAPE, generator=gen).to(torch.bfloat16) * (i + 1) for i in range(3)]
    per = [(w.to(torch.float32).abs().amax(dim=1) if per_channel else w.to(torch.float32).abs().amax()) * 0.75 for w in ws]
    amax = torch.stack(per).to(torch.bfloat16).to(torch.float32)  # bf16-representable: |x| == amax exists
    for w, a in zip(ws, amax):
        a16 = a.to(torch.bfloat16)
        w[:, 0] = a16 if per_channel else a16.expand(w.shape[0])
        w[:, 1] = -w[:, 0]
    spec = reference.format_spec(fmt)
    if not spec.rejects_nan:
        for w in ws:
            w[1, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=torch.bfloat16)
    if spec.block is not None:  # NVFP4 takes a global amax >= max|w|: nothing clips, everything passes
        amax = torch.stack([w.to(torch.float32).abs().amax() for w in ws])
    grads = [torch.randn(STE_SHAPE, generator=gen).to(torch.bfloat16) for _ in ws]
    return ws, amax, grads


def ste_rows(backend: object, fmt: str, seed: int, prefix: str) -> list[SectionRow]:
    """One row per (granularity, mode): bit-equal gradients or a failure with counts."""
    rows = []
    dev = backend_device(backend)
    for per_channel in ((False, True) if "per_channel" in reference.format_spec(fmt).amax_granularities else (False,)):
        ws, amax, grads = ste_data(fmt, seed, per_channel=per_channel)
        gran = "per_channel" if per_channel else "per_expert"
        for mode in reference.STE_MODES:
            rid = f"{prefix}/{fmt}/ste/{gran}/{mode}"
            try:
                got = backend.ste_backward([w.to(dev) for w in ws], amax.to(dev), [g.to(dev) for g in grads], fmt, mode)
            except Exception as exc:  # noqa: BLE001 - the row fails and says why
                rows.append(SectionRow(rid, "fail", {"check": "ste", "format": fmt}, message=f"{type(exc).__name__}: {exc}"[:300]))
                continue
            want = reference.ste_backward_experts(ws, amax, grads, mode)
            e = torch.cat([t.reshape(-1) for t in want])
            g = torch.cat([t.detach().reshape(-1).cpu() for t in got])
            comp = compare(e, g)
            bit_diff = int((~bits_equal(e, g)).sum())
            ok = bit_diff == 0
            rows.append(SectionRow(
                rid, "pass" if ok else "fail",
                {"check": "ste", "format": fmt, "elements": e.numel(), "mismatches": e.numel() - comp.counts["exact"], "bit_mismatches": bit_diff},
                message="" if ok else f"first differing flat indices {comp.mismatch_index[:8].tolist()}",
            ))
    return rows


def calibration_rows(backend: object, seed: int, prefix: str) -> list[SectionRow]:
    """Max calibration over two batches per granularity; value and dtype must match."""
    calibrate = getattr(backend, "max_calibrate", None)
    if calibrate is None:
        return []
    gen = generator(seed, "calibration")
    batches = [torch.randn(16, 64, generator=gen).to(torch.bfloat16) * s for s in (1.0, 3.0)]
    batches[1][3, 5] = 40.0  # a new max in the second batch, per tensor and in row 3
    rows = []
    for gran in ("per_tensor", "per_channel"):
        rid = f"{prefix}/calibration/{gran}"
        running = None
        for b in batches:
            running = reference.update_running_amax(running, reference.max_calibrate(b, gran))
        try:
            got = calibrate(batches, gran)
        except Exception as exc:  # noqa: BLE001 - the row fails and says why
            rows.append(SectionRow(rid, "fail", {"check": "calibration"}, message=f"{type(exc).__name__}: {exc}"[:300]))
            continue
        equal = got.shape == running.shape and bool((got.to(torch.float32) == running).all())
        dtype_ok = got.dtype == batches[0].dtype
        rows.append(SectionRow(
            rid, "pass" if equal and dtype_ok else "fail",
            {"check": "calibration", "elements": running.numel(), "amax_dtype": str(got.dtype).replace("torch.", ""),
             "mismatches": int((got.to(torch.float32).reshape(running.shape) != running).sum()) if got.numel() == running.numel() else running.numel()},
            message="" if equal and dtype_ok else f"got {got.tolist()} ({got.dtype}), want {running.tolist()} in {batches[0].dtype}"[:300],
        ))
    return rows
