#!/usr/bin/env bash
# The machine code of every kernel klgen generates, dumped so that a change to
# the templates or the generator that should not change the kernels can be
# shown not to: dump before, dump after, compare.
#
#   bash .ci/sass-diff.sh dump OUT [KLGEN]   render + compile + disassemble into OUT
#   bash .ci/sass-diff.sh cmp A B            compare two dumps (exit 1 on a difference)
#
# Specs: the shipped ones (specs/*.lua), the test specs with top-k and
# epilogues (tests/select/select_specs.lua, tests/spec/epilogue_specs.lua)
# and klbench's (bench/*.lua). KLGEN defaults to build/klgen; pass an older build's binary
# to dump the baseline (e.g. a `git worktree` of the base commit, built).
# SASS_TEMPLATES=DIR renders with `klgen --templates DIR`.
#
# Compilers (SASS_COMPILER, default "nvcc nvrtc": both): nvcc -cubin -O3 with
# the options the runtime's NVRTC JIT passes (gen/compile.c: -std=c++17
# -lineinfo), and `klgen --cubin`, the JIT's own compiler (libnvrtc): the
# two do not make the same code, and each must stay the same. SASS_ARCH
# (default sm_90), SASS_CUDA (default /usr/local/cuda).
# Disassembler: cuobjdump, from $SASS_CUOBJDUMP, PATH or the toolkit; the
# toolkit packages without it can take the pip wheels' (it runs nvdisasm):
#   pip download --no-deps nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
#   for w in nvidia_cuda_*.whl; do unzip -o -d /tmp/cuobj "$w"; done
#   SASS_CUOBJDUMP=/tmp/cuobj/nvidia/cu13/bin/cuobjdump bash .ci/sass-diff.sh ...
#
# Normalized: each kernel and out-of-line function is written to its own file
# (so the order of functions in the cubin does not matter), with the
# resource usage (registers, shared, local and constant memory) beside it.
# The line table -lineinfo adds is not part of the SASS text and is not
# compared: moving code between template files changes only that.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
arch=${SASS_ARCH:-sm_90}
cuda=${SASS_CUDA:-/usr/local/cuda}

find_cuobjdump() {
  if [ -n "${SASS_CUOBJDUMP:-}" ]; then echo "$SASS_CUOBJDUMP"; return; fi
  if command -v cuobjdump >/dev/null; then command -v cuobjdump; return; fi
  if [ -x "$cuda/bin/cuobjdump" ]; then echo "$cuda/bin/cuobjdump"; return; fi
  if [ -x /tmp/cuobj/nvidia/cu13/bin/cuobjdump ]; then echo /tmp/cuobj/nvidia/cu13/bin/cuobjdump; return; fi
  echo "sass-diff: no cuobjdump (set SASS_CUOBJDUMP; see the top of $0)" >&2
  exit 2
}

spec_files() {
  ls "$root"/specs/*.lua "$root"/tests/select/select_specs.lua "$root"/tests/spec/epilogue_specs.lua \
    "$root"/bench/*.lua
}

# One cubin's functions, one file each: SASS (addresses kept: they are the
# code's own offsets) and the resource usage line of the same function.
split_sass() {
  local cubin=$1 dir=$2 cuobjdump=$3
  mkdir -p "$dir"
  "$cuobjdump" -sass "$cubin" | awk -v dir="$dir" '
    /^[ \t]*Function : / { f = dir "/" $3 ".sass"; next }
    f != "" && /^[ \t]*\.{5,}/ { close(f); f = ""; next }
    f != "" { print > f }'
  "$cuobjdump" -res-usage "$cubin" | awk -v dir="$dir" '
    /^ Function / { name = $2; sub(":$", "", name); next }
    name != "" && /REG:/ { print > (dir "/" name ".res"); close(dir "/" name ".res"); name = "" }'
}

# One compiler's cubins of every spec, in $out/src/<compiler>/<spec file>/, and
# their functions in $out/sass/<compiler>/<spec file>/<spec>/.
dump_with() {
  local out=$1 klgen=$2 compiler=$3 cuobjdump=$4
  local tmpl=()
  [ -n "${SASS_TEMPLATES:-}" ] && tmpl=(--templates "$SASS_TEMPLATES")
  local cubin=()
  [ "$compiler" = nvrtc ] && cubin=(--cubin --arch "$arch")
  # a directory per spec file: two files may define specs of one name
  local f tag cu name src=$out/src/$compiler
  for f in $(spec_files); do
    tag=$(basename "$(dirname "$f")").$(basename "$f" .lua)
    mkdir -p "$src/$tag"
    "$klgen" -q "${tmpl[@]}" "${cubin[@]}" -o "$src/$tag" -- "$f"
  done
  local pids=()
  if [ "$compiler" = nvcc ]; then
    for cu in "$src"/*/*.cu; do
      "$cuda/bin/nvcc" -cubin -arch="$arch" -O3 -std=c++17 -lineinfo \
        -o "${cu%.cu}.$arch.cubin" "$cu" &
      pids+=($!)
      # a few at a time: the select kernels take a while, and CI machines are small
      if [ ${#pids[@]} -ge "${SASS_JOBS:-2}" ]; then wait "${pids[0]}"; pids=("${pids[@]:1}"); fi
    done
  fi
  local p
  for p in "${pids[@]}"; do wait "$p"; done
  for cu in "$src"/*/*.cu; do
    tag=$(basename "$(dirname "$cu")")
    name=$(basename "$cu" .cu)
    split_sass "${cu%.cu}.$arch.cubin" "$out/sass/$compiler/$tag/$name" "$cuobjdump"
  done
}

dump() {
  local out=$1 klgen=${2:-$root/build/klgen}
  local cuobjdump compiler
  cuobjdump=$(find_cuobjdump)
  # cuobjdump -sass runs nvdisasm, which the wheels ship beside it
  PATH="$(dirname "$cuobjdump"):$PATH"
  [ -x "$klgen" ] || { echo "sass-diff: no klgen at $klgen (build first)" >&2; exit 2; }
  rm -rf "$out"
  for compiler in ${SASS_COMPILER:-nvcc nvrtc}; do
    case $compiler in nvcc | nvrtc) ;; *) echo "sass-diff: unknown compiler $compiler" >&2; exit 2 ;; esac
    dump_with "$out" "$klgen" "$compiler" "$cuobjdump"
    echo "sass-diff: $compiler: $(ls -d "$out"/sass/$compiler/*/*/ | wc -l) specs," \
      "$(ls "$out"/sass/$compiler/*/*/*.sass | wc -l) functions in $out/sass/$compiler"
  done
}

cmp_dumps() {
  local a=$1 b=$2
  if diff -r "$a/sass" "$b/sass" >"${TMPDIR:-/tmp}/sass-diff.$$" 2>&1; then
    rm -f "${TMPDIR:-/tmp}/sass-diff.$$"
    echo "sass-diff: identical: $(ls "$a"/sass/*/*/*/*.sass | wc -l) functions ($(ls -d "$a"/sass/*/*/*/ | wc -l) spec x compiler pairs: $(ls "$a/sass" | tr '\n' ' ')$arch)"
    return 0
  fi
  head -100 "${TMPDIR:-/tmp}/sass-diff.$$"
  echo "sass-diff: DIFFERENT (full diff: ${TMPDIR:-/tmp}/sass-diff.$$)"
  return 1
}

case "${1:-}" in
  dump) [ $# -ge 2 ] || { echo "usage: $0 dump OUT [KLGEN]" >&2; exit 2; }; dump "$2" "${3:-}" ;;
  cmp) [ $# -eq 3 ] || { echo "usage: $0 cmp A B" >&2; exit 2; }; cmp_dumps "$2" "$3" ;;
  *) sed -n '2,12p' "$0" >&2; exit 2 ;;
esac
