#!/usr/bin/env bash
# Install Model-Optimizer 0.47.0 on a GPU machine from the wheels carried in .whl/
# (fetched here by scripts/fetch_gpu_wheels.sh; nothing can be downloaded there, FINDINGS §6).
#
# In a device call that carries [".whl"]:
#   bash scripts/gpu_setup_modelopt.sh && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
# Environment: MODELOPT_SITE (install dir, default /tmp/site); MODELOPT_PRECOMPILE=1 also builds
# its two CUDA extensions now (about 51 s each) instead of at first use.
set -euo pipefail
cd "$(dirname "$0")/.."
site=${MODELOPT_SITE:-/tmp/site}

ls .whl/*.whl >/dev/null 2>&1 || { echo "gpu_setup_modelopt: no .whl/*.whl here: carry .whl" >&2; exit 1; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl
PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 - <<'PY'
import time
t = time.time()
import modelopt
import modelopt.torch.quantization.tensor_quant  # noqa: F401  (the module the backend uses)
print(f"gpu_setup_modelopt: modelopt {modelopt.__version__} imports ({time.time() - t:.1f} s)")
PY
if [ "${MODELOPT_PRECOMPILE:-0}" = 1 ]; then
  PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH} python3 - <<'PY'
import time
from modelopt.torch.quantization.extensions import get_cuda_ext, get_cuda_ext_fp8
for get in (get_cuda_ext, get_cuda_ext_fp8):
    t = time.time()
    assert get(raise_if_failed=True) is not None
    print(f"gpu_setup_modelopt: {get.__name__} built/loaded in {time.time() - t:.1f} s")
PY
fi
echo "gpu_setup_modelopt: installed into $site; export PYTHONPATH=$site\${PYTHONPATH:+:\$PYTHONPATH}"
