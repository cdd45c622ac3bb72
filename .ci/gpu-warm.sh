#!/usr/bin/env bash
# Fills the GPU tests' JIT cache (build/test-cache) with the kernels of the
# test spec files for this machine's GPU, one test_nvrtc a spec, as many at
# once as the machine has cores: NVRTC takes tens of seconds a spec, which
# the GPU tests otherwise spend one spec after another.
#   bash .ci/gpu-warm.sh [SPEC_FILE...]   (default: the select and sample test specs)
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -1 | tr -d '.')
[ -n "$arch" ] || { echo "gpu-warm: no GPU"; exit 1; }
files=("$@")
[ ${#files[@]} -eq 0 ] && files=("$root/tests/select/select_specs.lua" "$root/tests/sample/sample_specs.lua")
cache="$root/build/test-cache" nvrtc="$root/build/tests/test_nvrtc" most=$(nproc) n=0
mkdir -p "$cache" && chmod 700 "$cache"
for f in "${files[@]}"; do
  # each spec's name: `{ name = "..."` opening its table
  for name in $(sed -n 's/^ *{ *name *= *"\([A-Za-z0-9_]*\)".*/\1/p' "$f"); do
    while [ "$(jobs -rp | wc -l)" -ge "$most" ]; do wait -n; done
    ("$nvrtc" --only "$name" --arch "sm_$arch" --cache "$cache" "$f" >/dev/null 2>&1 ||
      echo "gpu-warm: $name failed") &
    n=$((n + 1))
  done
done
wait
echo "gpu-warm: $n spec(s) compiled for sm_$arch into $cache"
