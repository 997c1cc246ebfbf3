#!/usr/bin/env bash
# install_subdirectory SOURCE_DIR WORK_DIR
# A tiny parent project (written here into WORK_DIR/parent) that add_subdirectory()s the moe
# source tree and its examples/, and builds examples/moe_layer.c once more as its own target
# against moe::moe_static. Checks: the example and the parent's program build (only they and
# the library, -j2) and run with the same output; moe's tests are not configured in a parent;
# moe's warnings and -march=native reach moe's objects but not the parent's.
# Environment (tests/install/CMakeLists.txt): MOE_CC, MOE_CMAKE, MOE_GENERATOR,
# MOE_CONSUMER_FLAGS, MOE_SUBPROJECT_ARGS (the options of the build under test).
set -euo pipefail
src=$1 work=$2
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
read -r -a sub_args <<< "${MOE_SUBPROJECT_ARGS:-}"

new_workdir "$work" parent
src=$(cd "$src" && pwd -P)
cat > "$work/parent/CMakeLists.txt" << EOF
cmake_minimum_required(VERSION 3.21)
project(moe_parent LANGUAGES C)
add_subdirectory("$src" moe)
add_subdirectory("$src/examples" moe_examples)
add_executable(parent_app "$src/examples/moe_layer.c")
target_link_libraries(parent_app PRIVATE moe::moe_static)
foreach(t test_moe_fixtures test_config test_stats moe_layers_f64 bench_moe_layer)
  if(TARGET \${t})
    message(FATAL_ERROR "moe's \${t} is configured in a parent project")
  endif()
endforeach()
EOF
step "configure $work/parent (${sub_args[*]})"
"$cmake" -S "$work/parent" -B "$work/build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="${MOE_CONSUMER_FLAGS:-}" \
  -DCMAKE_EXE_LINKER_FLAGS="${MOE_CONSUMER_FLAGS:-}" -DCMAKE_EXPORT_COMPILE_COMMANDS=ON \
  "${sub_args[@]}" > "$work/configure.log" 2>&1 ||
  { cat "$work/configure.log" >&2; fail "configure"; }
if grep -q "CMake Warning" "$work/configure.log"; then
  cat "$work/configure.log"
fi
[ ! -e "$work/build/moe/CTestTestfile.cmake" ] || fail "moe enabled testing in a parent project"
step "build example_moe_layer parent_app"
"$cmake" --build "$work/build" -j2 --target example_moe_layer parent_app > "$work/build.log" 2>&1 ||
  { tail -40 "$work/build.log" >&2; fail "build"; }
"$work/build/moe_examples/moe_layer" > "$work/example.out" || fail "the example exited with $?"
"$work/build/parent_app" > "$work/parent_app.out" || fail "parent_app exited with $?"
grep -q "|dgate|" "$work/example.out" || fail "unexpected output: $(cat "$work/example.out")"
cmp -s "$work/example.out" "$work/parent_app.out" ||
  fail "outputs differ: $(cat "$work/example.out") / $(cat "$work/parent_app.out")"
# (ldd's output captured first: `ldd | grep -q` under pipefail fails when grep's early exit
# cuts ldd off with SIGPIPE, which a library list as long as MPI's makes likely)
libs=$(ldd "$work/build/moe_examples/moe_layer")
grep -q "libmoe\.so" <<< "$libs" || fail "the example (moe::moe) is not linked with libmoe.so"

# Flags: the compile commands of the parent's targets and of one of moe's objects.
db=$work/build/compile_commands.json
if [ -e "$db" ]; then
  grep '"command"' "$db" | grep 'examples/moe_layer\.c' > "$work/parent.commands" ||
    fail "no compile command for examples/moe_layer.c"
  [ "$(wc -l < "$work/parent.commands")" = 2 ] || fail "expected 2 compiles of moe_layer.c"
  if grep -E -- '-Werror|-Wextra|-march=native' "$work/parent.commands"; then
    fail "moe's flags leak into the parent project's targets"
  fi
  grep '"command"' "$db" | grep 'layers/moe\.c' > "$work/moe.commands" ||
    fail "no compile command for layers/moe.c"
  grep -q -- '-Wextra' "$work/moe.commands" || fail "moe's objects lost -Wall -Wextra"
  if [[ " ${sub_args[*]} " != *" -DMOE_NATIVE=OFF "* ]]; then
    grep -q -- '-march=native' "$work/moe.commands" || fail "moe's objects lost -march=native"
  fi
  step "flags: moe's warnings and -march=native on moe's objects only"
fi
cat "$work/example.out"
step "ok"
