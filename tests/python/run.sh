#!/usr/bin/env bash
# The Python package, as a user gets it: builds the wheel from this tree (pip
# wheel ., its binaries bound as the published wheel's are: KLGEN_MANYLINUX),
# installs it into a virtual environment, and runs the CPU tests there with
# pytest (GPU tests carry the `gpu` marker and skip without a GPU).
#   run.sh SOURCE_DIR [WORK_DIR]   (default: a temporary directory, removed after)
# In WORK_DIR the venv is kept and reused while what it installs is unchanged
# (the Python, the requirements below), and so is CMake's build directory: the
# wheel is rebuilt (incrementally) and reinstalled every time.
set -euo pipefail
src=$(cd "$1" && pwd)
if [ $# -ge 2 ]; then
  work=$2
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
reqs=("scikit-build-core>=0.10" pytest)
venv=$work/venv py=$work/venv/bin/python
key="$(python3 -c 'import sys; print(sys.executable, sys.version)') ${reqs[*]}"
if [ -x "$py" ] && [ "$(cat "$work/venv.key" 2>/dev/null)" = "$key" ] &&
   "$py" -c 'import pytest, scikit_build_core' 2>/dev/null; then
  echo "run.sh: reusing the venv $venv"
else
  echo "run.sh: making the venv $venv (${reqs[*]} from PyPI)"
  rm -rf "$venv" "$work/venv.key"
  python3 -m venv "$venv"
  "$py" -m pip install -q --disable-pip-version-check "${reqs[@]}"
  echo "$key" >"$work/venv.key"
fi
echo "run.sh: building the wheel (CMake's build directory: $work/cmake-build)"
rm -rf "$work/wheel"
# --no-build-isolation: the venv has the backend; the wheel is built from this tree.
"$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -C build-dir="$work/cmake-build" -C cmake.define.KLGEN_MANYLINUX=ON -w "$work/wheel" "$src"
wheel=$(ls "$work/wheel"/klgen-*.whl)
case "$wheel" in *-py3-none-*) ;; *) echo "FAIL: $wheel is tied to a Python version" >&2; exit 1 ;; esac
echo "run.sh: installing $(basename "$wheel"), then pytest"
"$py" -m pip install -q --disable-pip-version-check --no-deps --force-reinstall "$wheel"
cd "$work" # not the source tree: the installed package is what is imported
PATH="$work/venv/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider "$src/tests/python"
