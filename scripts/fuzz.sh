#!/usr/bin/env bash
# A libFuzzer session on one target of tests/fuzz (tests/fuzz/README.md):
#
#   scripts/fuzz.sh TARGET SECONDS [libFuzzer flags...]
#   targets: safetensors token_file config hf_config trainer_state ckpt_folder stats serve_request
#
# Configures build-fuzz/ with clang (MOE_FUZZ=ON) on first use and builds the target, then
# fuzzes for SECONDS: the committed corpus tests/fuzz/corpus/TARGET is read, new inputs go
# to build-fuzz/corpus/TARGET, crashes to build-fuzz/crashes/TARGET/, the log to
# build-fuzz/logs/TARGET.log. Ends with the executions and coverage; exits 1 on a crash.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=" safetensors token_file config hf_config trainer_state ckpt_folder stats serve_request "
if [ $# -lt 2 ] || [[ "$targets" != *" $1 "* ]] || ! [[ "$2" =~ ^[1-9][0-9]*$ ]]; then
  sed -n '2,10p' "$0" >&2
  exit 2
fi
target=$1 seconds=$2
shift 2
build=${FUZZ_BUILD_DIR:-build-fuzz}

# Two sessions may start together (at most 2 at a time is the rule); one builds at a time.
mkdir -p "$build"
(
  flock 9
  if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=clang cmake -S . -B "$build" -DMOE_FUZZ=ON -DMOE_CUDA=OFF -DMOE_MPI=OFF > "$build/configure.log"
  fi
  cmake --build "$build" -j "${FUZZ_BUILD_JOBS:-2}" --target "fuzz_$target" > "$build/build.log" ||
    { tail -30 "$build/build.log" >&2; exit 1; }
) 9> "$build/.build.lock"

# Scratch folders of fuzzers that crashed (fuzz_common.c names them after their pid).
for d in /dev/shm/moe-fuzz-* /tmp/moe-fuzz-*-*; do
  [ -d "$d" ] || continue
  pid=${d#*/moe-fuzz-}
  pid=${pid%%-*}
  [[ "$pid" =~ ^[0-9]+$ ]] && ! kill -0 "$pid" 2> /dev/null && rm -rf "$d"
done

corpus=$build/corpus/$target crashes=$build/crashes/$target log=$build/logs/$target.log
mkdir -p "$corpus" "$crashes" "$(dirname "$log")"
# One thread: the fuzzer runs one input at a time, and the kernels' threads would only wait.
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# libconfig 1.5's own leaks (tests/lsan.supp); everything else is a finding.
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/tests/lsan.supp:print_suppressions=0}
rc=0
"$build/tests/fuzz/fuzz_$target" -max_total_time="$seconds" -timeout=30 \
  -artifact_prefix="$crashes/" -print_final_stats=1 "$@" "$corpus" "tests/fuzz/corpus/$target" \
  > "$log" 2>&1 || rc=$?

final=$(grep -E '^#[0-9]+' "$log" | tail -1 || true)
execs=$(grep -oE '^stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || true)
cov=$(grep -oE 'cov: [0-9]+' <<< "$final" | grep -oE '[0-9]+' || true)
ft=$(grep -oE 'ft: [0-9]+' <<< "$final" | grep -oE '[0-9]+' || true)
echo "fuzz.sh $target: ${seconds} s, ${execs:-?} executions, cov ${cov:-?}, ft ${ft:-?}," \
     "$(ls "$corpus" | wc -l) inputs in $corpus"
if [ "$rc" -ne 0 ]; then
  grep -E 'ERROR: |SUMMARY: |^fuzz: |Test unit written' "$log" | head -8 >&2 || true
  echo "fuzz.sh $target: FAILED (libFuzzer exit $rc; log $log). Reproduce with" \
       "$build/tests/fuzz/fuzz_${target}_replay FILE; commit the input to" \
       "tests/fuzz/corpus/$target/ (tests/fuzz/README.md)" >&2
  exit 1
fi
