# Sourced by the command-line tests: a scratch directory $tmp and pass/fail
# counting. expect CODE CMD... runs CMD (stdin empty), checks its exit status
# and leaves its output in $tmp/out and $tmp/err; has FILE TEXT checks FILE.
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
# finish NAME: the summary line, and the exit status
finish() {
  echo "$1: $pass passed, $fail failed"
  [ "$fail" = 0 ]
}
