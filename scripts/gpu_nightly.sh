#!/usr/bin/env bash
# The GPU nightly job, in three phases (run them one after the other on one GPU host):
#
#   bash scripts/gpu_nightly.sh tests     # pytest -m gpu over reference/kernels/moe/external + device parity
#   bash scripts/gpu_nightly.sh report    # nightly parity report (triton; all sections) + modelopt INT/FP8 run
#   bash scripts/gpu_nightly.sh extra     # kernel benchmark, 20-seed no-false-positive run, 10k Hypothesis examples
#
# Outputs go under $OUT (default ./gpu-out).  Model-Optimizer / Transformer Engine are used when
# installed in this Python (docs/offline-gpu-hosts.md for hosts without a package index).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-gpu-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
# The harness installs editable without touching the image's torch/triton (no index needed).
python3 -c "import moe_fq_parity.harness" 2>/dev/null || python3 -m pip install -q --no-deps --no-build-isolation -e . || exit 1
rc=0
step() { echo; echo "=== $* ($(date +%T))"; }
run() { "$@" || { echo "!!! exit $? from: $*"; rc=1; }; }

case "${1:-}" in
  tests)
    step "devices"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    step "reference CPU vs CUDA bits"; run python3 -m moe_fq_parity.harness.run.device_parity --device cuda --json "$OUT/ref_parity.json"
    step "pytest -m gpu"; run python3 -m pytest -m gpu -q -p no:cacheprovider --junitxml="$OUT/gpu_tests.xml" \
        tests/reference tests/kernels tests/moe tests/external 2>&1 | tail -40
    ;;
  report)
    step "nightly report: triton (+ all sections)"; start=$SECONDS
    run moe-fq-parity run --suite nightly --backend triton --no-progress --out "$OUT/nightly"
    echo "nightly wall time: $((SECONDS - start)) s"
    step "modelopt CUDA backend, INT/FP8, nightly cases"; start=$SECONDS
    run moe-fq-parity run --suite nightly --backend modelopt \
        --formats int8,int4,fp8_e4m3 --no-sections --no-progress --out "$OUT/modelopt"
    echo "modelopt wall time: $((SECONDS - start)) s"
    ;;
  extra)
    step "kernel benchmark"; run python3 -m moe_fq_parity.benchmarks.bench --out "$OUT/bench"
    step "20 seeds x ci suite, triton"; run python3 -m moe_fq_parity.harness.sections.selftest.seeds --suite ci --backend triton --seeds 20 --json "$OUT/seeds.json"
    step "Hypothesis nightly profile"; run env HYPOTHESIS_PROFILE=nightly python3 -m pytest -q -p no:cacheprovider -m fuzz \
        tests/harness/test_fuzz.py --hypothesis-show-statistics 2>&1 | grep -E "passed|failed|examples|runtimes" | head -20
    ;;
  *) echo "usage: $0 tests | report | extra" >&2; exit 2 ;;
esac
exit $rc
