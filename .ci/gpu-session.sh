#!/usr/bin/env bash
# The whole GPU verification in one sitting on a GPU machine, from a build/
# and a wheel in dist/ made elsewhere (bash .ci/wheel.sh dist), within a time
# budget: each part is bounded, what is left goes to the differential suite.
#   bash .ci/gpu-session.sh [SECONDS] [LOGS]    (default 540 s, build/gpu-session)
# In order: the test specs' kernels compiled side by side into the tests'
# JIT cache (.ci/gpu-warm.sh); ctest -L gpu but gpu_diff; the wheel into this Python and the GPU
# pytest (tests/python, marker gpu); compute-sanitizer's four tools over one
# random case each (.ci/gpu-sanitize.sh 1); then gpu_diff over fresh seeds
# (GPU_DIFF_SEED, default from the clock; GPU_DIFF_ARGS adds options, e.g.
# --min-tp 16) until the budget is spent. One line per part, the logs in LOGS.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
budget=${1:-540}
logs=${2:-$root/build/gpu-session}
mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
export CUDA_DEVICE_MAX_CONNECTIONS=32
start=$SECONDS
source "$(dirname "$0")/gpu-parts.sh"
nvidia-smi -L 2>/dev/null | sed 's/^/gpu-session: /'
# ctest and the GPU pytest take most of a default budget (gpu_select and
# gpu_sample the longest: ranks sharing the GPU take a quarter share each);
# the sanitizers and gpu_diff get what is left, or a budget of their own
part warm 120 bash "$root/.ci/gpu-warm.sh"
show warm "gpu-warm"
part ctest 420 bash "$root/.ci/gpu-tests.sh" -E gpu_diff
show ctest "tests passed|Failed|\(Failed\)|\(Timeout\)"
wheel_pytest 240
part sanitize 300 env GPU_SANITIZE_LOGS="$logs/sanitize" bash "$root/.ci/gpu-sanitize.sh" 1
show sanitize "SUMMARY|gpu-sanitize:"
seed=${GPU_DIFF_SEED:-$(( $(date +%s) % 1000000 * 1000 ))}
minutes=$(awk -v s="$(left)" 'BEGIN { m = (s - 30) / 60; print (m > 0.2 ? m : 0.2) }')
# shellcheck disable=SC2086
part gpu_diff "$(left)" "$root/build/tests/gpu_diff" --seed "$seed" --cases 100000 \
  --minutes "$minutes" --nccl "standin:$root/build/tests/libkl_nccl_standin.so" ${GPU_DIFF_ARGS:-}
show gpu_diff "^FAIL|^STALL|lost|gpu_diff: (seeds|tp|[0-9.]+ s of|[0-9]+ passed|[0-9]+ case\(s\) stalled)"
parts_status
