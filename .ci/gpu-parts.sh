# shellcheck shell=bash
# Sourced by the GPU session scripts: parts run in order within a budget of
# seconds ($budget, from $start), each bounded, its output in $logs/NAME.log
# (a part that did not run leaves none, not an older run's). failed counts
# the parts that failed or did not run; the script ends with parts_status.
failed=0
left() { echo $((budget - (SECONDS - start))); }
part() { # name, seconds at most, then the command; prints rc and time
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  rm -f "$logs/$name.log"
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -le 5 ]; then
    echo "gpu-session: $name: no time left"
    failed=$((failed + 1))
    return 1
  fi
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  rc=$?
  echo "gpu-session: $name: rc $rc in $((SECONDS - t0)) s (log: $logs/$name.log)"
  [ $rc -eq 0 ] || failed=$((failed + 1))
  return $rc
}
# A part's log lines matching a pattern, indented (nothing if it left no log).
show() { # name, grep -E pattern
  [ -f "$logs/$1.log" ] && grep -E "$2" "$logs/$1.log" | head -20 | sed 's/^/  /'
  return 0
}
# The wheel in dist/ into this Python (no deps: the machine has torch), then
# the GPU pytest over tests/python, or the files given, as part "pytest".
# Returns 1 when no wheel went in.
wheel_pytest() { # seconds at most, then pytest's file arguments (default: all)
  local limit=$1 wheel
  shift
  wheel=$(ls -t "$root"/dist/klgen-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ] || ! python3 -m pip install -q --no-deps --force-reinstall \
      --root-user-action=ignore "$wheel" >"$logs/pip.log" 2>&1; then
    echo "gpu-session: pytest: no wheel installed from dist/ (bash .ci/wheel.sh dist; $logs/pip.log)"
    failed=$((failed + 1))
    return 1
  fi
  local files=("$@")
  [ ${#files[@]} -eq 0 ] && files=("$root/tests/python")
  # from elsewhere than the tree: the installed klgen is what is imported
  part pytest "$limit" bash -c 'cd /tmp && python3 -m pytest -q -m gpu -rs "$@"' _ "${files[@]}"
  show pytest "passed|failed|error|SKIPPED"
  return 0
}
parts_status() { # the script's exit status: 0 when every part passed
  echo "gpu-session: $failed part(s) failed or did not run"
  [ "$failed" -eq 0 ]
}
