#!/usr/bin/env bash
# Install Transformer Engine 2.20.2 on a GPU host from a wheelhouse (docs/offline-gpu-hosts.md, step 3):
# the wheels, then its PyTorch extension built from the sdist against this host's CUDA.
#
#   bash scripts/gpu_setup_te.sh WHEELHOUSE
#
# Environment: TE_TARGET=DIR installs into DIR (pip --target; then export PYTHONPATH=DIR) instead of
# the current environment; MAX_JOBS (default 16) for the extension build.
set -euo pipefail
[ $# -eq 1 ] && [ -d "$1" ] || { echo "usage: $0 WHEELHOUSE (a folder filled by scripts/wheelhouse.sh)" >&2; exit 2; }
house=$1
where=(); [ -n "${TE_TARGET:-}" ] && where=(--target "$TE_TARGET") && export PYTHONPATH=$TE_TARGET${PYTHONPATH:+:$PYTHONPATH}
t0=$SECONDS
MAX_JOBS=${MAX_JOBS:-16} NVTE_PYTORCH_FORCE_BUILD=TRUE python3 -m pip install -q --no-index --find-links "$house" \
  --no-build-isolation "${where[@]}" 'transformer-engine[pytorch]==2.20.2'
echo "gpu_setup_te: installed in $((SECONDS - t0)) s"
python3 - <<'PY'
import time
t = time.time()
import transformer_engine
import transformer_engine.pytorch  # noqa: F401
print(f"gpu_setup_te: transformer_engine {transformer_engine.__version__} imports ({time.time() - t:.1f} s)")
PY
