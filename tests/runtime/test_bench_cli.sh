#!/usr/bin/env bash
# klbench's, klfloor's and tp_decode's command lines: misuse is refused (exit 2, or 1 for a
# bad value) with a message, before any GPU is touched (CI has none).
#   test_bench_cli.sh KLBENCH KLFLOOR SPEC TP_DECODE
set -u
klbench=$1 klfloor=$2 spec=$3 tp_decode=$4
source "$(dirname "$0")/../lib/cli_lib.sh"

expect 2 "$klbench";                          has "$tmp/err" "usage: klbench SPEC"
expect 0 "$klbench" --help;                   has "$tmp/out" "--templates DIR"
for o in --tokens --steps --replays --csv --plot --tune --no-gemm --select --topk --sample \
         --grid --quick --widths --dtypes --kernels --flashinfer; do
  has "$tmp/out" "^  $o "
done
expect 0 "$klfloor" -h;                       has "$tmp/out" "^  --replays R"
expect 2 "$klbench" "$spec" --frobnicate;     has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" --steps 0;        has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" --replays 65;     has "$tmp/err" "usage: klbench SPEC"
expect 2 "$klbench" "$spec" name extra;       has "$tmp/err" "usage: klbench SPEC"
expect 1 "$klbench" "$spec" --tokens 1,x;     has "$tmp/err" "expected a list like 1,2,4,8"
expect 2 "$klbench" "$spec" --select --sample; has "$tmp/err" "usage: klbench SPEC"
# --grid: each misuse named, exit 2, before any GPU
expect 2 "$klbench" --grid "$spec";          has "$tmp/err" "give no SPEC"
expect 2 "$klbench" --grid --sample;          has "$tmp/err" "neither --select, --sample"
expect 2 "$klbench" --grid --tune t.txt;      has "$tmp/err" "neither --select, --sample, --plot nor --tune"
expect 2 "$klbench" "$spec" --widths 20480;   has "$tmp/err" "go with --grid"
expect 2 "$klbench" --quick;                  has "$tmp/err" "go with --grid"
for w in 1000 20481 20480,20480 4194304 20480, x; do
  expect 2 "$klbench" --grid --widths "$w";   has "$tmp/err" "^klbench: --widths: expected distinct multiples of 8"
done
expect 2 "$klbench" --grid --dtypes fp16;     has "$tmp/err" "^klbench: --dtypes: expected bf16, fp32"
expect 2 "$klbench" --grid --dtypes bf16,bf16; has "$tmp/err" "^klbench: --dtypes: expected"
expect 2 "$klbench" --grid --kernels argmax,nope; has "$tmp/err" "^klbench: --kernels: expected distinct names"
expect 2 "$klbench" --grid --kernels plain,plain; has "$tmp/err" "^klbench: --kernels: expected"
expect 2 "$klbench" --grid --flashinfer "$tmp/none.so"; has "$tmp/err" "^klbench: --flashinfer: expected the path"
expect 2 "$klbench" --grid --tokens 1,65536;  has "$tmp/err" "tokens up to 65535"
expect 2 "$klbench" --grid --replays 65;      has "$tmp/err" "usage: klbench SPEC"
expect 0 "$klbench" --help;                   has "$tmp/out" "filtered  T x W x e read + T x 40"

expect 0 "$tp_decode" --help;                has "$tmp/out" "usage: tp_decode SPEC_FILE"
expect 2 "$tp_decode" --frobnicate;           has "$tmp/err" "usage: tp_decode SPEC_FILE"
[ "$(wc -l <"$tmp/err")" = 1 ] && ok || no "tp_decode: $(cat "$tmp/err")"
expect 2 "$tp_decode" "$spec" --steps 1;      has "$tmp/err" "usage: tp_decode SPEC_FILE"

expect 2 "$klfloor" --frobnicate;             has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --ctas 0;                 has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --threads 2048;           has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --replays 102;            has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --steps 12x;              has "$tmp/err" "usage: klfloor"
expect 2 "$klfloor" --steps;                  has "$tmp/err" "usage: klfloor"

finish test_bench_cli
