#!/usr/bin/env bash
# klbench's and klfloor's command lines: misuse is refused (exit 2, or 1 for a
# bad value) with a message, before any GPU is touched (CI has none).
#   test_bench_cli.sh KLBENCH KLFLOOR SPEC
set -u
klbench=$1 klfloor=$2 spec=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
no() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() {
  local want=$1; shift
  "$@" >"$tmp/out" 2>"$tmp/err" </dev/null
  local got=$?
  [ "$got" = "$want" ] && ok || no "exit $got, want $want: $* :: $(head -3 "$tmp/err")"
}
has() { grep -q -- "$2" "$1" && ok || no "$1 lacks '$2': $(head -3 "$1")"; }

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

echo "test_bench_cli: $pass passed, $fail failed"
[ "$fail" = 0 ]
