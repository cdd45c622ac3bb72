# shellcheck shell=bash
# Sourced by the GPU session scripts: parts run in order within a budget of
# seconds ($budget, from $start), each bounded, its output in $logs/NAME.log.
left() { echo $((budget - (SECONDS - start))); }
part() { # name, seconds at most, then the command; prints rc and time
  local name=$1 limit=$2 t0=$SECONDS
  shift 2
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -le 5 ]; then echo "gpu-session: $name: no time left"; return; fi
  timeout "$limit" "$@" >"$logs/$name.log" 2>&1
  echo "gpu-session: $name: rc $? in $((SECONDS - t0)) s (log: $logs/$name.log)"
}
# The wheel in dist/ into this Python (no deps: the machine has torch), then
# the GPU pytest over tests/python, or the files given, as part "pytest".
wheel_pytest() { # seconds at most, then pytest's file arguments (default: all)
  local limit=$1 wheel
  shift
  wheel=$(ls "$root"/dist/klgen-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    echo "gpu-session: pytest: no wheel in dist/ (bash .ci/wheel.sh dist)"
    return
  fi
  python3 -m pip install -q --no-deps --force-reinstall --root-user-action=ignore "$wheel" \
    >"$logs/pip.log" 2>&1
  local files=("$@")
  [ ${#files[@]} -eq 0 ] && files=("$root/tests/python")
  # from elsewhere than the tree: the installed klgen is what is imported
  part pytest "$limit" bash -c 'cd /tmp && python3 -m pytest -q -m gpu -rs "$@"' _ "${files[@]}"
  tail -3 "$logs/pytest.log" | sed 's/^/  /'
}
