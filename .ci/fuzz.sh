#!/usr/bin/env bash
# Fuzzes spec load -> layout -> render for a bounded time (FUZZ_SECONDS,
# default 60) with libFuzzer under ASan and UBSan, from the shipped specs,
# tests/fuzz/corpus and tests/spec/hostile, with tests/fuzz/spec.dict. Fails on any crash, sanitizer
# report, hang, malformed error message or missed time bound (the harness
# aborts); the input of every finding is kept in build-fuzz/findings/.
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
findings=build-fuzz/findings
mkdir -p "$findings"
work=$(mktemp -d) # the corpus grown by this run; only findings are kept
trap 'rm -rf "$work"' EXIT
# The harness holds each load to its limit (250 ms) + 1 s and each rendering
# to its own (2 s) + 1 s, as docs/design/spec.md promises; -timeout is for a
# hang past those: a file of 256 specs renders 512 times, seconds under ASan.
# -rss_limit_mb: Lua is capped at 32 MiB (the loader's default); -max_len:
# a page of spec (the loader takes up to 1 MiB; longer inputs find little).
set +e
build-fuzz/fuzz_spec "$work" specs tests/fuzz/corpus tests/spec/hostile -dict=tests/fuzz/spec.dict \
  -max_total_time="$secs" -timeout=60 -rss_limit_mb=2048 -max_len=4096 \
  -print_final_stats=1 -artifact_prefix="$findings/" >"$work/log" 2>&1
status=$?
set -e
tail -25 "$work/log"
if [ "$status" -ne 0 ]; then
  cp "$work/log" "$findings/log.txt"
  echo "fuzz: 0 passed, 1 failed (exit $status); input and log kept in $findings/: $(ls "$findings")"
  exit 1
fi
echo "fuzz: 1 passed, 0 failed (${secs} s, no crash, hang, missed bound or malformed error)"
