#!/usr/bin/env bash
# The test command: installs what is missing (Debian packages), configures, builds
# (CPU always; CUDA when nvcc is present) and runs ctest.
#
#   scripts/test.sh                 # build/ (Release)
#   MOE_SANITIZE=ON scripts/test.sh # build-sanitize/ with ASan + UBSan
#   BUILD_DIR=... CMAKE_ARGS=... scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

# required to build and test
packages=(build-essential cmake pkg-config libconfig-dev libopenblas-openmp-dev libcjson-dev
          libopenmpi-dev openmpi-bin)
# optional: the plot test (matplotlib) and the Hugging Face check (torch for transformers);
# without them those tests report themselves skipped
optional=(python3-matplotlib python3-torch python3-numpy python3-venv)
missing() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO="sudo"
need=($(missing "${packages[@]}")) want=($(missing "${optional[@]}"))
if [ ${#need[@]} -gt 0 ] || [ ${#want[@]} -gt 0 ]; then
  $SUDO apt-get update -q || true
fi
if [ ${#need[@]} -gt 0 ]; then
  echo "test.sh: installing ${need[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${need[@]}"
fi
if [ ${#want[@]} -gt 0 ]; then
  echo "test.sh: installing optional ${want[*]}"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends "${want[@]}" ||
    echo "test.sh: optional packages not installed: the tests that need them will be skipped"
fi

# Hugging Face transformers for the checkpoint compatibility test (optional: bounded in
# time, never fails the run; without it that test reports itself skipped)
[ "${MOE_SKIP_HF:-0}" = 1 ] || bash scripts/install_hf.sh || true

sanitize=${MOE_SANITIZE:-OFF}
build=${BUILD_DIR:-build}
[ "$sanitize" = "ON" ] && build=${BUILD_DIR:-build-sanitize}
cuda=OFF
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && cuda=ON
if [ "$sanitize" = "ON" ]; then
  # leak checks stay on; OpenBLAS/OpenMP thread pools are process-lifetime by design
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
fi

cmake -S . -B "$build" -DMOE_CUDA=$cuda -DMOE_SANITIZE=$sanitize ${CMAKE_ARGS:-}
# CPUs this job may use: the visible cores, capped by a cgroup v2 CPU quota (a container can
# see 64 cores and be allowed 2). Tests use 2 threads each, so run cpus/2 of them at a time.
cpus=$(nproc)
if [ -r /sys/fs/cgroup/cpu.max ]; then
  read -r quota period < /sys/fs/cgroup/cpu.max || true
  if [ "${quota:-max}" != max ] && [ "${period:-0}" -gt 0 ]; then
    q=$(( (quota + period - 1) / period ))
    [ "$q" -lt "$cpus" ] && cpus=$q
  fi
fi
jobs=$(( cpus / 2 )); [ "$jobs" -lt 1 ] && jobs=1
echo "moe test.sh: $(nproc) cores visible, $cpus usable, ctest -j $jobs"
cmake --build "$build" -j "$cpus"
cd "$build"
ctest --output-on-failure -j "$jobs"
