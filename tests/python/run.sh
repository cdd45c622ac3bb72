#!/usr/bin/env bash
# The Python package, as a user gets it: builds the wheel (pip wheel .), installs
# it into a fresh virtual environment, and runs the CPU tests there with pytest
# (GPU tests carry the `gpu` marker and skip without a GPU).
#   run.sh SOURCE_DIR [WORK_DIR]   (default: a temporary directory, removed after)
set -euo pipefail
src=$(cd "$1" && pwd)
if [ $# -ge 2 ]; then
  work=$2
  rm -rf "$work/venv" "$work/wheel"
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
python3 -m venv "$work/venv"
py="$work/venv/bin/python"
"$py" -m pip install -q --disable-pip-version-check "scikit-build-core>=0.10" pytest
# --no-build-isolation: the venv has the backend; the wheel is built from this tree.
"$py" -m pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -w "$work/wheel" "$src"
wheel=$(ls "$work/wheel"/klgen-*.whl)
case "$wheel" in *-py3-none-*) ;; *) echo "FAIL: $wheel is tied to a Python version" >&2; exit 1 ;; esac
"$py" -m pip install -q --disable-pip-version-check --no-deps "$wheel"
cd "$work" # not the source tree: the installed package is what is imported
PATH="$work/venv/bin:$PATH" "$py" -m pytest -q -p no:cacheprovider "$src/tests/python"
