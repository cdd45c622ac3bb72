#!/usr/bin/env bash
# `cmake --install`, then programs built against the installed tree only, the
# ways a user builds them: find_package(klrt CONFIG) in C and in C++, shared
# and static, and pkg-config. Checks that klrt.h and the .pc files need no CUDA
# or NCCL header, that the installed programs start with no LD_LIBRARY_PATH,
# that the specs are installed, and that both libraries export exactly the
# public API.
#   test_install.sh BUILD_DIR SOURCE_DIR
set -u
build=$1 src=$2
source "$(dirname "$0")/../lib/cli_lib.sh"
cc=${CC:-cc} cxx=${CXX:-c++}
if ! command -v "$cxx" >/dev/null; then
  echo "test_install: no C++ compiler ($cxx): install one (Debian: g++) or set CXX" >&2
  exit 1
fi
prefix=$tmp/prefix
cmake --install "$build" --prefix "$prefix" >/dev/null || { echo "FAIL: cmake --install" >&2; exit 1; }
spec=$prefix/share/klgen/specs/kimi_k3_tp8.lua
[ -f "$spec" ] && [ -f "$prefix/share/klgen/specs/README.md" ] && ok || no "specs not in share/klgen/specs"
unset LD_LIBRARY_PATH

# klrt.h opens no header but the C library's: no CUDA, no NCCL
opened=$($cc -std=c11 -E -H -I"$prefix/include" -x c - <<<'#include <klrt/klrt.h>' 2>&1 >/dev/null |
  sed -n 's/^\.* //p' | grep -v -e "^$prefix/include/klrt/klrt.h$" -e '^/usr/lib/gcc/' -e '^/usr/include/')
[ -z "$opened" ] && ok || no "klrt.h opens: $opened"
grep -E -i "^(Cflags|Libs).*(cuda|nccl)" "$prefix"/lib/pkgconfig/*.pc && no ".pc files name CUDA or NCCL" || ok

# find_package(klrt CONFIG), from the installed prefix alone, in C and C++;
# and a header made by the installed klgen, used from C++ as README shows
mkdir -p "$tmp/cm"
cp "$src/tests/runtime/install_consumer.c" "$tmp/cm/consumer.c"
cp "$src/tests/runtime/install_consumer.c" "$tmp/cm/consumer.cpp"
"$prefix/bin/klgen" -q kimi_k3_tp8 -o "$tmp/cm/gen"
cat >"$tmp/cm/generated.cpp" <<'CPP'
#include <klrt/klrt.h>
#include <cstdio>
#include "kimi_k3_tp8.h"
int main() {
  kl_generated gen = KL_KIMI_K3_TP8_GENERATED; // README's way, C and C++ alike
  std::printf("%s abi %d\n", gen.name, gen.abi);
  return 0;
}
CPP
cat >"$tmp/cm/CMakeLists.txt" <<'CM'
cmake_minimum_required(VERSION 3.25)
project(consumer C CXX)
find_package(klrt 0.1 CONFIG REQUIRED)
set(CMAKE_C_STANDARD 11)
set(CMAKE_CXX_STANDARD 11)
foreach(t c_shared c_static cxx_shared cxx_static)
  string(REGEX REPLACE "_.*" "" lang ${t})
  string(REPLACE "cxx" "cpp" ext ${lang})
  add_executable(${t} consumer.${ext})
  target_compile_options(${t} PRIVATE -Wall -Wextra -Werror -pedantic)
  if(t MATCHES "_shared$")
    target_link_libraries(${t} PRIVATE klrt::klrt)
  else()
    target_link_libraries(${t} PRIVATE klrt::klrt_static)
  endif()
endforeach()
add_executable(cxx_generated generated.cpp)
target_include_directories(cxx_generated PRIVATE gen)
target_compile_options(cxx_generated PRIVATE -Wall -Wextra -Werror -pedantic)
target_link_libraries(cxx_generated PRIVATE klrt::klrt)
CM
expect 0 cmake -S "$tmp/cm" -B "$tmp/cm/build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF
grep -q "^klrt_DIR:PATH=$prefix/lib/cmake/klrt$" "$tmp/cm/build/CMakeCache.txt" 2>/dev/null && ok ||
  no "klrt not found in the prefix: $(grep klrt_DIR "$tmp/cm/build/CMakeCache.txt" 2>/dev/null)"
expect 0 cmake --build "$tmp/cm/build"
expect 0 "$tmp/cm/build/cxx_generated"; has "$tmp/out" "^kimi_k3_tp8 abi 5$"
for t in c_shared c_static cxx_shared cxx_static; do
  expect 0 "$tmp/cm/build/$t" "$spec"; has "$tmp/out" "kimi_k3_tp8: shard 20480, 8 ranks"
  case $t in
    *_shared) ldd "$tmp/cm/build/$t" | grep -q "libklrt\.so\.0 => $prefix/lib/libklrt\.so\.0" && ok || no "$t: not linked to the installed libklrt.so.0" ;;
    *_static) ldd "$tmp/cm/build/$t" | grep -q libklrt && no "$t: linked to libklrt.so" || ok ;;
  esac
done

# examples/ as a project of its own, against the installed tree alone
expect 0 cmake -S "$src/examples" -B "$tmp/ex" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
expect 0 cmake --build "$tmp/ex"
expect 0 "$tmp/ex/examples/tp_decode" --help; has "$tmp/out" "usage: tp_decode"
expect 0 ctest --test-dir "$tmp/ex" -N; has "$tmp/out" "gpu_example_tp_decode"
grep -q "$prefix/share/klgen/specs/kimi_k3_tp2.lua" "$tmp/ex/CTestTestfile.cmake" && ok ||
  no "the examples' test does not run the installed spec"

# pkg-config: klrt-shared (its directory is not on the loader's path: an
# rpath, as README says), and klrt (static: no libklrt.so at run time)
export PKG_CONFIG_PATH=$prefix/lib/pkgconfig
expect 0 $cc -std=c11 -Wall -Wextra -Werror "$src/tests/runtime/install_consumer.c" \
  $(pkg-config --cflags --libs klrt-shared) -Wl,-rpath,"$(pkg-config --variable=libdir klrt-shared)" \
  -o "$tmp/shared"
expect 0 "$tmp/shared" "$spec"
ldd "$tmp/shared" | grep -q 'libklrt\.so\.0' && ok || no "klrt-shared did not link libklrt.so"
expect 0 $cc -std=c11 -Wall -Wextra -Werror "$src/tests/runtime/install_consumer.c" \
  $(pkg-config --cflags --static --libs klrt) -o "$tmp/static"
expect 0 "$tmp/static" "$spec"
ldd "$tmp/static" | grep -q libklrt && no "klrt linked libklrt.so" || ok
# NVRTC, NCCL and the driver are loaded at run time (the host's copies): never linked
ldd "$tmp/static" "$tmp/shared" "$prefix/lib/libklrt.so.0" | grep -E -q 'libnccl|libnvrtc|libcuda' &&
  no "linked to NCCL, NVRTC or the driver" || ok
[ ! -e "$prefix/lib/libklrt.so" ] && ok || no "a libklrt.so link name is installed"

# the installed programs start as they are, finding what they link (RUNPATH)
for p in "$prefix"/bin/*; do
  readelf -d "$p" | grep -q 'RUNPATH.*\$ORIGIN/\.\./lib' && ok || no "$p: no RUNPATH \$ORIGIN/../lib"
done
expect 0 "$prefix/bin/klgen" --version
# and find the installed specs by name
expect 0 "$prefix/bin/klgen" --list; has "$tmp/out" "^shipped specs in $prefix/bin/../share/klgen/specs "
expect 0 "$prefix/bin/klgen" -q kimi_k3_tp8 -o "$tmp/gen"
[ -s "$tmp/gen/kimi_k3_tp8.h" ] && ok || no "the installed klgen did not find kimi_k3_tp8"
expect 2 "$prefix/bin/klbench"; has "$tmp/err" "usage: klbench"
expect 2 "$prefix/bin/klfloor" --frobnicate; has "$tmp/err" "usage: klfloor"

# Both libraries define exactly the public API (klrt.map) as global symbols:
# no internal (kl_cu_get, kl_jit_cubin, ...) or Lua (lua_*) symbol leaks out.
want=$(grep -o 'kl_[a-z_]*' "$src/runtime/klrt.map" | sort -u)
for lib in "$prefix/lib/libklrt.a" "$prefix/lib/libklrt.so.0"; do
  got=$(nm -g --defined-only "$lib" 2>/dev/null | awk '$2 ~ /^[A-TV-Z]$/ {print $3}' | sed 's/@.*//' | grep -v '^$' | grep -v '^KLRT_' | sort -u)
  [ "$got" = "$want" ] && ok || no "$lib exports: $(comm -3 <(echo "$want") <(echo "$got") | tr '\n' ' ')"
done
finish test_install
