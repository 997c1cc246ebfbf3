#!/usr/bin/env bash
# The test command: installs what is missing (Debian packages), configures, builds
# (CPU always; CUDA when nvcc is present) and runs ctest (which replays the fuzz corpora);
# then, where clang's libFuzzer is there, fuzzes each target of tests/fuzz for a while.
#
#   scripts/test.sh                 # build/ (Release)
#   MOE_SANITIZE=ON scripts/test.sh # build-sanitize/ with ASan + UBSan
#   BUILD_DIR=... CMAKE_ARGS=... scripts/test.sh
#   MOE_FUZZ_SECONDS=30             # seconds per fuzz target (0: no fuzzing), in build-fuzz/
#   MOE_SKIP_INSTALL=1              # no package step (a second run: .ci/run)
#   MOE_SKIP_HF=1                   # no transformers install step
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
phase() { echo "test.sh: $1 took $((SECONDS - start)) s"; start=$SECONDS; }

# required to build and test
packages=(build-essential cmake pkg-config libconfig-dev libopenblas-openmp-dev libcjson-dev libdnnl2
          libopenmpi-dev openmpi-bin clang-format libmicrohttpd-dev)
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
need=() want=()
# (optional packages that cannot be installed would otherwise be retried on every run)
[ "${MOE_SKIP_INSTALL:-0}" = 1 ] || { need=($(missing "${packages[@]}")); want=($(missing "${optional[@]}")); }
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

# Hugging Face transformers for the checkpoint compatibility tests (optional: bounded in
# time, never fails the run; without it those tests report themselves skipped): 4.40 on
# Debian's torch 1.13, and the latest 5.x on PyTorch 2.x from PyPI
[ "${MOE_SKIP_HF:-0}" = 1 ] || { bash scripts/install_hf.sh || true; bash scripts/install_hf5.sh || true; }
# llama-cpp-python for the GGUF check against llama.cpp: a 10-20 minute build, so on request
[ "${MOE_INSTALL_LLAMA:-0}" = 1 ] && { bash scripts/install_llama.sh || true; }
phase "packages and transformers"

# Every C file formatted as .clang-format says (the message names each file and the fix).
bash scripts/check_format.sh

sanitize=${MOE_SANITIZE:-OFF}
build=${BUILD_DIR:-build}
[ "$sanitize" = "ON" ] && build=${BUILD_DIR:-build-sanitize}
cuda=OFF
command -v nvcc >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/nvcc ] && cuda=ON
# cuDNN attention's frontend headers where CUDA is built (optional, bounded, never fails)
[ "$cuda" = ON ] && { bash scripts/install_cudnn_frontend.sh || true; }
if [ "$sanitize" = "ON" ]; then
  # leak checks stay on; OpenBLAS/OpenMP thread pools are process-lifetime by design
  export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}
  export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
  # leaks inside libconfig 1.5, and only those, are not ours to fix (tests/lsan.supp)
  export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
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
phase "configure and build ($build)"
(cd "$build" && ctest --output-on-failure -j "$jobs")
phase "ctest ($build)"

# Fuzzing: only where clang can link libFuzzer. Builds build-fuzz/ (clang, MOE_FUZZ=ON: the
# project under ASan + UBSan) and runs one single-threaded fuzzer per usable CPU at a time; a
# crash fails the run.
fuzz_seconds=${MOE_FUZZ_SECONDS:-30}
have_libfuzzer() {
  command -v clang > /dev/null 2>&1 || return 1
  local tmp
  tmp=$(mktemp -d)
  printf '#include <stddef.h>\n#include <stdint.h>\nint LLVMFuzzerTestOneInput(const uint8_t *d, size_t n) { (void)d; (void)n; return 0; }\n' > "$tmp/t.c"
  clang -fsanitize=fuzzer "$tmp/t.c" -o "$tmp/t" > /dev/null 2>&1
  local rc=$?
  rm -rf "$tmp"
  return $rc
}
if [ "$fuzz_seconds" = 0 ]; then
  exit 0
elif ! have_libfuzzer; then
  echo "test.sh: no clang with libFuzzer here: the fuzz targets ran only on their corpora (ctest)"
  exit 0
fi
fuzz_build=${FUZZ_BUILD_DIR:-build-fuzz}
[ -f "$fuzz_build/CMakeCache.txt" ] ||
  CC=clang cmake -S . -B "$fuzz_build" -DMOE_FUZZ=ON -DMOE_CUDA=OFF -DMOE_MPI=OFF > /dev/null
cmake --build "$fuzz_build" -j "$cpus" --target fuzz_targets > "$fuzz_build/build.log" 2>&1 ||
  { tail -30 "$fuzz_build/build.log" >&2; exit 1; }
phase "build of the fuzz targets ($fuzz_build)"
failed=()
pids=() names=()
for t in safetensors token_file config hf_config trainer_state ckpt_folder stats serve_request; do
  FUZZ_BUILD_DIR=$fuzz_build bash scripts/fuzz.sh "$t" "$fuzz_seconds" &
  pids+=($!) names+=("$t")
  if [ ${#pids[@]} -ge "$cpus" ]; then
    wait "${pids[0]}" || failed+=("${names[0]}")
    pids=("${pids[@]:1}") names=("${names[@]:1}")
  fi
done
for i in "${!pids[@]}"; do wait "${pids[$i]}" || failed+=("${names[$i]}"); done
phase "fuzzing (${fuzz_seconds} s per target)"
if [ ${#failed[@]} -gt 0 ]; then
  echo "test.sh: fuzzing found crashes in: ${failed[*]} (tests/fuzz/README.md says what to do)" >&2
  exit 1
fi
