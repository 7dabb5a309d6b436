#!/usr/bin/env bash
# Fill a wheelhouse for a GPU host without a package index (docs/offline-gpu-hosts.md, step 1).
# Run on a connected host; pip uses whatever index pip is configured with.
#
#   scripts/wheelhouse.sh DIR [modelopt] [te] [megatron]      (default: modelopt te)
#
# Environment: PY_VERSION (default 3.12) and PLATFORMS (default manylinux2014 + manylinux_2_28
# x86_64): the GPU host's Python and platform.  Then copy DIR to the GPU host and run
# scripts/gpu_setup_modelopt.sh DIR / scripts/gpu_setup_te.sh DIR there.
set -euo pipefail
[ $# -ge 1 ] || { echo "usage: $0 DIR [modelopt] [te] [megatron]" >&2; exit 2; }
dir=$1; shift
extras=("$@"); [ ${#extras[@]} -gt 0 ] || extras=(modelopt te)
py=${PY_VERSION:-3.12}
read -r -a platforms <<< "${PLATFORMS:-manylinux2014_x86_64 manylinux_2_28_x86_64}"
target=(--python-version "$py" --implementation cp --only-binary=:all:)
for p in "${platforms[@]}"; do target+=(--platform "$p"); done
mkdir -p "$dir"
for extra in "${extras[@]}"; do
  case "$extra" in
    modelopt) python3 -m pip download "${target[@]}" -d "$dir" 'nvidia-modelopt==0.47.0' requests huggingface_hub 'pulp<4' ;;
    te)
      python3 -m pip download "${target[@]}" -d "$dir" 'transformer-engine[pytorch]==2.20.2' nvidia-cudnn-frontend
      python3 -m pip download --no-deps --no-binary transformer-engine-torch -d "$dir" 'transformer-engine-torch==2.20.2' ;;
    megatron) python3 -m pip download "${target[@]}" -d "$dir" 'megatron-core>=0.16' ;;
    *) echo "$0: unknown extra $extra (modelopt, te, megatron)" >&2; exit 2 ;;
  esac
done
(cd "$dir" && sha256sum -- * | grep -v ' SHA256SUMS$' > SHA256SUMS)
echo "wheelhouse $dir: $(ls "$dir" | wc -l) files, $(du -sh "$dir" | cut -f1); check on the GPU host with: (cd $dir && sha256sum -c SHA256SUMS)"
