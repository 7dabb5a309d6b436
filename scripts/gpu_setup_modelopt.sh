#!/usr/bin/env bash
# Install Model-Optimizer 0.47.0 on a GPU host from a wheelhouse (docs/offline-gpu-hosts.md, step 3).
#
#   bash scripts/gpu_setup_modelopt.sh WHEELHOUSE
#
# Environment: MODELOPT_TARGET=DIR installs into DIR (pip --target; then export PYTHONPATH=DIR)
# instead of the current environment; MODELOPT_PRECOMPILE=1 also builds its two CUDA extensions now
# (about 51 s each) instead of at first use.
set -euo pipefail
[ $# -eq 1 ] && [ -d "$1" ] || { echo "usage: $0 WHEELHOUSE (a folder filled by scripts/wheelhouse.sh)" >&2; exit 2; }
house=$1
where=(); [ -n "${MODELOPT_TARGET:-}" ] && where=(--target "$MODELOPT_TARGET") && export PYTHONPATH=$MODELOPT_TARGET${PYTHONPATH:+:$PYTHONPATH}
python3 -m pip install -q --no-index --find-links "$house" "${where[@]}" 'nvidia-modelopt==0.47.0' requests huggingface_hub 'pulp<4'
python3 - <<'PY'
import time
t = time.time()
import modelopt
import modelopt.torch.quantization.tensor_quant  # noqa: F401  (the module the backend uses)
print(f"gpu_setup_modelopt: modelopt {modelopt.__version__} imports ({time.time() - t:.1f} s)")
PY
if [ "${MODELOPT_PRECOMPILE:-0}" = 1 ]; then
  python3 - <<'PY'
import time
from modelopt.torch.quantization.extensions import get_cuda_ext, get_cuda_ext_fp8
for get in (get_cuda_ext, get_cuda_ext_fp8):
    t = time.time()
    assert get(raise_if_failed=True) is not None
    print(f"gpu_setup_modelopt: {get.__name__} built/loaded in {time.time() - t:.1f} s")
PY
fi
