#!/usr/bin/env bash
# compute-sanitizer's four tools (memcheck, racecheck, synccheck, initcheck)
# over the GPU tests with few steps (gpu_diff, at one rank under initcheck;
# gpu_fault; gpu_sample's rows),
# on a machine with a GPU, from a build/ made elsewhere: every kernel klgen
# generates, the tests' own and the NCCL stand-in's must report 0 errors.
#   bash .ci/gpu-sanitize.sh [cases] [tools]   (random specs of gpu_diff per tool,
#   default 6; tools default "memcheck racecheck synccheck initcheck")
# Each run's whole output goes to build/gpu-sanitize/TOOL-TEST.log
# (GPU_SANITIZE_LOGS moves it): a failing case's timings are there.
# Ranks share the GPU and wait on each other, so the poll limits are raised:
# under a tool a kernel runs many times slower.
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
cases=${1:-6}
tools=${2:-memcheck racecheck synccheck initcheck}
san=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -1)
[ -n "$san" ] || { echo "gpu-sanitize: no compute-sanitizer"; exit 1; }
t="$root/build/tests"
export CUDA_DEVICE_MAX_CONNECTIONS=32 KLGEN_CACHE_DIR="$root/build/test-cache"
logs=${GPU_SANITIZE_LOGS:-$root/build/gpu-sanitize}
mkdir -p "$logs"
failed=0 tool_errors=0
run() { # tool, then the command (the tool's own options in $flags)
  local tool=$1 out log
  shift
  log="$logs/$tool-$(basename "$1").log"
  # straight to the log: a run a caller's time limit ends keeps what it printed
  # shellcheck disable=SC2086
  "$san" --tool "$tool" --error-exitcode 86 --print-limit 20 ${flags:-} "$@" >"$log" 2>&1
  local rc=$?
  out=$(cat "$log")
  printf '%s\n' "$out" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|gpu_diff: [0-9]+ passed|gpu_fault:|^[0-9]+ passed|FAIL|STALL" | sed "s|^|$tool $(basename "$1"): |"
  if [ $rc -ne 0 ]; then
    failed=$((failed + 1))
    # 86: the tool found errors; else the test itself failed under the tool
    [ $rc -eq 86 ] && tool_errors=$((tool_errors + 1))
    printf '%s\n' "$out" | grep -B2 -A12 "========= [A-Z]" | head -60
  fi
}
for tool in $tools; do
  # initcheck: one rank. Under it a launch waits for the GPU's running
  # kernels, and ranks sharing the GPU wait for each other's launches: calls
  # return only after multiples of the poll limits, with the stand-in's and
  # the kernels' time-outs between.
  tp=""
  [ "$tool" = initcheck ] && tp="--max-tp 1"
  # a case hung under the tool is named with its stage before a caller's
  # time limit ends the run unexplained
  # shellcheck disable=SC2086
  run "$tool" "$t/gpu_diff" --seed 7000 --cases "$cases" --timeout-ms 60000 --case-deadline 120 \
    --nccl "standin:$t/libkl_nccl_standin.so" $tp
  # the stand-in waits longer for a peer too: under the tool a rank reaches
  # the all-gather only after its own one-shot step waited out the fault
  KL_STANDIN_TIMEOUT_S=600 run "$tool" "$t/gpu_fault" 5000 "$t/libkl_nccl_standin.so"
  # its misuse part passes host pointers on purpose: kl_check_ptr's query
  # fails for them as it should, which the tool would count as an error
  flags="--report-api-errors no" run "$tool" "$t/gpu_sample" "$root/tests/sample/sample_specs.lua" 16 \
    --no-distribution
done
runs=$((3 * $(wc -w <<<"$tools")))
echo "gpu-sanitize: $((runs - failed)) passed, $failed failed ($tool_errors with the tool's errors, \
$((failed - tool_errors)) the test's own failure under the tool; logs: $logs)"
[ $failed -eq 0 ]
