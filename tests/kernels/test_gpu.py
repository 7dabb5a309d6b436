"""GPU tier: GPU kernel, interpreter kernel (CPU, own process) and reference give the same bits.

Also the int64 addressing: one expert of more than 2**31 elements, list and stacked layouts.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from moe_fq_parity import kernels
from moe_fq_parity import reference

from .bitcheck import AMAX_MODES, amax_stack, assert_same_bits, expert_weights
from .kernel_jobs import run

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]
ROOT = Path(__file__).resolve().parents[2]


def _jobs(gen: torch.Generator) -> list[dict]:
    jobs = []
    allbf = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).reshape(256, 256)
    sweep = torch.tensor([1.0, 0.7, 448.0, 3.0e38, 2.0**-24, 1e-3, 0.0, 1e4])
    for fmt in ("int8", "int4", "fp8_e4m3", "nvfp4"):
        ws = expert_weights(gen, [(64, 200), (0, 8), (33, 40), (128, 1024)], torch.bfloat16, specials=fmt != "nvfp4")
        modes = [AMAX_MODES[i % len(AMAX_MODES)] for i in range(len(ws))]
        jobs.append(dict(op="experts", fmt=fmt, options={}, x=ws, amax=amax_stack(ws, modes, per_channel=False)))
        x = allbf.expand(len(sweep), 256, 256).contiguous()
        if fmt == "nvfp4":
            x = torch.where(torch.isnan(x), torch.zeros((), dtype=x.dtype), x)
        jobs.append(dict(op="stacked", fmt=fmt, options={}, x=x, amax=sweep))
        if fmt != "nvfp4":
            ws = expert_weights(gen, [(48, 96)] * 3, torch.float16)
            jobs.append(dict(op="experts", fmt=fmt, options={"narrow_range": True} if "int" in fmt else {}, x=ws,
                             amax=amax_stack(ws, ["below", "odd", "max"], per_channel=True)))  # fmt: skip
    ws = expert_weights(gen, [(40, 72), (0, 5), (40, 72)], torch.bfloat16)
    grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16) for w in ws]
    jobs.append(dict(op="clipped", fmt="", options={}, x=ws, amax=amax_stack(ws, ["below", "max", "odd"], per_channel=False), grads=grads))
    return jobs


def _on(job: dict, device: str) -> dict:
    move = lambda v: [t.to(device) for t in v] if isinstance(v, list) else v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return {k: move(v) for k, v in job.items()}


def _reference(job: dict):
    if job["op"] == "experts":
        return reference.fake_quant_experts(job["x"], job["amax"], job["fmt"], **job["options"])
    if job["op"] == "stacked":
        return [reference.fake_quant(job["x"], job["amax"], job["fmt"], **job["options"])]
    return reference.ste_backward_experts(job["x"], job["amax"], job["grads"], "clipped")


def _as_list(v) -> list[torch.Tensor]:
    return list(v) if isinstance(v, (list, tuple)) else [v]


def test_gpu_interpreter_and_reference_agree(gen: torch.Generator, tmp_path: Path) -> None:
    jobs = _jobs(gen)
    torch.save(jobs, tmp_path / "jobs.pt")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "tests.kernels.interp_worker", str(tmp_path / "jobs.pt"), str(tmp_path / "out.pt")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    interp = torch.load(tmp_path / "out.pt")
    for i, job in enumerate(jobs):
        case = f"job{i}/{job['op']}/{job['fmt']}"
        gpu = _as_list(run(_on(job, "cuda")))
        # reference first: when the interpreter disagrees, this says which side left the spec
        assert_same_bits(gpu, _reference(job), case=case + "/gpu-vs-cpu-reference")
        assert_same_bits(gpu, _reference(_on(job, "cuda")), case=case + "/gpu-vs-gpu-reference")
        assert_same_bits(_as_list(interp[i]), _reference(job), case=case + "/interpreter-vs-cpu-reference")


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["list", "stacked"])
def test_past_2_pow_31_elements(layout: str) -> None:
    """int64 offsets: list = one expert of 2.15e9 elements; stacked = 3 experts of 1.07e9, the last
    starting past element 2**31.  First and last rows checked against the reference on those rows
    (the amax is per expert, so a row slice quantizes the same)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    amax = torch.tensor([1.5, 2.5, 0.7], device="cuda")
    if layout == "list":
        small = torch.randn(3, 16, device="cuda", dtype=torch.bfloat16)
        big = torch.randn(65540, 32768, device="cuda", generator=g, dtype=torch.bfloat16)  # 2,147,614,720 elements
        out = kernels.fake_quant_experts([small, big], amax[:2], "int8")
        assert_same_bits([out[0]], [reference.fake_quant(small, amax[0], "int8")], case="small")
        x, got, a, fmt = big, out[1], amax[1], "int8"
    else:
        xs = torch.randn(3, 32769, 32768, device="cuda", generator=g, dtype=torch.bfloat16)
        got_all = kernels.fake_quant(xs, amax, "fp8_e4m3")
        x, got, a, fmt = xs[2], got_all[2], amax[2], "fp8_e4m3"
    for sl in (slice(0, 4), slice(-4, None)):
        assert_same_bits([got[sl]], [reference.fake_quant(x[sl].contiguous(), a, fmt)], case=f"{layout}/rows{sl}")
