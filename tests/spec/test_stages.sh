#!/usr/bin/env bash
# bench/stages.py: each stamps file under bench/stages still finds its
# anchors in the templates, and the stamped copy compiles (NVRTC, no GPU);
# misuse is refused with a message and leaves no copy; summarize reads the
# kernels' lines.
#   test_stages.sh KLGEN SOURCE_DIR
set -u
klgen=$1 src=$2
stages="python3 $src/bench/stages.py"
source "$(dirname "$0")/../lib/cli_lib.sh"

cat >"$tmp/spec.lua" <<'LUA'
return { name = "stages_k64", vocab_size = 163840, pad_to = 64, tp = 8, dtype = "bf16",
         max_tokens = 64, topk = 64 }
LUA
for f in "$src"/bench/stages/*.stamps; do
  name=$(basename "$f" .stamps)
  expect 0 $stages stamp "$f" "$tmp/$name";  has "$tmp/out" "stamps in $tmp/$name"
  expect 0 "$klgen" -q --templates "$tmp/$name" --check "$tmp/spec.lua"
done

expect 2 $stages;                                   has "$tmp/err" "usage: stages.py"
expect 2 $stages stamp only-one;                    has "$tmp/err" "usage: stages.py"
printf 'shards.cu.tmpl ||| no such line in any template ||| after ||| STAGE(0);\n' >"$tmp/bad.stamps"
expect 1 $stages stamp "$tmp/bad.stamps" "$tmp/bad"; has "$tmp/err" "occurs 0 times, not once"
[ ! -e "$tmp/bad" ] && ok || no "a failed stamp left $tmp/bad behind"
printf 'shards.cu.tmpl ||| x ||| inside ||| STAGE(0);\n' >"$tmp/bad2.stamps"
expect 1 $stages stamp "$tmp/bad2.stamps" "$tmp/bad2"; has "$tmp/err" "bad2.stamps:1: expected FILE"
printf 'nowhere.tmpl ||| x ||| after ||| STAGE(0);\n' >"$tmp/bad3.stamps"
expect 1 $stages stamp "$tmp/bad3.stamps" "$tmp/bad3"; has "$tmp/err" "no template nowhere.tmpl"
mkdir "$tmp/exists"
expect 1 $stages stamp "$src/bench/stages/filtered_sample.stamps" "$tmp/exists"
has "$tmp/err" "exists: give a new directory"

zeros=" 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0"
{
  echo "noise before"
  echo "stages step 300 cta 0: 0 100 200 -1$zeros"
  echo "stages step 812 cta 0: 0 300 250 -1$zeros"
  echo "stages step 1324 cta 0: 0 200 300 -1$zeros"
  echo "stages step 300 cta 1: -32 50 -1 -1$zeros"
} >"$tmp/run.log"
expect 0 $stages summarize "$tmp/run.log"
has "$tmp/out" "cta 0 (3 steps): 0:0 1:200 2:250 4:0"
has "$tmp/out" "cta 1 (1 steps): 0:-32 1:50 4:0"
echo "nothing here" >"$tmp/empty.log"
expect 1 $stages summarize "$tmp/empty.log";         has "$tmp/err" "no 'stages' lines"

finish test_stages
