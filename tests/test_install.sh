#!/usr/bin/env bash
# `cmake --install`, then a program compiled and linked against the installed
# tree through pkg-config, with the shared and with the static library.
#   test_install.sh BUILD_DIR SOURCE_DIR
set -eu
build=$1 src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
export PKG_CONFIG_PATH=$tmp/prefix/lib/pkgconfig
cc=${CC:-cc}
$cc -std=c11 -Wall -Wextra -Werror "$src/tests/install_consumer.c" \
  $(pkg-config --cflags --libs klrt-shared) -Wl,-rpath,"$tmp/prefix/lib" -o "$tmp/shared"
"$tmp/shared" "$src/specs/kimi_k3_tp8.lua"
ldd "$tmp/shared" | grep -q 'libklrt\.so\.0' || { echo "FAIL: klrt-shared did not link libklrt.so" >&2; exit 1; }
# pkg-config --static --libs klrt: a static link, no libklrt.so at run time
$cc -std=c11 -Wall -Wextra -Werror "$src/tests/install_consumer.c" \
  $(pkg-config --cflags --static --libs klrt) -o "$tmp/static"
"$tmp/static" "$src/specs/kimi_k3_tp8.lua"
! ldd "$tmp/static" | grep -q libklrt || { echo "FAIL: klrt linked libklrt.so" >&2; exit 1; }
# NVRTC and NCCL are loaded at run time (the host's copies): never linked
! ldd "$tmp/static" "$tmp/shared" "$tmp/prefix/lib/libklrt.so.0" | grep -E -q 'libnccl|libnvrtc|libcuda' ||
  { echo "FAIL: linked to NCCL, NVRTC or the driver" >&2; exit 1; }
[ ! -e "$tmp/prefix/lib/libklrt.so" ] || { echo "FAIL: a libklrt.so link name is installed" >&2; exit 1; }
[ -x "$tmp/prefix/bin/klgen" ] && "$tmp/prefix/bin/klgen" --version
# Both libraries define exactly the public API (klrt.map) as global symbols:
# no internal (kl_cu_get, kl_jit_cubin, ...) or Lua (lua_*) symbol leaks out.
want=$(grep -o 'kl_[a-z_]*' "$src/runtime/klrt.map" | sort -u)
for lib in "$tmp/prefix/lib/libklrt.a" "$tmp/prefix/lib/libklrt.so.0"; do
  got=$(nm -g --defined-only "$lib" 2>/dev/null | awk '$2 ~ /^[A-TV-Z]$/ {print $3}' | sed 's/@.*//' | grep -v '^$' | grep -v '^KLRT_' | sort -u)
  if [ "$got" != "$want" ]; then
    echo "FAIL: $lib exports: $(comm -3 <(echo "$want") <(echo "$got") | tr '\n' ' ')" >&2
    exit 1
  fi
done
echo "7 passed, 0 failed"
