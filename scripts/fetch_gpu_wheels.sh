#!/usr/bin/env bash
# Fetch, here (CPU side, with network), the Python files our GPU machines cannot download.
#
#   .whl/        Model-Optimizer 0.47.0 and the small dependencies the GPU image lacks
#                (FINDINGS §6), Python 3.12 manylinux x86_64 wheels, one version each.
#   .te/small/   Transformer Engine 2.20.2 (FINDINGS §8): meta wheel, PyTorch-extension sdist,
#                nvidia-cudnn-frontend (headers for the build), nvdlfw-inspect, and pydantic with
#                its small dependencies (TE imports it), SHA256SUMS and CORE.sha256.
#   .te/pK/      the 276 MB core wheel (transformer-engine-cu13) split into pieces of 57 MiB
#                (< 59 MB), one folder per piece with its own .sha256: one GPU call each.
#
# Both folders are ignored (.git/info/exclude): nothing fetched here is committed.
# Usage: scripts/fetch_gpu_wheels.sh [modelopt|te|all]      (default: all)
# Then: scripts/gpu_setup_modelopt.sh and scripts/gpu_setup_te.sh on the GPU machine.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"

MODELOPT_WHEELS=(
  nvidia-modelopt==0.47.0
  pydantic==2.13.4          # pydantic-core: the exact version this pins, read from its METADATA
  annotated-types==0.7.0
  typing-inspection==0.4.2
  typing-extensions==4.15.0 # pydantic 2.13 needs >= 4.14.1; the image's version is not known
  omegaconf==2.4.0          # 2.3.x imports antlr4 4.9, which has no wheel
  pulp==3.3.2               # pulp 4.x imports a module missing there (FINDINGS §6)
)
TE_VERSION=2.20.2
TE_SMALL_WHEELS=(transformer-engine==$TE_VERSION "nvidia-cudnn-frontend>=1.29.0" nvdlfw-inspect
                 pydantic==2.13.4 annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.15.0)
TE_CORE=transformer-engine-cu13==$TE_VERSION
TE_SDIST=transformer_engine_torch-$TE_VERSION.tar.gz
PIECE=57M

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

# wheels for the GPU machines' Python (3.12, CPython, x86_64), no dependency resolution
download() {  # download DIR SPEC...
  local dir=$1; shift
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" "$@" 2>&1 | grep -v "^WARNING: Location" || true
  for spec in "$@"; do
    local name=${spec%%[=<>]*}; name=${name//-/_}
    ls "$dir" | grep -qi "^${name}-" || { echo "fetch: no wheel for $spec in $dir" >&2; exit 1; }
  done
}

requires() {  # requires WHEEL: its Requires-Dist lines without extras
  unzip -p "$1" '*/METADATA' | grep '^Requires-Dist' | grep -v 'extra ==' || true
}

pydantic_core() {  # pydantic_core DIR: add the pydantic-core wheel that DIR's pydantic pins
  local core
  core=$(unzip -p "$1"/pydantic-2.13.4-*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
  [ -n "$core" ] || { echo "fetch: cannot read the pydantic-core pin" >&2; exit 1; }
  download "$1" "pydantic-core==$core"
}

fetch_modelopt() {
  mkdir -p .whl
  download .whl "${MODELOPT_WHEELS[@]}"
  pydantic_core .whl
  # one version per distribution, or pip refuses the whole --no-index install
  local dup
  dup=$(ls .whl/*.whl | xargs -n1 basename | cut -d- -f1 | tr 'A-Z-' 'a-z_' | sort | uniq -d)
  [ -z "$dup" ] || { echo "fetch: several versions of: $dup (remove the extra ones from .whl/)" >&2; exit 1; }
  echo "== .whl requirements of nvidia-modelopt (the GPU image has the others, KINDS.md):"
  requires .whl/nvidia_modelopt-0.47.0-*.whl | sed 's/^/   /'
}

fetch_te() {
  mkdir -p .te/small
  download .te/small "${TE_SMALL_WHEELS[@]}"
  pydantic_core .te/small
  # the sdist: pip download would build its metadata (needs CUDA): take the file the index names
  if [ ! -f ".te/small/$TE_SDIST" ]; then
    local href url sha
    href=$(curl -fsS --max-time 60 https://pypi.org/simple/transformer-engine-torch/ | grep -o "https://[^\"]*/$TE_SDIST#sha256=[0-9a-f]*" | head -1)
    url=${href%%#*}; sha=${href##*#sha256=}
    [ -n "$url" ] && [ -n "$sha" ] || { echo "fetch: $TE_SDIST not on the index" >&2; exit 1; }
    curl -fsSL --max-time 300 -o ".te/small/$TE_SDIST" "$url"
    echo "$sha  .te/small/$TE_SDIST" | sha256sum -c --quiet
  fi
  # the core wheel, in pieces of <= $PIECE, one folder each
  local tmp whl
  tmp=$(mktemp -d)
  download "$tmp" "$TE_CORE"
  whl=$(ls "$tmp"/*.whl)
  rm -rf .te/p[0-9]*
  (cd .te/small && rm -f SHA256SUMS && sha256sum ./*.whl ./*.tar.gz > SHA256SUMS)
  echo "$(sha256sum "$whl" | cut -d' ' -f1)  $(basename "$whl")" > .te/small/CORE.sha256
  split -b "$PIECE" -d -a 1 "$whl" "$tmp/part"
  for p in "$tmp"/part*; do
    local k=${p##*part}
    mkdir -p ".te/p$k"
    mv "$p" ".te/p$k/$(basename "$whl").part$k"
    (cd ".te/p$k" && sha256sum ./*.part"$k" > "part$k.sha256")
  done
  rm -rf "$tmp"
}

report() {
  echo "== sizes (bytes; one GPU call carries at most 64 MiB = 67108864 with the working tree)"
  for d in .whl .te/small .te/p*; do
    [ -d "$d" ] && printf '%10d  %s\n' "$(du -sb "$d" | cut -f1)" "$d"
  done
  return 0
}

case "${1:-all}" in
  modelopt) fetch_modelopt ;;
  te) fetch_te ;;
  all) fetch_modelopt; fetch_te ;;
  *) echo "usage: $0 [modelopt|te|all]" >&2; exit 2 ;;
esac
report
