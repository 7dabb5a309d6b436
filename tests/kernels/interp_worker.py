"""Run kernel jobs under Triton's interpreter on the CPU, in a process of its own.

``python -m tests.kernels.interp_worker JOBS OUT``: ``JOBS`` is a ``torch.save``d list of dicts
(``op`` = ``experts`` | ``stacked`` | ``clipped``, ``fmt``, ``options``, ``x`` (list or tensor),
``amax``, ``grads``); writes the list of results to ``OUT``.  ``test_gpu.py`` uses it to put the
interpreter's bits beside the GPU's: ``TRITON_INTERPRET`` must be set before Triton is imported,
so it cannot share the GPU test's process (and this module must never be imported by it: it sets
the environment at import).
"""

from __future__ import annotations

import os
import sys

os.environ["TRITON_INTERPRET"] = "1"
os.environ["CUDA_VISIBLE_DEVICES"] = ""

import torch  # noqa: E402


def main(argv: list[str]) -> int:
    from tests.kernels.kernel_jobs import run  # after TRITON_INTERPRET is set

    jobs = torch.load(argv[0])
    torch.save([run(j) for j in jobs], argv[1])
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
