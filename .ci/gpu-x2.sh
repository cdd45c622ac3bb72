#!/usr/bin/env bash
# What only two GPUs of one host can check, in one sitting on such a machine
# (two H100s or H200s joined by NVLink), from a build/ and a wheel in dist/ made elsewhere:
#   bash .ci/gpu-x2.sh [SECONDS] [LOGS]    (default 570 s, build/gpu-x2)
# In order: the benches whose figures are two-GPU ones (klbench --select:
# the plain gather at 1 token; klbench --sample and python -m klgen.bench
# --sample: kl_sample at tp 2 against gather + vLLM's torch sampler and NCCL
# pairs), the two-process ctest cases (gpu_tp2_*, gpu_select_tp2, the
# example), the GPU pytest (its tp 2 processes), then gpu_diff with NCCL
# itself (--nccl real: its NCCL cases on two GPUs) for what is left.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
budget=${1:-570}
logs=${2:-$root/build/gpu-x2}
mkdir -p "$logs" && logs=$(cd "$logs" && pwd)
start=$SECONDS
source "$(dirname "$0")/gpu-parts.sh"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
nvidia-smi -L 2>/dev/null | sed 's/^/gpu-x2: /'
if [ "$gpus" -lt 2 ]; then
  echo "gpu-x2: needs 2 GPUs, found $gpus"
  exit 77
fi
export KLGEN_CACHE_DIR="$root/build/test-cache"
kimi="$root/specs/kimi_k3_tp8.lua"
part select 90 "$root/build/klbench" "$kimi" --select --tokens 1,8,64
show select "^tokens|^[0-9]+ "
part sample 120 "$root/build/klbench" "$kimi" --sample --tokens 1,8,64
show sample "^tokens|^[0-9]+ "
# the two-process tests alone (gpu-session.sh runs gpu_one_gpu_*_tp2)
part ctest 200 bash "$root/.ci/gpu-tests.sh" -R '^(gpu_tp2_|gpu_select_tp2$|gpu_example_tp_decode$)'
show ctest "tests passed|Failed|\(Failed\)|\(Timeout\)"
# with the wheel in: the Python bench of kl_sample (against vLLM's torch sampler)
if wheel_pytest 150 "$root/tests/python/test_gpu.py"; then
  part python_sample 120 bash -c "cd /tmp && python3 -m klgen.bench kimi_k3_tp8 --sample --tokens 1,8,64"
  show python_sample "^tokens|^[0-9]+ "
fi
seed=${GPU_DIFF_SEED:-$(( $(date +%s) % 1000000 * 1000 ))}
minutes=$(awk -v s="$(left)" 'BEGIN { m = (s - 30) / 60; print (m > 0.2 ? m : 0.2) }')
# shellcheck disable=SC2086
part gpu_diff "$(left)" "$root/build/tests/gpu_diff" --seed "$seed" --cases 100000 \
  --minutes "$minutes" --nccl real ${GPU_DIFF_ARGS:-}
show gpu_diff "^FAIL|^STALL|^SKIP|lost|gpu_diff: (seeds|tp|[0-9]+ passed|[0-9]+ case\(s\) stalled)"
parts_status
