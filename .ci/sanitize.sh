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
# intercept_tls_get_addr=0: NVRTC's dynamic TLS (its builtins library, loaded
# at run time) can leave ASan with a bogus block in its record of the
# thread's dynamic TLS (GCC 12's runtime, glibc 2.36), which LeakSanitizer's
# tracer then reads and dies on at exit ("Tracer caught signal 11"), a crash
# of the sanitizer that hides whether anything leaked. Leaks are still found:
# only the dynamic TLS blocks' contents go unscanned as roots.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:intercept_tls_get_addr=0 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build-asan --output-on-failure -j"$(nproc)" -LE 'gpu|long' \
  -E '^(test_install|test_python)$'
