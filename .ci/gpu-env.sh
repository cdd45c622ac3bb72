# Sourced on a GPU machine that got this tree with a build/ made elsewhere (it
# has no Lua and may lack a toolchain): maps the build's absolute paths and
# finds the CUDA libraries the binaries link.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$root/build/CMakeCache.txt")
if [ -n "$src" ] && [ "$src" != "$root" ] && [ ! -e "$src" ]; then
  mkdir -p "$(dirname "$src")" && ln -s "$root" "$src"
fi
for lib in libnccl.so.2 libnvrtc.so.13 libcublas.so.13 libcublasLt.so.13; do
  if ! ldconfig -p | grep -q "$lib"; then
    d=$(find / -xdev -name "$lib" -path '*nvidia*' 2>/dev/null | head -1)
    [ -z "$d" ] && d=$(find /usr/local -name "$lib" 2>/dev/null | head -1)
    [ -n "$d" ] && export LD_LIBRARY_PATH="$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  fi
done
export NCCL_NVLS_ENABLE=0
