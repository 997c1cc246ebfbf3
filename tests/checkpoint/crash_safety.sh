#!/usr/bin/env bash
# Crash safety of checkpoint saves: the second save of a run is killed with SIGKILL at each
# point of the save protocol (test-only hook MOE_TEST_CRASH_AT); the previous checkpoint
# must still load and resume, and `latest` must never name an incomplete folder.
#   crash_safety.sh MOE_BINARY WORKDIR TEXT_FILE
set -u
moe=$1 work=$2 text=$3
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"

for point in model_written before_rename after_rename latest_written before_prune; do
  run="$work/$point"
  tiny_cfg "$run.cfg" model.d_ff=24 model.capacity_factor=1.0 train.steps=6 train.eval_batches=1 \
    "data.text=[\"$text\"]" "log.dir=\"$run\"" log.interval=100 checkpoint.keep=1
  echo "crash at '$point' of the second save (step 4)"
  MOE_TEST_CRASH_AT=$point MOE_TEST_CRASH_SAVE=2 "$moe" train "$run.cfg" > "$run.log" 2>&1
  rc=$?
  check "killed by SIGKILL (exit $rc)" "[ $rc -eq 137 ]"
  latest=$(cat "$run/ckpt/latest" 2>/dev/null)
  case $point in
    model_written|before_rename|after_rename|latest_written) want=step_00000002 ;;
    before_prune) want=step_00000004 ;;
  esac
  check "latest names $want (got '$latest')" "[ '$latest' = $want ]"
  check "latest is a complete checkpoint" "[ -f '$run/ckpt/$latest/trainer_state.json' ]"
  check "it loads (eval)" "'$moe' eval --ckpt '$run/ckpt/latest' --data '$work/data/val.bin' --seq-len 32 --max-windows 2 > '$run.eval' 2>&1"
  check "the run resumes from it to the end" \
    "'$moe' train '$run.cfg' --resume '$run/ckpt/latest' > '$run.resume' 2>&1 && grep -q 'resumed from' '$run.resume' && [ \"\$(cat '$run/ckpt/latest')\" = step_00000006 ]"
  check "no .tmp folder is left after the resumed run" "! ls -d '$run'/ckpt/*.tmp > /dev/null 2>&1"
done
[ $fail -eq 0 ] && echo "crash safety: all passed" || echo "crash safety: FAILED"
exit $fail
