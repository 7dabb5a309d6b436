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
    for fmt, options in (("int4_group", {}), ("fp8_block", {}), ("fp8_block", {"fp32_scale": True}), ("mxfp8", {}), ("mxfp4", {})):
        ws = expert_weights(gen, [(64, 200), (0, 8), (33, 40), (128, 1024)], torch.bfloat16, specials=fmt != "int4_group")
        jobs.append(dict(op="experts", fmt=fmt, options=options, x=ws, amax=None))
        x = allbf.reshape(-1, 32)[torch.randperm(2048, generator=gen)].reshape(4, 64, 256)  # every bf16 value, 32-blocks shuffled
        if fmt == "int4_group":  # the reference rejects NaN and inf input to INT4 group-wise
            x = torch.where(torch.isfinite(x), x, torch.zeros((), dtype=x.dtype))
        jobs.append(dict(op="stacked", fmt=fmt, options=options, x=x.contiguous(), amax=None))
        ws = expert_weights(gen, [(48, 160)] * 3, torch.float16, specials=fmt != "int4_group")
        jobs.append(dict(op="experts", fmt=fmt, options=options, x=ws, amax=None))
        if fmt != "int4_group":  # square tiles: 128x128 or 32x32, partial ones in both dims
            jobs.append(dict(op="stacked", fmt=fmt, options={**options, "tile_2d": True}, x=x.reshape(2, 128, 256)[:, :100, :200].contiguous(),
                             amax=None))  # fmt: skip
            ws = expert_weights(gen, [(150, 300), (0, 8), (33, 40)], torch.bfloat16)
            jobs.append(dict(op="experts", fmt=fmt, options={**options, "tile_2d": True}, x=ws, amax=None))
    ws = expert_weights(gen, [(64, 200), (0, 8), (33, 40), (128, 1024)], torch.bfloat16, specials=False)
    jobs.append(dict(op="experts", fmt="nvfp4", options={"tile_2d": True}, x=ws, amax=amax_stack(ws, ["max", "odd", "below", "zero"],
                                                                                                   per_channel=False)))  # fmt: skip
    ws = expert_weights(gen, [(40, 72), (0, 5), (40, 72)], torch.bfloat16)
    grads = [torch.randn(w.shape, generator=gen).to(torch.bfloat16) for w in ws]
    jobs.append(dict(op="clipped", fmt="", options={}, x=ws, amax=amax_stack(ws, ["below", "max", "odd"], per_channel=False), grads=grads))
    jobs.append(dict(op="clipped", fmt="mxfp8", options={}, x=ws, amax=None, grads=grads))
    return jobs


def _on(job: dict, device: str) -> dict:
    move = lambda v: [t.to(device) for t in v] if isinstance(v, list) else v.to(device) if isinstance(v, torch.Tensor) else v  # noqa: E731
    return {k: move(v) for k, v in job.items()}


def _reference(job: dict):
    if job["op"] == "experts":
        return reference.fake_quant_experts(job["x"], job["amax"], job["fmt"], **job["options"])
    if job["op"] == "stacked":
        return [reference.fake_quant(job["x"], job["amax"], job["fmt"], **job["options"])]
    return reference.ste_backward_experts(job["x"], job["amax"], job["grads"], "clipped", fmt=job["fmt"] or None)


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


def _graph_capture(step, warmup: int = 3) -> torch.cuda.CUDAGraph:
    """``step`` run eagerly on a side stream ``warmup`` times (tables cached, kernels compiled), then captured."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph


@pytest.mark.parametrize("stacked", [False, True], ids=["list", "stacked"])
@pytest.mark.parametrize("fmt,per_channel", [("int8", False), ("fp8_e4m3", True), ("nvfp4", False)])
def test_cuda_graph_replay_is_bit_identical_to_eager(fmt: str, per_channel: bool, stacked: bool) -> None:
    """QuantGroupedLinear forward + clipped backward captured in one CUDA graph (N weights, or one
    stacked weight), and the functional call with a cached table: replays (after the inputs and amax
    change in place) give the same bits as eager calls on the same values."""
    torch.manual_seed(0)
    n, din, dout = 4, 256, 96
    layer = kernels.QuantGroupedLinear(n, din, dout, fmt, device="cuda", ste_mode="clipped", per_channel=per_channel, bias=True, stacked=stacked)
    params = [layer.weight] if stacked else layer.weights()
    with torch.no_grad():
        for q, w in zip(layer.weight_quantizer, layer.weights()):
            q._amax.copy_(w.float().abs().amax(dim=-1 if per_channel else None) * 0.8)
    splits = [5, 0, 7, 4]
    x = torch.randn(16, din, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    gy = torch.randn(16, dout, device="cuda", dtype=torch.bfloat16)
    static: dict[str, torch.Tensor] = {}

    def step() -> None:
        x.grad = None
        for w in params:
            w.grad = None
        y = layer(x, splits)
        y.backward(gy)
        static["y"] = y
        static["gx"] = x.grad
        for i, w in enumerate(params):
            static[f"gw{i}"] = w.grad

    ws = [w.detach() for w in layer.weights()]
    amax = layer.amax_vector()
    fq: dict[str, list[torch.Tensor]] = {}

    def functional() -> None:
        fq["out"] = kernels.fake_quant_experts(ws, amax, fmt)

    g_layer = _graph_capture(step)
    graph_out = dict(static)  # the graph's own output tensors (eager steps below rebind ``static``)
    g_fq = _graph_capture(functional)
    graph_fq = list(fq["out"])
    for trial in range(2):
        with torch.no_grad():  # new values at the same addresses
            x.copy_(torch.randn_like(x))
            gy.copy_(torch.randn_like(gy))
            amax.mul_(0.9)
        g_layer.replay()
        g_fq.replay()
        torch.cuda.synchronize()
        replayed = {k: v.clone() for k, v in graph_out.items()}
        replayed_fq = [t.clone() for t in graph_fq]
        step()
        functional()
        torch.cuda.synchronize()
        for k, v in static.items():
            assert_same_bits([replayed[k]], [v], case=f"{fmt}/graph/trial{trial}/{k}")
        assert_same_bits(replayed_fq, fq["out"], case=f"{fmt}/graph/functional")
        assert_same_bits(fq["out"], reference.fake_quant_experts(ws, amax, fmt), case=f"{fmt}/graph/reference")
    kernels.raise_pending_errors()


def test_default_checks_do_not_sync_and_raise_later() -> None:
    """``check_values=True`` on the GPU: the call returns without waiting for the device (a long
    kernel queued first is still running), the outputs of the bad expert are NaN, and the error is
    raised by ``raise_pending_errors`` (or the next checked call), then cleared."""
    ws = [torch.randn(64, 256, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    amax = torch.tensor([1.0, float("nan")], device="cuda")
    kernels.fake_quant_experts(ws, torch.ones(2, device="cuda"), "int8")  # compile + cache outside the timing
    kernels.raise_pending_errors()
    torch.cuda._sleep(200_000_000)  # ~0.1 s of device work queued ahead of the call (cycles)
    done = torch.cuda.Event()
    out = kernels.fake_quant_experts(ws, amax, "int8")
    done.record()
    assert not done.query(), "the checked call waited for the device"
    torch.cuda.synchronize()
    assert out[1].isnan().all() and out[0].isfinite().all()
    with pytest.raises(ValueError, match="amax is NaN.*earlier checked kernel call"):
        kernels.fake_quant_experts(ws, torch.ones(2, device="cuda"), "int8")  # the flag has landed: raised here
    kernels.fake_quant_experts(ws, torch.ones(2, device="cuda"), "int8")
    kernels.raise_pending_errors()  # cleared: nothing left


def test_checked_call_queues_only_its_kernel() -> None:
    """A checked call puts nothing on the device but its kernel: the flags go straight to mapped
    host memory, so no flag copy (``Memcpy``) follows the kernel on the stream."""
    from torch.profiler import ProfilerActivity, profile

    ws = [torch.randn(64, 256, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    amax = torch.ones(4, device="cuda")
    for fmt in ("int8", "nvfp4"):
        kernels.fake_quant_experts(ws, amax, fmt)  # compile and cache the table outside the profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for fmt in ("int8", "nvfp4"):
            kernels.fake_quant_experts(ws, amax, fmt)
        torch.cuda.synchronize()
    names = [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    assert sum("fake_quant_fwd_kernel" in n for n in names) == 2, f"the profiler saw these device activities: {names}"
    assert all("fake_quant_fwd_kernel" in n for n in names), f"a checked call queued more than its kernel: {names}"
    kernels.raise_pending_errors()


def test_graph_replay_that_finds_bad_amax_raises_at_the_next_checked_call() -> None:
    """A captured checked call replayed with a NaN amax (changed in place) writes NaN and sets the
    host flags itself: once the device has run the replay, the next eager checked call raises."""
    ws = [torch.randn(64, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    amax = torch.ones(3, device="cuda")
    box: dict = {}
    graph = _graph_capture(lambda: box.__setitem__("out", kernels.fake_quant_experts(ws, amax, "fp8_e4m3")))
    kernels.raise_pending_errors()
    amax[1] = float("nan")
    graph.replay()
    torch.cuda.synchronize()
    assert box["out"][1].isnan().all() and box["out"][0].isfinite().all()
    with pytest.raises(ValueError, match="amax is NaN.*earlier checked kernel call"):
        kernels.fake_quant_experts(ws, torch.ones(3, device="cuda"), "fp8_e4m3")
    kernels.raise_pending_errors()  # cleared: nothing left


def test_table_built_on_one_stream_serves_a_launch_on_another() -> None:
    """An expert table whose copy to the device is queued behind 0.1 s of work on the stream that
    built it serves a launch on a side stream: the launch waits for the copy (so it is still
    pending 20 ms later) and writes the reference bits.  Launched at once, it would read the
    table's memory before the copy (what the block held before, most likely the zeros freed just
    before: no expert written)."""
    import time

    from moe_fq_parity.kernels import tables

    g = torch.Generator(device="cuda").manual_seed(5)
    ws = [torch.randn(48, 320, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3)]
    amax = torch.stack([w.float().abs().amax() for w in ws])
    want = reference.fake_quant_experts(ws, amax, "int8")
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # compile, and leave an output block cached for the side stream
        kernels.fake_quant_experts(ws, amax, "int8")
    tables.clear_table_cache()
    blank = torch.zeros(5 * len(ws), dtype=torch.int64, device="cuda")  # device block the table's copy reuses
    staging = torch.empty(5 * len(ws), dtype=torch.int64, pin_memory=True)  # pinned block it reuses (no new
    del blank, staging  # pinned allocation, which could wait for the device)
    torch.cuda.synchronize()
    torch.cuda._sleep(200_000_000)  # ~0.1 s on the current stream, queued ahead of the table's copy
    tables.table_for(ws, validate=lambda: None)
    busy = torch.cuda.Event()
    busy.record()
    assert not busy.query(), "precondition: the table's copy must still be queued behind the sleep"
    with torch.cuda.stream(side):
        got = kernels.fake_quant_experts(ws, amax, "int8")
        done = torch.cuda.Event()
        done.record()
    time.sleep(0.02)
    assert not done.query(), "the side-stream launch did not wait for the table's copy to the device"
    torch.cuda.synchronize()
    assert_same_bits(got, want, ws, case="table built on another stream")
    kernels.raise_pending_errors()


def _compiled_variants(jit_fn) -> int:
    """How many compiled kernels ``jit_fn`` holds across devices (Triton's per-device kernel caches)."""
    return sum(len(entry[0]) for entry in jit_fn.device_caches.values())


def test_one_expert_calls_reuse_the_grouped_kernel() -> None:
    """A one-expert call compiles nothing new after a grouped call of the same format and shape:
    ``n_experts`` is not specialised (Triton turns an int argument equal to 1 into a constant).
    The shape is small, so both calls get the same tile and tiles per program."""
    from moe_fq_parity.kernels.bwd_kernel import clipped_bwd_kernel
    from moe_fq_parity.kernels.fwd_kernel import fake_quant_fwd_kernel

    ws = [torch.randn(64, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    grads = [torch.randn_like(w) for w in ws]
    amax = torch.full((3,), 2.0, device="cuda")
    kernels.fake_quant_experts(ws, amax, "int8")
    kernels.ste_backward_experts(ws, amax, grads, "clipped")
    before = _compiled_variants(fake_quant_fwd_kernel), _compiled_variants(clipped_bwd_kernel)
    one = kernels.fake_quant_experts(ws[:1], amax[:1], "int8")
    one_grad = kernels.ste_backward_experts(ws[:1], amax[:1], grads[:1], "clipped")
    kernels.raise_pending_errors()
    after = _compiled_variants(fake_quant_fwd_kernel), _compiled_variants(clipped_bwd_kernel)
    assert after == before, f"compiled kernels (forward, backward): {before} after the grouped calls, {after} after the one-expert calls"
    assert_same_bits(one, reference.fake_quant_experts(ws[:1], amax[:1], "int8"), case="one-expert/forward")
    assert_same_bits(one_grad, reference.ste_backward_experts(ws[:1], amax[:1], grads[:1], "clipped"), case="one-expert/backward")


def test_timed_samples_hide_host_time_behind_the_previous_call() -> None:
    """``harness.core.timing.time_call`` queues its samples: a call with 1 ms of host work before
    3 ms of device work is timed at about its device time (the host prepares the next call while
    the device runs this one), not at host + device as when every sample synchronised."""
    import statistics
    import time

    from moe_fq_parity.harness.core.timing import time_call

    cycles = 5_000_000
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda._sleep(cycles)  # warm up the sleep kernel
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    torch.cuda.synchronize()
    device_ms = start.elapsed_time(end)
    host_ms = device_ms / 3

    def call() -> None:
        t0 = time.perf_counter()
        while (time.perf_counter() - t0) * 1e3 < host_ms:  # host work before the launch
            pass
        torch.cuda._sleep(cycles)

    samples, timer = time_call(call, torch.device("cuda"), reps=10)
    median_ms = statistics.median(samples) / 1e3
    assert timer == "cuda_events"
    assert median_ms < device_ms + 0.5 * host_ms, f"median {median_ms:.2f} ms for {device_ms:.2f} ms of device and {host_ms:.2f} ms of host work"


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3", "nvfp4"])
def test_repeated_stacked_calls_launch_directly_with_the_reference_bits(fmt: str) -> None:
    """Stacked calls after the first of a shape take the cached plan and the compiled kernel's
    launcher (``launch._stacked_plan``): new tensors, new amax values, per-channel amax and an input
    not 16-byte aligned (its own fast-launch key) keep the reference's bits, forward and backward."""
    from moe_fq_parity.kernels import launch

    g = torch.Generator(device="cuda").manual_seed(11)
    launch._STACKED.clear()
    buf = torch.randn(4 * 64 * 96 + 8, device="cuda", generator=g).to(torch.bfloat16)
    views = [buf[: 4 * 64 * 96].view(4, 64, 96), torch.randn(4, 64, 96, device="cuda", generator=g).to(torch.bfloat16),
             buf[1 : 1 + 4 * 64 * 96].view(4, 64, 96)]  # fmt: skip
    amaxes = [torch.tensor([0.5, 1.0, 2.0, 4.0], device="cuda"), torch.tensor([3.0, 0.25, 1.5, 0.0], device="cuda")]
    if fmt != "nvfp4":
        amaxes.append(torch.rand(4, 64, device="cuda", generator=g) + 0.1)
    for x in views:
        for amax in amaxes:
            for _ in range(2):  # the second call of each goes through the direct launch
                got = kernels.fake_quant(x, amax, fmt)
                kernels.raise_pending_errors()
                assert_same_bits([got], [reference.fake_quant(x, amax, fmt)], [x], case=f"{fmt}/stacked-direct")
            grad = torch.randn(x.shape, device="cuda", generator=g).to(torch.bfloat16)
            for _ in range(2):
                got = kernels.ste_backward(x, amax, grad, "clipped")
                assert_same_bits([got], [reference.ste_backward(x, amax, grad, "clipped")], case=f"{fmt}/stacked-direct/bwd")
    assert all(plan[3] for plan in launch._STACKED.values()), "every stacked plan took the direct launch"


@pytest.mark.parametrize("fmt", ["int8", "int4", "fp8_e4m3", "nvfp4"])
def test_repeated_list_calls_launch_directly_with_the_reference_bits(fmt: str) -> None:
    """List calls after the first on a table take the compiled kernel's launcher with raw device
    addresses (``launch._launch``): new output buffers, new amax tensors (one off 16-byte alignment:
    its own fast-launch key), per-channel amax and every check mode keep the reference's bits,
    forward and clipped backward, and a bad amax found by a direct launch is still raised."""
    from moe_fq_parity.kernels import tables

    g = torch.Generator(device="cuda").manual_seed(12)
    tables.clear_table_cache()
    ws = [torch.randn(rows, 96, device="cuda", generator=g).to(torch.bfloat16) for rows in (64, 64, 64)]
    grads = [torch.randn(w.shape, device="cuda", generator=g).to(torch.bfloat16) for w in ws]
    spare = torch.tensor([9.0, 0.5, 1.0, 2.0], device="cuda")
    amaxes = [torch.tensor([0.5, 1.0, 2.0], device="cuda"), spare[1:], torch.tensor([3.0, 0.0, 1.5], device="cuda")]
    if fmt != "nvfp4":
        amaxes.append(torch.rand(3, 64, device="cuda", generator=g) + 0.1)
    for amax in amaxes:
        for check in (True, False, "sync"):
            for _ in range(2):  # the second call of each goes through the direct launch
                got = kernels.fake_quant_experts(ws, amax, fmt, check_values=check)
                kernels.raise_pending_errors()
                assert_same_bits(got, reference.fake_quant_experts(ws, amax, fmt), ws, case=f"{fmt}/list-direct/{check}")
        for _ in range(2):
            got = kernels.ste_backward_experts(ws, amax, grads, "clipped")
            assert_same_bits(got, reference.ste_backward_experts(ws, amax, grads, "clipped"), case=f"{fmt}/list-direct/bwd")
    cached = list(tables._TABLES.values())
    assert len(cached) == 2, f"{len(cached)} tables for one expert list with and without gradients"
    assert all(any(k[0] == "fast" for k in t.plans) for t in cached), "every table's launches took the direct launch"
    knobs = pytest.importorskip("triton").knobs
    seen: list = []
    chain = knobs.runtime.launch_enter_hook
    if hasattr(chain, "add"):  # a profiler's launch hook still sees direct launches, with their metadata
        hook = lambda md: seen.append(md.get()["name"])  # noqa: E731
        chain.add(hook)
        try:
            kernels.fake_quant_experts(ws, amaxes[0], fmt)
        finally:
            chain.remove(hook)
        kernels.fake_quant_experts(ws, amaxes[0], fmt)
        assert seen == ["fake_quant_fwd_kernel"], seen
    bad = torch.tensor([1.0, float("nan"), 1.0], device="cuda")
    kernels.fake_quant_experts(ws, bad, fmt)  # direct launch (the table and plan exist): the flags are mapped host memory
    with pytest.raises(ValueError, match="amax is NaN"):
        kernels.raise_pending_errors()


@pytest.mark.parametrize("fmt", ["int8", "fp8_e4m3", "nvfp4"])
def test_bf16_output_takes_the_hardware_conversion(fmt: str) -> None:
    """Where the GPU rounds fp32 -> bf16 in one instruction (``env.hw_bf16_rne``), the compiled
    forward kernel for bf16 experts uses it (``cvt.rn.bf16``), and fp16 experts do not get it; the
    output is the reference's either way (every bit pattern: ``test_forward.test_every_bf16_pattern``)."""
    from moe_fq_parity.kernels import env, launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import FMT_NVFP4, parse_spec

    g = torch.Generator(device="cuda").manual_seed(13)
    spec = parse_spec(fmt, None, {})
    for dtype in (torch.bfloat16, torch.float16):
        ws = [torch.randn(64, 256, device="cuda", generator=g).to(dtype) for _ in range(2)]
        amax = torch.tensor([1.5, 2.5], device="cuda")
        table = tables.expert_table(ws)
        flat, outs = tables.alloc_outputs(table, dtype, ws[0].device)
        view = amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=spec.code == FMT_NVFP4)
        compiled = launch.fwd_list(table, ws, flat, view, spec, check=False)
        want = env.hw_bf16_rne(ws[0].device) and dtype == torch.bfloat16
        assert ("cvt.rn.bf16" in compiled.asm["ptx"]) == want, f"{fmt}/{dtype}: hardware bf16 conversion expected {want}"
        assert_same_bits(outs, reference.fake_quant_experts(ws, amax, fmt), ws, case=f"{fmt}/{dtype}/hw_bf16")


@pytest.mark.parametrize("fmt", ["fp8_e4m3", "nvfp4", "fp8_block", "mxfp8"])
def test_e4m3_rounding_takes_the_hardware_conversion(fmt: str) -> None:
    """Where the GPU converts fp32 -> E4M3 in hardware (``env.hw_e4m3_rne``, compute capability
    8.9+), the compiled forward kernel rounds with it (``cvt.rn.satfinite.e4m3x2.f32``) unless the
    config turns it off (``KernelConfig.hw_e4m3``); the output is the reference's either way
    (boundary and special values included; every bf16 pattern: ``test_forward.test_every_bf16_pattern``)."""
    from dataclasses import replace

    from moe_fq_parity.kernels import env, launch, tables
    from moe_fq_parity.kernels.amax import amax_for_list
    from moe_fq_parity.kernels.formats import FMT_NVFP4, parse_spec

    g = torch.Generator(device="cuda").manual_seed(17)
    spec = parse_spec(fmt, None, {})
    ws = [torch.randn(64, 256, device="cuda", generator=g) * 2.0 ** torch.randint(-20, 20, (64, 1), device="cuda", generator=g) for _ in range(2)]
    ws = [w.to(torch.bfloat16) for w in ws]
    ws[0][0, :8] = torch.tensor([448.0, 464.0, 480.0, float("inf"), -float("inf"), 2.0**-9, 2.0**-10, 1.5 * 2.0**-9])
    if fmt != "nvfp4":
        ws[1][1, :2] = torch.tensor([float("nan"), -float("nan")])
    amax = torch.tensor([300.0, 2.5], device="cuda") if fmt in ("fp8_e4m3", "nvfp4") else None
    table = tables.expert_table(ws)
    base = launch.fwd_config(spec)
    for on in (True, False):
        cfg = replace(base, hw_e4m3=on)
        flat, outs = tables.alloc_outputs(table, torch.bfloat16, ws[0].device)
        view = (amax_for_list(amax, [r for r, _ in table.shapes], amax.device, nvfp4=spec.code == FMT_NVFP4) if amax is not None
                else kernels.api.no_amax(ws[0].device))  # fmt: skip
        compiled = launch.fwd_list(table, ws, flat, view, spec, check=False, config=cfg)
        want = on and env.hw_e4m3_rne(ws[0].device)
        assert ("cvt.rn.satfinite.e4m3x2.f32" in compiled.asm["ptx"]) == want, f"{fmt}: hardware E4M3 conversion expected {want}"
        assert_same_bits(outs, reference.fake_quant_experts(ws, amax, fmt), ws, case=f"{fmt}/hw_e4m3={on}")
