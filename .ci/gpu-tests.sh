#!/usr/bin/env bash
# Runs the GPU test suite on a machine with GPUs, from a build/ made elsewhere:
#   bash .ci/gpu-tests.sh [ctest args]
set -uo pipefail
source "$(dirname "$0")/gpu-env.sh"
nvidia-smi -L || true
cd "$root/build" && ctest -L gpu --output-on-failure "$@"
