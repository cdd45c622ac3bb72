#!/usr/bin/env bash
# klgen's command line: exit codes, outputs, and no partial output on error.
#   test_cli.sh KLGEN SPECS_DIR TEMPLATES_DIR
set -u
klgen=$1 specs=$2 templates=$3
source "$(dirname "$0")/../lib/cli_lib.sh"
empty_dir() { [ -z "$(ls -A "$1" 2>/dev/null)" ] && ok || no "$1 not empty: $(ls -A "$1")"; }
ms() { date +%s%3N; } # milliseconds

# usage errors: exit 2
expect 0 "$klgen" --help;            has "$tmp/out" "usage: klgen"
expect 0 "$klgen" --version;         has "$tmp/out" "klgen 0.1.0"
expect 2 "$klgen";                   has "$tmp/err" "no spec file given"
expect 2 "$klgen" --frobnicate x.lua; has "$tmp/err" "unknown option --frobnicate"
expect 2 "$klgen" "$specs/kimi_k3_tp8.lua" -o; has "$tmp/err" "option -o needs an argument"
expect 2 "$klgen" --arch compute_90 "$specs/kimi_k3_tp8.lua"; has "$tmp/err" "expected sm_XY"
expect 2 "$klgen" --check --cubin "$specs/kimi_k3_tp8.lua"

# the main job
expect 0 "$klgen" "$specs/kimi_k3_tp8.lua" -o "$tmp/a"
has "$tmp/out" "kimi_k3_tp8: vocab 163840 -> padded 163840, tp 8, shard 20480 (40960 B/rank/token), bf16, vec 16 B"
[ -s "$tmp/a/kimi_k3_tp8.cu" ] && [ -s "$tmp/a/kimi_k3_tp8.h" ] && ok || no "outputs missing"
grep -q '#include' "$tmp/a/kimi_k3_tp8.cu" && no ".cu includes a header" || ok
has "$tmp/a/kimi_k3_tp8.h" "KL_KIMI_K3_TP8_GENERATED"
[ -z "$(ls -A "$tmp/a" | grep -v -e '^kimi_k3_tp8.cu$' -e '^kimi_k3_tp8.h$')" ] && ok || no "stray files: $(ls -A "$tmp/a")"

# README's quick start shows this very line
readme=$specs/../README.md
line=$(grep '^kimi_k3_tp8: vocab ' "$readme")
[ -n "$line" ] && [ "$line" = "$(cat "$tmp/out")" ] && ok || no "README's quick-start line '$line' is not the CLI's '$(cat "$tmp/out")'"
[ "$(wc -l <"$readme")" -le 230 ] && ok || no "README has $(wc -l <"$readme") lines, more than 230"
# its options block has every option --help lists
"$klgen" --help | sed -n 's/^  \(-[-a-z]*\).*/\1/p' >"$tmp/options"
block=$(sed -n '/^klgen \[options\]/,/^```$/p' "$readme")
while read -r option; do
  grep -q -- "^  .*$option\b" <<<"$block" && ok || no "README's klgen options lack $option"
done <"$tmp/options"
[ "$(wc -l <"$tmp/options")" -ge 10 ] && ok || no "klgen --help lists $(wc -l <"$tmp/options") options"
# its test command is the one CI runs
tests=$(grep -m1 '&& ctest --test-dir build' "$readme")
[ -n "$tests" ] && grep -qxF "$tests" "$specs/../.ci/run" && ok || no "README's test command '$tests' is not a line of .ci/run"

# shipped specs by name; a file of that name wins; --list
expect 0 "$klgen" kimi_k3_tp8 -o "$tmp/byname"
cmp -s "$tmp/byname/kimi_k3_tp8.h" "$tmp/a/kimi_k3_tp8.h" && ok || no "klgen NAME made another header"
expect 0 "$klgen" -q deepseek_v3 --check
mkdir -p "$tmp/wins" && printf 'return { name = "mine", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }' >"$tmp/wins/kimi_k3_tp8"
(cd "$tmp/wins" && "$klgen" --check kimi_k3_tp8) >"$tmp/out" 2>&1; has "$tmp/out" "^mine: vocab 8"
expect 1 "$klgen" no_such_spec
has "$tmp/err" "klgen: no_such_spec: no such file, and no shipped spec file or spec of that name (klgen --list shows them)"
[ "$(wc -l <"$tmp/err")" = 1 ] && ok || no "klgen NAME: $(cat "$tmp/err")"
expect 1 "$klgen" no_such.lua; has "$tmp/err" "no_such.lua: cannot open"
expect 0 "$klgen" --list
has "$tmp/out" "^deepseek_v3: deepseek_v3_tp2 deepseek_v3_tp4 deepseek_v3_tp8$"
has "$tmp/out" "^kimi_k3_tp8: kimi_k3_tp8$"
[ "$(grep -c '^[a-z0-9_]*: ' "$tmp/out")" = "$(ls "$specs"/*.lua | wc -l)" ] && ok || no "--list: $(cat "$tmp/out")"
expect 2 "$klgen" --list kimi_k3_tp8; has "$tmp/err" "--list takes no spec"
# every name --list prints, file stem or spec, is a SPEC: the stem all its
# specs, a spec's name that spec alone
"$klgen" --list | sed -n 's/^\([a-z0-9_]*\): \(.*\)$/\1 \2/p' >"$tmp/names"
while read -r stem defined; do
  expect 0 "$klgen" -q "$stem" -o "$tmp/stem_$stem"
  [ "$(ls "$tmp/stem_$stem" | wc -l)" = "$((2 * $(wc -w <<<"$defined")))" ] && ok || no "klgen $stem: $(ls "$tmp/stem_$stem")"
  for name in $defined; do
    expect 0 "$klgen" -q "$name" -o "$tmp/name_$name"
    [ "$(ls "$tmp/name_$name")" = "$(printf '%s.cu\n%s.h' "$name" "$name")" ] && ok || no "klgen $name: $(ls "$tmp/name_$name")"
  done
done <"$tmp/names"
# NAMEs after a SPEC pick its specs
expect 0 "$klgen" -q deepseek_v3 deepseek_v3_tp2 deepseek_v3_tp8 -o "$tmp/picked"
[ "$(ls "$tmp/picked" | tr '\n' ' ')" = "deepseek_v3_tp2.cu deepseek_v3_tp2.h deepseek_v3_tp8.cu deepseek_v3_tp8.h " ] && ok || no "picked: $(ls "$tmp/picked")"
expect 0 "$klgen" -q "$specs/deepseek_v3.lua" deepseek_v3_tp4 kimi_k3_tp8 -o "$tmp/picked2"
[ "$(ls "$tmp/picked2" | tr '\n' ' ')" = "deepseek_v3_tp4.cu deepseek_v3_tp4.h kimi_k3_tp8.cu kimi_k3_tp8.h " ] && ok || no "picked2: $(ls "$tmp/picked2")"
# a name the file does not define: the error lists those it does; nothing written
expect 1 "$klgen" "$specs/deepseek_v3.lua" deepseek_v3_tp5 -o "$tmp/nopick"
has "$tmp/err" "deepseek_v3_tp5: not a spec of .*deepseek_v3.lua (it defines deepseek_v3_tp2, deepseek_v3_tp4, deepseek_v3_tp8)"
[ ! -e "$tmp/nopick" ] && ok || no "a wrong NAME wrote $(ls "$tmp/nopick")"

# GPUs the kernels cannot run on: one line, before any compilation
expect 2 "$klgen" --arch sm_75 --check kimi_k3_tp8
has "$tmp/err" "klgen: --arch sm_75: the kernels need sm_80 or newer"
[ "$(wc -l <"$tmp/err")" = 1 ] && ok || no "sm_75: $(cat "$tmp/err")"

# the summary shows the epilogue and top-k
printf 'return { name = "ep", vocab_size = 256000, tp = 8, dtype = "bf16", max_tokens = 8, out_dtype = "fp32", softcap = 30.0, scale = 0.1, topk = 8 }' >"$tmp/ep.lua"
expect 0 "$klgen" --check "$tmp/ep.lua"
has "$tmp/out" "bf16, vec 16 B, buffers [0-9.]* MiB/rank, out fp32, softcap 30, scale 0.1, engine numerics, top-8, compiled for sm_90$"

# several specs and files at once; a loop file gives three
expect 0 "$klgen" -q "$specs/deepseek_v3.lua" "$specs/gpt2_tp4.lua" -o "$tmp/b"
[ "$(ls "$tmp/b" | wc -l)" = 8 ] && ok || no "expected 8 files: $(ls "$tmp/b")"
[ ! -s "$tmp/out" ] && ok || no "-q printed"

# --check writes nothing; compiles for each --arch
mkdir -p "$tmp/c"
expect 0 "$klgen" --check --arch sm_90 --arch sm_100 "$specs/kimi_k3_tp8.lua" -o "$tmp/c"
has "$tmp/out" "compiled for sm_90 sm_100"
empty_dir "$tmp/c"
[ ! -s "$tmp/err" ] && ok || no "--check printed warnings: $(cat "$tmp/err")"

# --cubin
expect 0 "$klgen" --cubin --arch sm_90 --arch sm_100 "$specs/gpt2_tp4.lua" -o "$tmp/d"
[ -s "$tmp/d/gpt2_tp4.sm_90.cubin" ] && [ -s "$tmp/d/gpt2_tp4.sm_100.cubin" ] && ok || no "cubins"

# errors: exit 1, precise message, nothing written, existing files untouched
cat >"$tmp/bad.lua" <<'LUA'
return {
  name = "bad",
  vocab_size = 50257,
  tp = 5,
  dtype = "bf16",
  max_tokens = 4,
}
LUA
mkdir -p "$tmp/e" && echo old >"$tmp/e/kimi_k3_tp8.cu"
expect 1 "$klgen" "$specs/kimi_k3_tp8.lua" "$tmp/bad.lua" -o "$tmp/e"
has "$tmp/err" "klgen: $tmp/bad.lua:4: tp: padded vocab 50304"
[ "$(cat "$tmp/e/kimi_k3_tp8.cu")" = old ] && ok || no "existing output overwritten on error"
[ "$(ls -A "$tmp/e")" = kimi_k3_tp8.cu ] && ok || no "partial output: $(ls -A "$tmp/e")"
expect 1 "$klgen" "$tmp/missing.lua" -o "$tmp/f"; has "$tmp/err" "missing.lua: cannot open"
[ ! -e "$tmp/f" ] && ok || no "output dir made for a failed run"
echo 'return {' >"$tmp/syntax.lua"
expect 1 "$klgen" "$tmp/syntax.lua"; has "$tmp/err" "syntax.lua:2: unexpected symbol near <eof>"
printf 'return { name = "x", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }' >"$tmp/x.lua"
expect 1 "$klgen" "$tmp/x.lua" "$tmp/x.lua"; has "$tmp/err" "'x' is also defined in"
touch "$tmp/file"
expect 1 "$klgen" "$specs/kimi_k3_tp8.lua" -o "$tmp/file"; has "$tmp/err" "not a directory"
expect 1 "$klgen" "$specs"; has "$tmp/err" "not a regular file"

# a FIFO is refused, not waited on
mkfifo "$tmp/fifo.lua"
expect 1 timeout 20 "$klgen" "$tmp/fifo.lua"; has "$tmp/err" "fifo.lua: not a regular file"

# the spec's path never reaches the generated files: same bytes from anywhere,
# even from a directory whose name holds a newline and a comment terminator
odd="$tmp/we*/ird
dir"
mkdir -p "$odd" && cp "$specs/kimi_k3_tp8.lua" "$odd/"
expect 0 "$klgen" -q "$odd/kimi_k3_tp8.lua" -o "$tmp/odd"
cmp -s "$tmp/odd/kimi_k3_tp8.cu" "$tmp/a/kimi_k3_tp8.cu" && cmp -s "$tmp/odd/kimi_k3_tp8.h" "$tmp/a/kimi_k3_tp8.h" \
  && ok || no "generated files depend on the spec's directory"
evil="$tmp/evil
#error x*.lua"
cp "$specs/kimi_k3_tp8.lua" "$evil"
expect 0 "$klgen" -q "$evil" -o "$tmp/nl_out"
has "$tmp/nl_out/kimi_k3_tp8.cu" "from evil__error_x_.lua"
has "$tmp/nl_out/kimi_k3_tp8.h" "from evil__error_x_.lua"
cat "$tmp/nl_out/kimi_k3_tp8.cu" "$tmp/nl_out/kimi_k3_tp8.h" | grep -q '^#error' \
  && no "a file name broke out of a comment" || ok

# unchanged outputs are not rewritten (same inode and time); changed ones are
before=$(stat -c '%i %Y' "$tmp/a/kimi_k3_tp8.cu" "$tmp/a/kimi_k3_tp8.h")
sleep 1
expect 0 "$klgen" -q "$specs/kimi_k3_tp8.lua" -o "$tmp/a"
[ "$(stat -c '%i %Y' "$tmp/a/kimi_k3_tp8.cu" "$tmp/a/kimi_k3_tp8.h")" = "$before" ] && ok || no "unchanged files rewritten"

# names equal up to case share file names and header guards: refused
printf 'return { name = "Foo", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }' >"$tmp/foo1.lua"
printf 'return { name = "foo", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }' >"$tmp/foo2.lua"
expect 1 "$klgen" "$tmp/foo1.lua" "$tmp/foo2.lua" -o "$tmp/case"; has "$tmp/err" "differs only in case from 'Foo'"
[ ! -e "$tmp/case" ] && ok || no "output written for a case clash"

# a target that cannot be replaced is found before anything is written
mkdir -p "$tmp/h/kimi_k3_tp8.h" && echo old >"$tmp/h/kimi_k3_tp8.cu"
expect 1 "$klgen" "$specs/kimi_k3_tp8.lua" -o "$tmp/h"; has "$tmp/err" "kimi_k3_tp8.h: exists and is not a regular file"
[ "$(cat "$tmp/h/kimi_k3_tp8.cu")" = old ] && ok || no ".cu replaced although the .h could not be"
[ "$(ls -A "$tmp/h" | sort | tr '\n' ' ')" = "kimi_k3_tp8.cu kimi_k3_tp8.h " ] && ok || no "leftovers: $(ls -A "$tmp/h")"

# errors name the whole path and the right line, however long the path
long="$tmp/$(printf 'd%.0s' $(seq 1 120))"
mkdir -p "$long" && printf 'return {\n  name = "x", vocab_size = 8, tp = 3,\n' >"$long/s.lua"
expect 1 "$klgen" "$long/s.lua"; has "$tmp/err" "klgen: $long/s.lua:3: unexpected symbol near <eof>"

# a spec that never ends is stopped at the time limit
echo 'while true do pcall(function() while true do end end) end' >"$tmp/loop.lua"
expect 1 timeout 20 "$klgen" --time-limit 200 "$tmp/loop.lua"; has "$tmp/err" "loop.lua:1: ran past its time limit (200 ms)"
expect 2 "$klgen" --time-limit 0 "$tmp/loop.lua"
has "$tmp/err" "klgen: --time-limit 0: expected an integer in 1..3600000"
# the limit libklrt reads is the command's too; --time-limit wins; a malformed
# value is refused as the library refuses it (test_api: the same message)
expect 1 env KLGEN_SPEC_TIME_MS=200 timeout 20 "$klgen" "$tmp/loop.lua"; has "$tmp/err" "(200 ms)"
expect 1 env KLGEN_SPEC_TIME_MS=200 timeout 20 "$klgen" --time-limit 300 "$tmp/loop.lua"; has "$tmp/err" "(300 ms)"
for v in abc 0 12x 3600001; do
  expect 2 env KLGEN_SPEC_TIME_MS=$v "$klgen" -q "$specs/gpt2_tp4.lua" -o "$tmp/env"
  [ "$(cat "$tmp/err")" = "klgen: environment: KLGEN_SPEC_TIME_MS='$v': expected an integer in 1..3600000" ] \
    && ok || no "KLGEN_SPEC_TIME_MS=$v: $(cat "$tmp/err")"
done
expect 2 env KLGEN_SPEC_TIME_MS=abc "$klgen" --time-limit 100 -q "$specs/gpt2_tp4.lua" -o "$tmp/env"
[ ! -e "$tmp/env" ] && ok || no "output written under a malformed KLGEN_SPEC_TIME_MS"
expect 2 env "KLGEN_SPEC_TIME_MS=$(printf '1\033[2J')" "$klgen" -q "$specs/gpt2_tp4.lua" -o "$tmp/env"
has "$tmp/err" "KLGEN_SPEC_TIME_MS='1\\\\x1b\\[2J'"

# spec/hostile: each refused within 1.5 times its limit, under --time-limit
# and under KLGEN_SPEC_TIME_MS alike, with its message, nothing written
for f in "$(dirname "$0")"/hostile/*.lua; do
  want=$(sed -n '1s/^-- refused: //p' "$f")
  for how in option env; do
    t0=$(ms)
    if [ $how = option ]; then expect 1 timeout 20 "$klgen" --time-limit 500 "$f" -o "$tmp/hostile"
    else expect 1 env KLGEN_SPEC_TIME_MS=500 timeout 20 "$klgen" "$f" -o "$tmp/hostile"; fi
    dt=$(($(ms) - t0))
    [ "$dt" -lt 750 ] && ok || no "$(basename "$f") ($how) took $dt ms under a 500 ms limit"
    has "$tmp/err" "^klgen: $f:[0-9]*: .*$want"
    [ ! -e "$tmp/hostile" ] && ok || no "$(basename "$f"): output written"
  done
done

# the message for a long field chain is built without recursion (a crash,
# SIGSEGV, before Lua 5.4.8), and bitwise operations on constants past the
# 256th compute the right value (1000 | 2, not 2)
{ printf 'local t = {}\nt.x = t\nreturn t'; yes .x | head -n 100000 | tr -d '\n'; echo '.nope + 1'; } >"$tmp/chain.lua"
expect 1 "$klgen" --time-limit 500 "$tmp/chain.lua"
has "$tmp/err" "chain.lua:3: attempt to perform arithmetic on a nil value (field 'nope')"
{ printf 'local k = {'; seq -f ' %g.5,' 0 299 | tr -d '\n'; echo ' }';
  echo "return { name = 'm', vocab_size = 1000 | (2 or 3), tp = 1, dtype = 'bf16', max_tokens = 1 }"; } >"$tmp/bits.lua"
expect 0 "$klgen" "$tmp/bits.lua" -o "$tmp/bits"; has "$tmp/out" "^m: vocab 1002 -> padded 1024"

# files are made as any program makes them: 0666 less the caller's umask
(umask 077 && "$klgen" -q --cubin "$specs/gpt2_tp4.lua" -o "$tmp/u77")
[ "$(stat -c %a "$tmp/u77"/* | sort -u | tr '\n' ' ')" = "600 " ] && ok || no "umask 077: $(stat -c '%a %n' "$tmp/u77"/*)"
[ "$(stat -c %a "$tmp/u77")" = 700 ] && ok || no "umask 077: directory $(stat -c %a "$tmp/u77")"
(umask 022 && "$klgen" -q "$specs/gpt2_tp4.lua" -o "$tmp/u22")
[ "$(stat -c %a "$tmp/u22"/* | sort -u | tr '\n' ' ')" = "644 " ] && ok || no "umask 022: $(stat -c '%a %n' "$tmp/u22"/*)"

# paths are paths: after --, even names that look like options
mkdir -p "$tmp/dash" && cp "$specs/gpt2_tp4.lua" "$tmp/dash/--help" && cp "$specs/kimi_k3_tp8.lua" "$tmp/dash/-q"
(cd "$tmp/dash" && "$klgen" -o out -- --help -q) >"$tmp/out" 2>"$tmp/err" && ok || no "-- : $(cat "$tmp/err")"
has "$tmp/out" "gpt2_tp4: vocab 50257"
has "$tmp/out" "kimi_k3_tp8: vocab 163840"
[ -s "$tmp/dash/out/gpt2_tp4.cu" ] && [ -s "$tmp/dash/out/kimi_k3_tp8.h" ] && ok || no "-- : outputs missing"

# what a spec (or a file name) says reaches the terminal with its control bytes escaped
no_controls() { tr -d '\n' <"$1" | LC_ALL=C grep -q '[[:cntrl:]]' && no "control bytes in $1: $(cat -A "$1")" || ok; }
printf 'error("\\27[2J\\nklgen: wrote x.cu\\7")' >"$tmp/esc.lua"
expect 1 "$klgen" "$tmp/esc.lua"
has "$tmp/err" 'esc.lua:1: \\x1b\[2J\\x0aklgen: wrote x.cu\\x07'
[ "$(wc -l <"$tmp/err")" = 1 ] && ok || no "a spec's message made $(wc -l <"$tmp/err") lines"
no_controls "$tmp/err"
expect 1 "$klgen" "$tmp/$(printf 'a\033[31m\rb').lua"; has "$tmp/err" 'a\\x1b\[31m\\x0db.lua: cannot open'
no_controls "$tmp/err"
expect 2 "$klgen" "--x$(printf '\033')"; has "$tmp/err" 'unknown option --x\\x1b'
no_controls "$tmp/err"
expect 2 "$klgen" --arch "sm_9$(printf '\033')" "$specs/gpt2_tp4.lua"; has "$tmp/err" 'expected sm_XY'
no_controls "$tmp/err"

# a file defines at most 16 specs to generate; refused before any work
specs_file() { echo "local t = {} for i = 1, $1 do t[i] = { name = 'm' .. i, vocab_size = 163840, tp = 8, dtype = 'bf16', max_tokens = 64, topk = 8 } end return t"; }
specs_file 17 >"$tmp/s17.lua" && specs_file 16 >"$tmp/s16.lua"
for opt in "" --check --cubin; do
  expect 1 timeout 20 "$klgen" $opt "$tmp/s17.lua" -o "$tmp/many"
  has "$tmp/err" "s17.lua:1: name: 'm17' is spec 17 of the 17 picked from the file; klgen generates kernels for at most 16 specs a file"
  [ ! -e "$tmp/many" ] && ok || no "output written for 17 specs ($opt)"
done
expect 0 "$klgen" -q "$tmp/s16.lua" -o "$tmp/many"
[ "$(ls "$tmp/many" | wc -l)" = 32 ] && ok || no "16 specs: $(ls "$tmp/many" | wc -l) files"

# the summary must arrive: stdout closed or full is an error (files written
# or not), nothing printed is nothing lost
"$klgen" "$specs/gpt2_tp4.lua" -o "$tmp/closed" >&- 2>"$tmp/err"
[ $? = 1 ] && ok || no "stdout closed: exit not 1"
has "$tmp/err" "^klgen: cannot write to standard output: Bad file descriptor$"
expect 1 sh -c '"$0" "$1" -o "$2" >/dev/full' "$klgen" "$specs/gpt2_tp4.lua" "$tmp/full"
has "$tmp/err" "^klgen: cannot write to standard output: No space left on device$"
expect 1 sh -c '"$0" --list >/dev/full' "$klgen"
expect 1 sh -c '"$0" --help >&-' "$klgen"
expect 0 sh -c '"$0" -q "$1" -o "$2" >/dev/full' "$klgen" "$specs/gpt2_tp4.lua" "$tmp/full"

# template code runs in the spec sandbox: no pattern functions (a
# backtracking find runs in C, past any clock), the same time limit
cp -r "$templates" "$tmp/tpl_find"
sed -i '1i % local _ = string.find(string.rep("a", 60), string.rep("a*", 30) .. "b")' "$tmp/tpl_find/prelude.cuh.tmpl"
expect 1 timeout 20 "$klgen" --templates "$tmp/tpl_find" "$specs/gpt2_tp4.lua" -o "$tmp/tf"
has "$tmp/err" "klgen: templates/prelude.cuh.tmpl:1: undefined field 'string.find'"
cp -r "$templates" "$tmp/tpl_loop"
sed -i '3i % while true do pcall(function() while true do end end) end' "$tmp/tpl_loop/oneshot.cu.tmpl"
t0=$(ms)
expect 1 timeout 20 "$klgen" --templates "$tmp/tpl_loop" "$specs/gpt2_tp4.lua" -o "$tmp/tf"
dt=$(($(ms) - t0))
has "$tmp/err" "klgen: templates/oneshot.cu.tmpl:3: ran past its time limit (2000 ms)"
[ "$dt" -lt 3000 ] && ok || no "a looping template took $dt ms under its 2000 ms limit"
[ ! -e "$tmp/tf" ] && ok || no "output written despite a hostile template"

# NVRTC's log and --list's names reach the terminal escaped too
cp -r "$templates" "$tmp/tpl_warn"
printf '#warning a\033[2Jb\n' >>"$tmp/tpl_warn/relayout.cu.tmpl"
printf 'return { name = "w", vocab_size = 8, tp = 1, dtype = "bf16", max_tokens = 1 }' >"$tmp/w.lua"
expect 0 "$klgen" --check --templates "$tmp/tpl_warn" "$tmp/w.lua"
has "$tmp/err" 'warning directive: a\\x1b\[2Jb'
no_controls "$tmp/err"
mkdir -p "$tmp/pkg/bin" "$tmp/pkg/specs" && cp "$klgen" "$tmp/pkg/bin/klgen"
cp "$tmp/w.lua" "$tmp/pkg/specs/$(printf 'a\033[31m').lua"
expect 0 "$tmp/pkg/bin/klgen" --list
has "$tmp/out" '^a\\x1b\[31m: w$'
no_controls "$tmp/out"

# --templates: a broken template is reported at its line, nothing written
cp -r "$templates" "$tmp/tpl"
sed -i '3s/.*/<%= NO_SUCH %>/' "$tmp/tpl/oneshot.cu.tmpl"
expect 1 "$klgen" --templates "$tmp/tpl" "$specs/kimi_k3_tp8.lua" -o "$tmp/g"
has "$tmp/err" "templates/oneshot.cu.tmpl:3: unknown name 'NO_SUCH'"
[ ! -e "$tmp/g" ] && ok || no "output written despite a template error"

finish test_cli
