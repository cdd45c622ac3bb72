#!/usr/bin/env bash
# The CPU test suite built with AddressSanitizer and UndefinedBehaviorSanitizer
# (leaks included); any report fails the test that made it.
#   bash .ci/sanitize.sh
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-asan -DKLGEN_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$(nproc)" >/dev/null
# test_install compiles a consumer against the installed (instrumented)
# libraries with a plain cc, and test_python builds its own wheel: both belong
# to the plain build, not this one. The long tests repeat the default ones'
# host code over more specs (their time is NVRTC's, which is not instrumented).
checked() {
  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
    ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -LE 'gpu|long' \
    -E '^(test_install|test_python)$' "$@"
}
log=build-asan/sanitize.log
checked --output-log "$log" && exit 0
# LeakSanitizer's tracer can crash on its own at a process's exit; where that
# is all that failed, those tests run once more (.ci/tracer-crash.py says why).
crashed=$(python3 .ci/tracer-crash.py "$log") || exit 1
echo "sanitize: LeakSanitizer's tracer crashed in $crashed; running it again"
checked --rerun-failed
