#!/usr/bin/env bash
# Fuzzes spec load -> layout -> render for a bounded time (FUZZ_SECONDS,
# default 60) with libFuzzer under ASan and UBSan, from the shipped specs and
# tests/fuzz/corpus, with tests/fuzz/spec.dict. Fails on any crash, sanitizer
# report, hang (-timeout) or malformed error message (the harness aborts).
#   bash .ci/fuzz.sh [seconds]
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-${FUZZ_SECONDS:-60}}
# clang with its sanitizer and libFuzzer runtimes (Debian 12: clang 14).
probe=$(mktemp -d)
echo 'int LLVMFuzzerTestOneInput(const char *d, unsigned long n) { return d && n > 9; }' >"$probe/p.c"
if ! clang -fsanitize=fuzzer,address,undefined "$probe/p.c" -o "$probe/p" 2>/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi
rm -rf "$probe"
CC=clang cmake -S . -B build-fuzz -DKLGEN_FUZZ=ON -DBUILD_TESTING=OFF >/dev/null
cmake --build build-fuzz -j"$(nproc)" --target fuzz_spec >/dev/null
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# -timeout: a single input over 10 s is a hang (the sandbox allows 0.25 s);
# -rss_limit_mb: the sandbox caps Lua at 8 MiB here; -max_len: a page of spec.
build-fuzz/fuzz_spec "$work" specs tests/fuzz/corpus -dict=tests/fuzz/spec.dict \
  -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$work/" 2>&1 | tail -25
echo "fuzz: 1 passed, 0 failed (${secs} s, no crash, hang or malformed error)"
