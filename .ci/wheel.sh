#!/usr/bin/env bash
# The wheel to publish: klgen-VERSION-py3-none-manylinux_2_28_x86_64.whl, built
# from this tree with its binaries bound to glibc 2.28's symbol versions
# (KLGEN_MANYLINUX), tagged, checked by `auditwheel show` and by the symbol
# versions each binary imports, then installed from the file alone (no
# compiler, no build) into fresh virtual environments and used.
#   bash .ci/wheel.sh [OUT_DIR]     (default: dist/)
# Needs python3 with venv, and PyPI (scikit-build-core, wheel, auditwheel).
# The wheel carries no library to graft, so it is tagged with `wheel tags`;
# `auditwheel repair` would do the same but needs patchelf >= 0.14.5.
set -uo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$src/dist}
plat=manylinux_2_28_x86_64
mkdir -p "$out" && out=$(cd "$out" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0
ok() { pass=$((pass + 1)); }
no() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
die() { echo "wheel.sh: $*" >&2; echo "wheel: $pass passed, $((fail + 1)) failed"; exit 1; }

echo "wheel.sh: tools (scikit-build-core, wheel, auditwheel) in a venv"
python3 -m venv "$work/tools" && "$work/tools/bin/pip" install -q --disable-pip-version-check \
  "scikit-build-core>=0.10" wheel auditwheel || die "cannot install scikit-build-core, wheel, auditwheel"
echo "wheel.sh: building (pip wheel, KLGEN_MANYLINUX=ON)"
"$work/tools/bin/pip" wheel -q --disable-pip-version-check --no-deps --no-build-isolation \
  -C cmake.define.KLGEN_MANYLINUX=ON -w "$work/raw" "$src" || die "pip wheel failed"
raw=$(ls "$work"/raw/klgen-*.whl)
echo "wheel.sh: tagging it $plat, checking with auditwheel show"
"$work/tools/bin/python" -m wheel tags --remove --platform-tag "$plat" "$raw" >/dev/null ||
  die "wheel tags failed"
rm -f "$out"/klgen-*-"$plat".whl
mv "$work"/raw/klgen-*-py3-none-"$plat".whl "$out"/ || die "no py3-none-$plat wheel"
wheel=$(ls "$out"/klgen-*-py3-none-"$plat".whl)
"$work/tools/bin/auditwheel" show "$wheel" >"$work/show" 2>&1
# auditwheel names the oldest tag the binaries allow: it must be 2_28 or older
# (it is older: CUDA 13 and PyTorch need glibc 2.28 anyway, so 2_28 is the tag).
allowed=$(tr -s ' \n' ' ' <"$work/show" | sed -n 's/.*consistent with the following platform tag: "manylinux_2_\([0-9]*\)_x86_64".*/\1/p')
[ -n "$allowed" ] && [ "$allowed" -le 28 ] && ok || no "auditwheel show: $(cat "$work/show")"
echo "wheel.sh: auditwheel show: consistent with manylinux_2_${allowed}_x86_64"

# Every ELF file's imports, by symbol version: nothing past GLIBC_2.28, and
# nothing outside what manylinux allows (libc, libm, libdl, libpthread, ld.so).
mkdir -p "$work/unpacked" && (cd "$work/unpacked" && python3 -m zipfile -e "$wheel" .)
elves=$(find "$work/unpacked" -type f -exec sh -c 'head -c4 "$1" | grep -q ELF' _ {} \; -print)
[ "$(echo "$elves" | wc -l)" = 2 ] && ok || no "expected libklrt.so.0 and klgen, found: $elves"
for f in $elves; do
  newest=$(objdump -T "$f" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sort -uV | tail -1)
  printf '%s\n%s\n' "$newest" GLIBC_2.28 | sort -CV && ok || no "${f#"$work"/unpacked/} imports $newest"
  extra=$(readelf -d "$f" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
    grep -v -x -e libc.so.6 -e libm.so.6 -e libdl.so.2 -e libpthread.so.0 -e ld-linux-x86-64.so.2)
  [ -z "$extra" ] && ok || no "${f#"$work"/unpacked/} needs $extra"
done

# Installed from the file alone, on every Python >= 3.9 here, and used.
# (pyenv's interpreters too: their shims run only the selected one)
pythons=(python3)
for v in 3.9 3.12; do
  py=$(command -v "python$v")
  if ! "$py" -V >/dev/null 2>&1 && command -v pyenv >/dev/null; then
    py=$(ls -d "$(pyenv root)"/versions/"$v".*/bin/python"$v" 2>/dev/null | tail -1)
  fi
  [ -n "$py" ] && "$py" -V >/dev/null 2>&1 && pythons+=("$py")
done
for py in "${pythons[@]}"; do
  env=$work/env-$(basename "$(dirname "$(dirname "$py")")")-${py##*/}
  echo "wheel.sh: pip install the wheel with $($py -V 2>&1)"
  "$py" -m venv "$env" && "$env/bin/pip" install -q --disable-pip-version-check --no-index \
    --only-binary=:all: "$wheel" && ok || { no "$py: pip install $wheel"; continue; }
  (cd "$work" && "$env/bin/klgen" -q kimi_k3_tp8 -o "$env/gen") && [ -s "$env/gen/kimi_k3_tp8.h" ] &&
    ok || no "$py: the klgen command"
  got=$(cd "$work" && "$env/bin/python" -c 'import klgen; print(klgen.spec_info("kimi_k3_tp8").shard)' 2>&1)
  [ "$got" = 20480 ] && ok || no "$py: klgen.spec_info: $got"
  got=$(cd "$work" && "$env/bin/python" -c 'import klgen; klgen.LogitsGather' 2>&1 | tail -1)
  [ "$got" = "ImportError: klgen.LogitsGather needs PyTorch: pip install 'klgen[torch]'" ] && ok ||
    no "$py: without torch: $got"
done
echo "wheel.sh: $wheel"
echo "wheel: $pass passed, $fail failed"
[ "$fail" = 0 ]
