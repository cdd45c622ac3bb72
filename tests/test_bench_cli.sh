#!/usr/bin/env bash
# klbench's and klfloor's command lines: misuse is refused (exit 2, or 1 for a
# bad value) with a message, before any GPU is touched (CI has none).
#   test_bench_cli.sh KLBENCH KLFLOOR SPEC
set -u
klbench=$1 klfloor=$2 spec=$3
source "$(dirname "$0")/cli_lib.sh"

expect 2 "$klbench";                          has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" --frobnicate;     has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" --steps 0;        has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" --replays 65;     has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" name extra;       has "$tmp/err" "usage: klbench SPEC"
expect 1 "$klbench" "$spec" --tokens 1,x;     has "$tmp/err" "expected a list like 1,2,4,8"

expect 2 "$klfloor" --frobnicate;             has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --ctas 0;                 has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --threads 2048;           has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --replays 102;            has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --steps 12x;              has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --steps;                  has "$tmp/err" "usage: klfloor"

finish test_bench_cli
