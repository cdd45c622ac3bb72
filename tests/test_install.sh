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
$cc -std=c11 -Wall -Wextra -Werror "$src/tests/install_consumer.c" $(pkg-config --cflags --libs klrt) \
  -Wl,-rpath,"$tmp/prefix/lib" -o "$tmp/shared"
"$tmp/shared" "$src/specs/kimi_k3_tp8.lua"
$cc -std=c11 -Wall -Wextra -Werror "$src/tests/install_consumer.c" $(pkg-config --cflags klrt) \
  "$tmp/prefix/lib/libklrt.a" $(pkg-config --static --libs-only-L klrt) -lnccl -lnvrtc -ldl \
  -lpthread -lm -o "$tmp/static"
"$tmp/static" "$src/specs/kimi_k3_tp8.lua"
[ -x "$tmp/prefix/bin/klgen" ] && "$tmp/prefix/bin/klgen" --version
echo "3 passed, 0 failed"
