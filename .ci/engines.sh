#!/usr/bin/env bash
# The real-engine tests: klgen's drop-ins inside vLLM and SGLang,
# each engine pinned and installed from PyPI into a venv of its own (CPU: no
# GPU here), with klgen's wheel, and tests/python/test_<engine>.py run there
# (and, in vLLM's, test_reference.py and test_reference_verify.py: torch and
# vLLM's own filters; then test_reference_vllm.py: vLLM's sampler and
# rejection sampler kernels under Triton's interpreter).
# The venvs live under $KLGEN_CI_CACHE (default ~/.cache/klgen-ci), are made
# once and reused by later runs on the same machine (remade when their pin
# changes); only the wheel is new each run.
#   engines.sh [WHEEL]   (default: a wheel built from this tree)
set -euo pipefail
cd "$(dirname "$0")/.."
src=$(pwd)
cache=${KLGEN_CI_CACHE:-$HOME/.cache/klgen-ci}
# The versions the drop-ins are tested against (README, "Use with vLLM and
# SGLang", names them too).
pins=(vllm==0.33.0 sglang==0.5.23)

# venv DIR REQUIREMENT...: DIR holding exactly these, made again only when
# they change (the stamp, written last, names them: a half-made venv is redone)
venv() {
  local dir=$1
  shift
  if [ "$(cat "$dir/klgen-ci.stamp" 2>/dev/null)" = "$*" ]; then
    echo "engines: $dir reused"
    return
  fi
  local start=$SECONDS
  rm -rf "$dir"
  python3 -m venv "$dir"
  "$dir/bin/pip" install -q --disable-pip-version-check "$@"
  echo "$*" > "$dir/klgen-ci.stamp"
  echo "engines: $dir made in $((SECONDS - start)) s"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
if [ $# -ge 1 ]; then
  wheel=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
else
  venv "$cache/wheel-build" "scikit-build-core>=0.10"
  # --no-build-isolation: that venv has the backend; the wheel is this tree's
  "$cache/wheel-build/bin/pip" wheel -q --disable-pip-version-check --no-deps \
    --no-build-isolation -w "$work" "$src"
  wheel=$(ls "$work"/klgen-*.whl)
fi

for pin in "${pins[@]}"; do
  engine=${pin%%==*}
  dir=$cache/$engine-${pin#*==}
  venv "$dir" "$pin" pytest
  "$dir/bin/pip" install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
  # the pin is what is imported, or the tests would skip and prove nothing
  "$dir/bin/python" -c "import sys, $engine; sys.exit($engine.__version__ != '${pin#*==}')" ||
    { echo "FAIL: $engine in $dir is not $pin" >&2; exit 1; }
  tests=("$src/tests/python/test_$engine.py")
  # the sampler's reference needs torch, which test_python's venv has not:
  # it runs here, beside vLLM's own top-k/top-p
  if [ "$engine" = vllm ]; then
    tests+=("$src/tests/python/test_reference.py" "$src/tests/python/test_reference_verify.py"
      "$src/tests/python/test_sampling_args.py")
  fi
  echo "engines: $pin, ${tests[*]#"$src/"}"
  # from elsewhere than the tree: the installed klgen is what is imported
  (cd "$work" && "$dir/bin/python" -m pytest -q -p no:cacheprovider -rs "${tests[@]}")
  if [ "$engine" = vllm ]; then
    # the reference against vLLM's own Triton kernels, run by Triton's
    # interpreter: on before vLLM is imported, with no visible GPU for vLLM
    # to take Triton on the CPU, so in a process of its own
    echo "engines: $pin, tests/python/test_reference_vllm.py (TRITON_INTERPRET=1)"
    (cd "$work" && TRITON_INTERPRET=1 CUDA_VISIBLE_DEVICES="" "$dir/bin/python" -m pytest -q \
      -p no:cacheprovider -rs "$src/tests/python/test_reference_vllm.py")
  fi
done
