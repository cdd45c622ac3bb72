#!/usr/bin/env bash
# Runs the GPU test suite on a machine with GPUs, from a build/ made elsewhere
# (the GPU machine has no Lua and may lack a toolchain): `bash .ci/gpu-tests.sh [ctest args]`.
set -uo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
# ctest files hold the absolute paths of the machine that configured the build.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$root/build/CMakeCache.txt")
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
fi
# NCCL and NVRTC: the toolkit's, else the ones pip-installed CUDA packages carry.
for lib in libnccl.so.2 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13; do
  if ! ldconfig -p | grep -q "$lib"; then
    d=$(find / -xdev -name "$lib" -path '*nvidia*' 2>/dev/null | head -1)
    [ -z "$d" ] && d=$(find /usr/local -name "$lib" 2>/dev/null | head -1)
    [ -n "$d" ] && export LD_LIBRARY_PATH="$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
export NCCL_NVLS_ENABLE=0
nvidia-smi -L || true
ldd "$root/build/tests/gpu_one_gpu" | grep -E 'nccl|nvrtc|not found' || true
cd "$root/build" && ctest -L gpu --output-on-failure "$@"
