"""Kernel benchmark (one CUDA device): ``python -m moe_fq_parity.benchmarks.bench --out DIR``.

Modules by concern: ``cases`` (what is timed), ``measure`` (per-case timing and checks), ``host``
(host cost per call and PyTorch's own floors), ``profiling`` (tile sweep, arithmetic ceilings,
compiled-kernel facts), ``table`` (printed rows), ``bench`` (the command line and ``bench.json``).
Importing this package imports neither Triton nor a CUDA context.
"""
