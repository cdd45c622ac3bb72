#!/usr/bin/env bash
# Installs what klgen needs on a fresh Debian 12 machine that has the CUDA toolkit,
# and fetches Lua 5.4's source so that it can be built position-independent:
# Debian's liblua5.4.a is not -fPIC, and libklrt.so links Lua statically
# (docs/DESIGN.md §4: the GPU machine has no Lua). Idempotent; safe to run again.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
deps="$root/.deps"
lua_dir="$deps/lua-5.4.4"

need=()
for p in cmake make gcc patch pkg-config ca-certificates; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
apt_updated=0
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq && apt_updated=1
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

if [ ! -f "$lua_dir/src/lapi.c" ]; then
  # apt-get source from Debian's own archive, through a private source list so the
  # machine's apt configuration is left alone.
  work=$(mktemp -d)
  chmod 0755 "$work"   # apt drops privileges to _apt while downloading
  trap 'rm -rf "$work"' EXIT
  mkdir -p "$work/lists/partial"
  cat >"$work/src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$work"
        -o "Dir::State::Lists=$work/lists")
  apt-get "${opts[@]}" update -qq
  (cd "$work" && apt-get "${opts[@]}" source --download-only -qq lua5.4 2>/dev/null)
  mkdir -p "$deps"
  tar -xzf "$work"/lua5.4_5.4.4.orig.tar.gz -C "$deps"
  tar -xJf "$work"/lua5.4_5.4.4-*.debian.tar.xz -C "$work"
  # Debian's security fixes; its build-system patches are not wanted here.
  for p in "$work"/debian/patches/*cve*.patch; do
    patch -s -d "$lua_dir" -p1 <"$p"
  done
fi
test -f "$lua_dir/src/lapi.c"
echo "deps: ok (lua source in ${lua_dir#$root/})"
