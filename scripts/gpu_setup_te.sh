#!/usr/bin/env bash
# Assemble Transformer Engine 2.20.2 on a GPU machine from files carried over several device calls
# (fetched here by scripts/fetch_gpu_wheels.sh; recipe of FINDINGS §8).  Files under $TE_HOME stay
# there while the machine is warm (30 s after each call), so the calls must follow each other.
#
#   bash scripts/gpu_setup_te.sh stash .te/p0            # carry [".te/p0"]; then p1, p2, p3 alike
#   bash scripts/gpu_setup_te.sh stash .te/p4 .te/small && bash scripts/gpu_setup_te.sh install
#                                                        # carry [".te/p4", ".te/small"]
#   export PYTHONPATH=/root/te/site${PYTHONPATH:+:$PYTHONPATH}   # later calls, same machine
#   bash scripts/gpu_setup_te.sh status                  # what is there, what is missing
#
# install: reassembles the core wheel, checks its sha256, installs the wheels with
# pip --no-index --no-deps --target $TE_HOME/site, builds the PyTorch extension from the sdist
# (--no-build-isolation, MAX_JOBS=16, no prebuilt-wheel download) and unzips it into the same
# directory with python -m zipfile (pip refuses to install it there: transformer_engine/ already exists;
# the GPU image has no unzip), then imports it.
set -euo pipefail
cd "$(dirname "$0")/.."
TE_HOME=${TE_HOME:-/root/te}
SITE=$TE_HOME/site

stash() {  # stash DIR...: checksum each carried folder, copy it under $TE_HOME
  mkdir -p "$TE_HOME/parts" "$TE_HOME/small"
  for dir in "$@"; do
    [ -d "$dir" ] || { echo "gpu_setup_te: $dir is not here: name it in carry" >&2; exit 1; }
    if ls "$dir"/part*.sha256 >/dev/null 2>&1; then
      (cd "$dir" && sha256sum -c --quiet part*.sha256)
      cp "$dir"/*.part[0-9]* "$TE_HOME/parts/"
    elif [ -f "$dir/SHA256SUMS" ]; then
      (cd "$dir" && sha256sum -c --quiet SHA256SUMS)
      cp "$dir"/* "$TE_HOME/small/"
    else
      echo "gpu_setup_te: $dir holds neither a piece nor the small files" >&2; exit 1
    fi
    echo "gpu_setup_te: stashed $dir"
  done
  status
}

status() {
  echo "gpu_setup_te: pieces in $TE_HOME/parts: $(ls "$TE_HOME/parts" 2>/dev/null | sed 's/.*\.part//' | tr '\n' ' ')"
  [ -f "$TE_HOME/small/CORE.sha256" ] && echo "gpu_setup_te: small files present" || echo "gpu_setup_te: small files missing"
  [ -d "$SITE/transformer_engine" ] && echo "gpu_setup_te: installed in $SITE" || true
}

install() {
  local sums=$TE_HOME/small/CORE.sha256 name
  [ -f "$sums" ] || { echo "gpu_setup_te: stash .te/small first" >&2; exit 1; }
  name=$(awk '{print $2}' "$sums")
  cat $(ls "$TE_HOME/parts/$name".part* | sort -V) > "$TE_HOME/$name"
  (cd "$TE_HOME" && sha256sum -c --quiet "$sums") || { echo "gpu_setup_te: core wheel checksum differs: a piece is missing or broken" >&2; status; exit 1; }
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" \
    "$TE_HOME/$name" "$TE_HOME"/small/*.whl
  local t0=$SECONDS
  rm -rf "$TE_HOME/dist"
  PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} NVTE_PYTORCH_FORCE_BUILD=TRUE MAX_JOBS=${MAX_JOBS:-16} \
    python3 -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$TE_HOME/dist" "$TE_HOME"/small/transformer_engine_torch-*.tar.gz
  echo "gpu_setup_te: extension built in $((SECONDS - t0)) s: $(ls "$TE_HOME/dist")"
  python3 -m zipfile -e "$TE_HOME"/dist/transformer_engine_torch-*.whl "$SITE"  # no unzip on the GPU image
  PYTHONPATH=$SITE${PYTHONPATH:+:$PYTHONPATH} python3 - <<'PY'
import time
t = time.time()
import transformer_engine
import transformer_engine.pytorch  # noqa: F401
print(f"gpu_setup_te: transformer_engine {transformer_engine.__version__} imports ({time.time() - t:.1f} s)")
PY
  echo "gpu_setup_te: export PYTHONPATH=$SITE\${PYTHONPATH:+:\$PYTHONPATH}"
}

case "${1:-}" in
  stash) shift; stash "$@" ;;
  install) install ;;
  status) status ;;
  *) echo "usage: $0 stash DIR... | install | status" >&2; exit 2 ;;
esac
