#!/usr/bin/env bash
# install_package BUILD_DIR SOURCE_DIR WORK_DIR
# `cmake --install BUILD_DIR --prefix WORK_DIR/prefix`, then, from the consumer's side: the
# layout (bin/moe, libmoe.a, libmoe.so with its SONAME, include/moe, moe.pc, the CMake package;
# no path into the build tree left in the installed binaries), every installed header compiles
# on its own, and examples/moe_layer.c built four ways and run, with the same output:
#   find_package(moe) + moe::moe (shared; ldd: libmoe.so.0 from the prefix),
#   find_package(moe) + moe::moe_static (no libmoe.so needed),
#   cc $(pkg-config --cflags --libs moe) (shared), and pkg-config --static with libmoe.a.
# Environment (tests/install/CMakeLists.txt): MOE_CC, MOE_CMAKE, MOE_GENERATOR,
# MOE_CONSUMER_FLAGS (the sanitizer flags of a MOE_SANITIZE build).
set -euo pipefail
build=$1 src=$2 work=$3
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
read -r -a flags <<< "${MOE_CONSUMER_FLAGS:-}"

new_workdir "$work"
prefix=$work/prefix
step "cmake --install $build --prefix $prefix"
"$cmake" --install "$build" --prefix "$prefix" > "$work/install.log" ||
  { cat "$work/install.log" >&2; fail "cmake --install"; }

# ---- layout ----
for f in bin/moe lib/libmoe.a lib/libmoe.so lib/pkgconfig/moe.pc lib/cmake/moe/moeConfig.cmake \
         lib/cmake/moe/moeConfigVersion.cmake lib/cmake/moe/moeTargets.cmake \
         include/moe/layers/moe.h include/moe/layers/backend.h include/moe/layers/status.h \
         include/moe/optim/optimizer.h include/moe/data/loader.h include/moe/config/config.h; do
  [ -e "$prefix/$f" ] || fail "$f is not installed"
done
[ ! -e "$prefix/include/moe/layers/cpu" ] || fail "the CPU backend's own headers are installed"
if [ -e "$src/scripts/hf_tokenizer.py" ]; then
  [ -e "$prefix/share/moe/hf_tokenizer.py" ] || fail "share/moe/hf_tokenizer.py is not installed"
fi
soname=$(readelf -d "$prefix/lib/libmoe.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[[ "$soname" =~ ^libmoe\.so\.[0-9]+$ ]] || fail "libmoe.so: SONAME '$soname'"
[ -e "$prefix/lib/$soname" ] || fail "lib/$soname is not installed"
build_abs=$(cd "$build" && pwd -P)
for f in bin/moe "lib/$soname"; do
  if readelf -d "$prefix/$f" | grep -E 'R(UN)?PATH' | grep -qF "$build_abs"; then
    fail "$f keeps an RPATH into the build tree"
  fi
done
usage=$("$prefix/bin/moe" 2>&1 || true) # no command: the usage, exit status 1
[[ "$usage" == *"usage: moe"* ]] || fail "bin/moe does not run: $usage"
step "layout ok (SONAME $soname)"

# ---- every installed header compiles on its own (C11, warnings as errors) ----
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
pkg-config --exists --print-errors moe || fail "pkg-config does not find moe"
read -r -a pc_cflags <<< "$(pkg-config --cflags moe)"
n=0
while IFS= read -r h; do
  printf '#include "%s"\n' "$h" |
    "$cc" -std=c11 -Wall -Wextra -Werror -fsyntax-only "${pc_cflags[@]}" -x c - ||
    fail "include/moe/$h does not compile on its own"
  n=$((n + 1))
done < <(cd "$prefix/include/moe" && find . -name '*.h' | sed 's|^\./||' | sort)
step "$n installed headers compile on their own"

# ---- the example through find_package(moe) ----
run() { # NAME PROGRAM: runs it, keeps its output in $work/NAME.out
  "$2" > "$work/$1.out" || fail "$1: $2 exited with $?"
  grep -q "|dgate|" "$work/$1.out" || fail "$1: unexpected output: $(cat "$work/$1.out")"
}
cmake_example() { # NAME [cmake args...]
  local name=$1
  shift
  "$cmake" -S "$src/examples" -B "$work/$name" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_C_COMPILER="$cc" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_FLAGS="${flags[*]}" \
    -DCMAKE_EXE_LINKER_FLAGS="${flags[*]}" "$@" > "$work/$name.configure.log" ||
    { cat "$work/$name.configure.log" >&2; fail "$name: configure"; }
  grep -q "^moe_DIR:PATH=$prefix/lib/cmake/moe$" "$work/$name/CMakeCache.txt" ||
    fail "$name: moe was not found in the prefix ($(grep '^moe_DIR' "$work/$name/CMakeCache.txt"))"
  "$cmake" --build "$work/$name" -j2 > "$work/$name.build.log" ||
    { cat "$work/$name.build.log" >&2; fail "$name: build"; }
  run "$name" "$work/$name/moe_layer"
}
cmake_example cmake_shared
lib=$(ldd "$work/cmake_shared/moe_layer" | awk '$1 ~ /^libmoe\.so/ {print $3}')
[ -n "$lib" ] || fail "cmake_shared: not linked with libmoe.so: $(ldd "$work/cmake_shared/moe_layer")"
[ "$(readlink -f "$lib")" = "$(readlink -f "$prefix/lib/$soname")" ] ||
  fail "cmake_shared: libmoe.so resolves to $lib, not the prefix's"
step "find_package(moe), moe::moe: ok, $soname from the prefix"
cmake_example cmake_static -DMOE_EXAMPLES_STATIC=ON
libs=$(ldd "$work/cmake_static/moe_layer") # (not `ldd | grep -q`: SIGPIPE under pipefail)
if grep -q libmoe <<< "$libs"; then fail "cmake_static needs libmoe.so"; fi
step "find_package(moe), moe::moe_static: ok"

# ---- the example through pkg-config ----
read -r -a pc_libs <<< "$(pkg-config --libs moe)"
"$cc" "${flags[@]}" "$src/examples/moe_layer.c" "${pc_cflags[@]}" "${pc_libs[@]}" \
  -o "$work/pc_shared" || fail "pkg-config (shared): build"
LD_LIBRARY_PATH="$prefix/lib" run pc_shared "$work/pc_shared"
step "cc \$(pkg-config --cflags --libs moe): ok"
read -r -a pc_static <<< "$(pkg-config --static --libs moe)"
for i in "${!pc_static[@]}"; do
  [ "${pc_static[$i]}" = -lmoe ] && pc_static[$i]=$prefix/lib/libmoe.a
done
"$cc" "${flags[@]}" "$src/examples/moe_layer.c" "${pc_cflags[@]}" "${pc_static[@]}" \
  -o "$work/pc_static" || fail "pkg-config --static: build"
run pc_static "$work/pc_static"
step "cc \$(pkg-config --cflags --static --libs moe) with libmoe.a: ok"

for name in cmake_static pc_shared pc_static; do
  cmp -s "$work/cmake_shared.out" "$work/$name.out" ||
    fail "$name prints $(cat "$work/$name.out"), cmake_shared $(cat "$work/cmake_shared.out")"
done
cat "$work/cmake_shared.out"
step "ok"
