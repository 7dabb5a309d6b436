"""Run kernel jobs under Triton's interpreter on the CPU, in a process of its own.

``python -m tests.kernels.interp_worker JOBS OUT``: ``JOBS`` is a ``torch.save``d list of dicts
(``op`` = ``experts`` | ``stacked`` | ``clipped``, ``fmt``, ``options``, ``x`` (list or tensor),
``amax``, ``grads``); writes the list of results to ``OUT``.  ``test_gpu.py`` uses it to put the
interpreter's bits beside the GPU's: ``TRITON_INTERPRET`` must be set before Triton is imported,
so it cannot share the GPU test's process.
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402


def run(job: dict):
    import kernels

    if job["op"] == "experts":
        return kernels.fake_quant_experts(job["x"], job["amax"], job["fmt"], **job["options"])
    if job["op"] == "stacked":
        return kernels.fake_quant(job["x"], job["amax"], job["fmt"], **job["options"])
    if job["op"] == "clipped":
        return kernels.ste_backward_experts(job["x"], job["amax"], job["grads"], "clipped")
    raise ValueError(f"unknown op {job['op']!r}")


def main(argv: list[str]) -> int:
    jobs = torch.load(argv[0])
    torch.save([run(j) for j in jobs], argv[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
