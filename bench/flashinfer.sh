#!/usr/bin/env bash
# libkl_flashinfer: FlashInfer 0.7.2.post1's sampling and top-k kernels for
# klbench --grid and python -m klgen.bench --grid (bench/flashinfer_sampling.cu).
# Downloads the wheel (pip download, checked against its SHA-256), extracts
# into bench/flashinfer/ (git-ignored) the headers flashinfer/sampling.cuh and
# flashinfer/topk.cuh include, and the CCCL the wheel vendors (its JIT puts it
# before the toolkit's: DeviceBatchedTopK is newer than CUDA 13.0's), then
# configures BUILD_DIR with -DKLGEN_FLASHINFER_INCLUDE and builds the library
# beside klbench. Needs network access, python3 with pip, nvcc and CMake.
#   bash bench/flashinfer.sh [BUILD_DIR]     (default: build)
# The library is BUILD_DIR/libkl_flashinfer.so; nothing else of the wheel runs.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build}
dir=$root/bench/flashinfer
version=0.7.2.post1
wheel=flashinfer_python-$version-py3-none-any.whl
sha256=bfdc18b9e1e4d8d0730fe4343dc0e284cd0c160086de80f99888bc4867922d49

mkdir -p "$dir"
if [ ! -f "$dir/$wheel" ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$dir" "flashinfer-python==$version"
fi
echo "$sha256  $dir/$wheel" | sha256sum -c --quiet - ||
  { echo "flashinfer.sh: $dir/$wheel is not the wheel this script was written for" >&2; exit 1; }

rm -rf "$dir/data"
python3 - "$dir/$wheel" "$dir" <<'EOF'
import posixpath, re, sys, zipfile

wheel, out = sys.argv[1], sys.argv[2]
z = zipfile.ZipFile(wheel)
names = set(z.namelist())
root = "flashinfer/data/include/"
# the closure of the two headers' quoted includes (angle brackets: CUDA, CCCL, std)
todo, keep = [root + "flashinfer/sampling.cuh", root + "flashinfer/topk.cuh"], set()
while todo:
    name = todo.pop()
    if name in keep:
        continue
    keep.add(name)
    for inc in re.findall(r'^\s*#\s*include\s*"([^"]+)"', z.read(name).decode(), re.M):
        for cand in (posixpath.normpath(posixpath.join(posixpath.dirname(name), inc)),
                     posixpath.normpath(root + inc)):
            if cand in names:
                todo.append(cand)
                break
        else:
            sys.exit(f"flashinfer.sh: {name} includes {inc}, not in the wheel")
cccl = ("flashinfer/data/cccl/cub/cub/", "flashinfer/data/cccl/libcudacxx/include/",
        "flashinfer/data/cccl/thrust/thrust/")
keep |= {n for n in names if n.startswith(cccl) and not n.endswith("/")}
keep |= {n for n in names if n.startswith("flashinfer_python-") and "/licenses/" in n}
for n in sorted(keep):
    z.extract(n, out)
heads = sum(n.startswith(root) for n in keep)
print(f"flashinfer.sh: {heads} FlashInfer headers, {len(keep) - heads} CCCL and license files "
      f"in {out}")
EOF
mv "$dir/flashinfer/data" "$dir/data" && rm -rf "$dir/flashinfer"

cmake -S "$root" -B "$build" -DKLGEN_FLASHINFER_INCLUDE="$dir/data/include" >/dev/null
cmake --build "$build" --target kl_flashinfer klbench -j"$(nproc)"
echo "flashinfer.sh: $build/libkl_flashinfer.so"
