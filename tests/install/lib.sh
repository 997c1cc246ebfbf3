# shellcheck shell=bash disable=SC2034 # (variables set here for the sourcing script)
# tests/install/lib.sh: what install_package.sh and install_subdirectory.sh share, sourced by
# both (after `set -euo pipefail`):
#   cc, cmake, gen       the compiler, cmake and CMake generator: MOE_CC, MOE_CMAKE,
#                        MOE_GENERATOR (tests/install/CMakeLists.txt) or cc, cmake, Unix Makefiles
#   fail MESSAGE         "SCRIPT: FAIL: MESSAGE" on stderr, exit 1 (SCRIPT: the test's name)
#   step MESSAGE         "SCRIPT: MESSAGE"
#   new_workdir DIR [SUBDIR]
#                        DIR emptied (and DIR/SUBDIR made); work set to its physical path
cc=${MOE_CC:-cc} cmake=${MOE_CMAKE:-cmake} gen=${MOE_GENERATOR:-Unix Makefiles}
script=$(basename "$0" .sh)

fail() { echo "$script: FAIL: $*" >&2; exit 1; }

step() { echo "$script: $*"; }

new_workdir() {
  rm -rf "$1"
  mkdir -p "$1/${2:-}"
  work=$(cd "$1" && pwd -P)
}
