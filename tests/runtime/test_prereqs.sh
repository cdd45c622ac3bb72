#!/usr/bin/env bash
# A missing prerequisite stops the configure step at once, with one line that
# says what to install or set (CMake's own "CMake Error at" frame around it).
#   test_prereqs.sh SOURCE_DIR
set -u
src=$1
source "$(dirname "$0")/../lib/cli_lib.sh"
# configure WANT DEFINE...: a configure that must fail, its message in $tmp/err
configure() {
  local want=$1; shift
  rm -rf "$tmp/b"
  expect 1 cmake -S "$src" -B "$tmp/b" -DBUILD_TESTING=OFF "$@"
  has "$tmp/err" "$want"
  # the message is one line: the line after CMake's frame, then a blank line or
  # the call stack
  local next
  next=$(sed -n '/CMake Error at/{n;n;p;q}' "$tmp/err")
  case "$next" in "" | "Call Stack"*) ok ;; *) no "a message of several lines: $(cat "$tmp/err")" ;; esac
}
configure "the CUDA toolkit (nvcc, cuda.h, nvrtc.h) was not found: install" \
  -DCMAKE_DISABLE_FIND_PACKAGE_CUDAToolkit=ON
configure "NCCL (nccl.h and libnccl.so.2) was not found: install NCCL's development files" \
  -DCMAKE_DISABLE_FIND_PACKAGE_NCCL=ON
configure "KLGEN_LUA_SRC=$tmp is not a Lua 5.4 source directory" "-DKLGEN_LUA_SRC=$tmp"
# The bundled Lua: one copy, the release README names, and the one the error
# above points to.
ver=$(sed -n 's/.*Lua \(5\.4\.[0-9]*\) comes with the source.*/\1/p' "$src/README.md")
dirs=$(cd "$src/third_party" && echo lua-*)
[ -n "$ver" ] && [ "$dirs" = "lua-$ver" ] && ok || no "README names Lua '$ver', third_party has $dirs"
grep -q "^#define LUA_VERSION_RELEASE[[:space:]]*\"${ver##*.}\"" "$src/third_party/lua-$ver/src/lua.h" \
  && ok || no "third_party/lua-$ver/src/lua.h is not release $ver"
has "$tmp/err" "leave KLGEN_LUA_SRC unset to build third_party/lua-$ver"
# a cache naming a bundled copy the tree no longer has builds the one it has
rm -rf "$tmp/b"
expect 0 cmake -S "$src" -B "$tmp/b" -DBUILD_TESTING=OFF "-DKLGEN_LUA_SRC=$src/third_party/lua-5.4.0/src"
grep -q "^KLGEN_LUA_SRC:PATH=$src/third_party/lua-$ver/src\$" "$tmp/b/CMakeCache.txt" && ok \
  || no "cached Lua source: $(grep KLGEN_LUA_SRC "$tmp/b/CMakeCache.txt")"
finish test_prereqs
