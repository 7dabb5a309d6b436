"""Backward and calibration checks of an external backend against the reference, as section rows.

* STE: ``backend.ste_backward`` vs ``reference.ste_backward_experts`` for both modes, bit for bit
  (``harness.core.equality.bit_diff``)
  (pass-through must return the output gradient unchanged; clipped zeroes where ``|x| > amax``,
  inclusive at ``|x| == amax``, NaN ``x`` -> +0).  Inputs hold the special values that decide it.
* STE clip rule (a fingerprint): the clipped backward on bf16 and fp16 experts whose per-expert
  fp32 amax lies strictly between two values of the weights' dtype and rounds up to one that is in
  the weights (plus an fp16 amax above 65504 with ``+-inf`` weights), one backend call per expert,
  evaluated under each ``reference.CLIP_RULES``; the row names the rule each call followed
  (``per_call``) and passes when every call follows one of the backend's documented rules
  (``DOCUMENTED_CLIP_RULES``; the order of the calls' rules is reported, never judged).
  The data is checked to separate the rules in every expert.
* Calibration: ``backend.max_calibrate`` (Model-Optimizer's ``TensorQuantizer``) over two batches
  vs ``reference.max_calibrate`` + ``update_running_amax``, value for value, and the amax dtype
  (Model-Optimizer keeps the batches' dtype, docs/measured.md §5).
"""

from __future__ import annotations

import torch

from moe_fq_parity import reference
from moe_fq_parity.harness.core.contract import backend_device
from moe_fq_parity.harness.sections import SectionRow
from moe_fq_parity.harness.core.equality import bit_diff, same_bits

from .probes import generator

STE_SHAPE = (8, 48)
"""Per-expert weight shape of the STE data (48 = 3 NVFP4 blocks)."""

DOCUMENTED_CLIP_RULES: dict[str, tuple[str, ...]] = {
    "modelopt-eager": ("torch_promotion",),
    "modelopt": ("torch_promotion", "fp32"),
}
"""The ``reference.CLIP_RULES`` each call of an external backend's clipped backward may follow.

Model-Optimizer 0.47.0 computes the mask in ``_fake_tensor_quant_backward``, a
``torch.jit.script`` function: ``x.abs() <= amax`` with the 0-dim amax of a quantizer.  Run as
written (always on CPU) it follows torch's type promotion (``torch_promotion``); once
TorchScript's profiling executor has fused it into a CUDA kernel, the comparison runs in fp32.
Which calls of a process run fused is the executor's choice, not a rule (the orders seen on a GPU:
docs/measured.md §13).  So the verdict depends on what each call computed only: every call must follow one of the backend's
documented rules (a backend not listed: one of ``reference.CLIP_RULES``), in any order."""


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
            diff = bit_diff(want, [t.detach().cpu() if isinstance(t, torch.Tensor) else t for t in got], label="expert")
            rows.append(SectionRow(
                rid, "pass" if diff.equal else "fail",
                {"check": "ste", "format": fmt, "elements": diff.numel, "mismatches": diff.mismatches},
                message="" if diff.equal else diff.summary()[:500],
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
        equal = got.shape == running.shape and bool(same_bits(running, got.to(torch.float32)).all())
        dtype_ok = got.dtype == batches[0].dtype
        rows.append(SectionRow(
            rid, "pass" if equal and dtype_ok else "fail",
            {"check": "calibration", "elements": running.numel(), "amax_dtype": str(got.dtype).replace("torch.", ""),
             "mismatches": int((got.to(torch.float32).reshape(running.shape) != running).sum()) if got.numel() == running.numel() else running.numel()},
            message="" if equal and dtype_ok else f"got {got.tolist()} ({got.dtype}), want {running.tolist()} in {batches[0].dtype}"[:300],
        ))
    return rows


def clip_rule_data(fmt: str, seed: int) -> tuple[list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """Experts that separate the clip rules (see the module docstring): per dtype (bf16, fp16) and
    per expert, a value ``u`` of that dtype, an fp32 amax strictly between ``u``'s lower neighbour
    and ``u`` that rounds (RNE) up to ``u``; the row holds ``u``, ``-u``, the neighbours and random
    values.  The fp16 expert with amax ``70000`` holds ``+-inf`` and ``65504``.  Gradients random."""
    gen = generator(seed, f"ste/clip_rule/{fmt}")
    ws, amax = [], []
    for dtype in (torch.bfloat16, torch.float16):
        for _ in range(3):
            u = (torch.rand((), generator=gen) * 8 + 0.5).to(dtype)
            lo = torch.nextafter(u, torch.zeros((), dtype=dtype))
            hi = torch.nextafter(u, torch.full((), 100.0, dtype=dtype))
            uf, lof = u.to(torch.float32), lo.to(torch.float32)
            a = uf - (uf - lof) * 0.25  # 3/4 of the way up from lo: rounds to u in the weights' dtype
            assert a.to(dtype) == u and a < uf
            rnd = (torch.rand(8, 24, generator=gen) * 2 - 1) * uf * 1.5
            w = rnd.to(dtype)
            w[:, 0], w[:, 1], w[:, 2], w[:, 3] = u, -u, lo, hi
            ws.append(w)
            amax.append(a)
    w = (torch.rand(8, 24, generator=gen) * 2 - 1).to(torch.float16) * 60000
    w[0, :3] = torch.tensor([float("inf"), -float("inf"), 65504.0], dtype=torch.float16)
    ws.append(w)
    amax.append(torch.tensor(70000.0))
    grads = [torch.randn(w.shape, generator=gen).to(w.dtype) for w in ws]
    return ws, torch.stack(amax).to(torch.float32), grads


def _runs(seq: list[str]) -> str:
    """``["a", "a", "b"]`` -> ``"a x2, b x1"``."""
    out: list[list] = []
    for r in seq:
        if out and out[-1][0] == r:
            out[-1][1] += 1
        else:
            out.append([r, 1])
    return ", ".join(f"{r} x{n}" for r, n in out)


def clip_rule_row(backend: object, fmt: str, seed: int, prefix: str) -> SectionRow:
    """Which ``reference.CLIP_RULES`` the backend's clipped backward follows, expert by expert in
    call order (the fingerprint ``per_call``); passes when every call follows one of the backend's
    ``DOCUMENTED_CLIP_RULES``, fails naming each call that follows none of them."""
    rid = f"{prefix}/{fmt}/ste/clip_rule"
    name = getattr(backend, "name", type(backend).__name__)
    allowed = DOCUMENTED_CLIP_RULES.get(name, reference.CLIP_RULES)
    ws, amax, grads = clip_rule_data(fmt, seed)
    dev = backend_device(backend)
    want = {r: [t.reshape(-1).to(torch.float32) for t in reference.ste_backward_experts(ws, amax, grads, "clipped", clip_rule=r)]
            for r in reference.CLIP_RULES}
    exp_text = " or ".join(allowed) + (", per call" if len(allowed) > 1 else "")
    fields = {"check": "ste_clip_rule", "format": fmt, "expected": exp_text, "elements": sum(w.numel() for w in ws)}
    separated = [int((~same_bits(a, b)).sum()) for a, b in zip(want["fp32"], want["torch_promotion"])]
    if not all(separated):
        return SectionRow(rid, "fail", fields, message=f"the clip-rule data does not separate the rules in every expert: {separated}")
    got = []
    try:
        for k, (w, g) in enumerate(zip(ws, grads)):  # one call per expert: the call order is the fingerprint
            got += backend.ste_backward([w.to(dev)], amax[k : k + 1].to(dev), [g.to(dev)], fmt, "clipped")
    except Exception as exc:  # noqa: BLE001 - the row fails and says why
        return SectionRow(rid, "fail", fields, message=f"{type(exc).__name__}: {exc}"[:300])
    got = [t.detach().reshape(-1).cpu().to(torch.float32) for t in got]
    counts = {r: sum(int((~same_bits(e, g)).sum()) for e, g in zip(want[r], got)) for r in reference.CLIP_RULES}
    per_call = []
    for k, g in enumerate(got):
        hit = [r for r in reference.CLIP_RULES if bool(same_bits(want[r][k], g).all())]
        per_call.append(hit[0] if len(hit) == 1 else "none")
    matched = [r for r, n in counts.items() if n == 0]
    fields.update(matched=", ".join(matched) or "none", per_call=_runs(per_call),
                  mismatches="; ".join(f"{r}={n}" for r, n in counts.items()), separating_elements=sum(separated))
    off = [k for k, r in enumerate(per_call) if r not in allowed]
    if not off:
        return SectionRow(rid, "pass", fields)
    why = "; ".join(f"call {k} ({ws[k].dtype}, amax {float(amax[k])!r}) follows {per_call[k] if per_call[k] != 'none' else 'no clip rule'}"
                    for k in off)
    return SectionRow(rid, "fail", fields,
                      message=f"expected {exp_text}: {why}; per call: {fields['per_call']} ({fields['mismatches']})"[:500])
