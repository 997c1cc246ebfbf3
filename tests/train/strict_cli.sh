#!/usr/bin/env bash
# The command line on the strict-memory backend (docs/strict_memory.md): moe train, eval and
# generate with --device cpu-strict, where any host access to backend memory outside a kernel
# faults. The tiny config turns on what has host <-> device traffic of its own: capacity
# dropping, gradient accumulation, the aux-loss-free router bias (its update copies the bias
# to the host and back), router jitter, the sequence aux loss, an eval during training and a
# checkpoint. Then eval and generate on the run's checkpoint print the same on cpu-strict as
# on cpu.
#   strict_cli.sh MOE_BINARY WORKDIR
set -u
moe=$1 work=$2
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"

random_text "$work/text.txt" 3 20000
tiny_cfg "$work/tiny.cfg" model.d_ff=24 model.capacity_factor=1.0 model.bias_rate=0.001 \
  model.router_jitter=0.01 model.seq_aux_coef=0.001 train.steps=3 train.grad_accum=2 \
  train.eval_interval=2 train.eval_batches=1 checkpoint.interval=3 checkpoint.keep=1

echo "moe train --device cpu-strict: 3 steps"
"$moe" train "$work/tiny.cfg" --device cpu-strict > "$work/train.out" 2>&1
rc=$?
grep -E "^device:|cpu-strict:" "$work/train.out"
check "exit 0 (got $rc)" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || tail -5 "$work/train.out"
check "it ran on cpu-strict" "grep -q '^device: cpu-strict' '$work/train.out'"
check "metrics.jsonl holds steps 1, 2, 3" \
  "[ \$(wc -l < '$work/run/metrics.jsonl') -eq 3 ] && grep -q '\"step\":3,' '$work/run/metrics.jsonl'"
ckpt="$work/run/ckpt/latest"
check "a checkpoint of step 3" "[ \"\$(cat '$ckpt' 2>/dev/null)\" = step_00000003 ]"

echo "moe eval and moe generate: cpu-strict prints what cpu prints"
for dev in cpu cpu-strict; do
  "$moe" eval --ckpt "$ckpt" --data "$work/data/val.bin" --seq-len 32 --device $dev \
    > "$work/eval_$dev.out" 2>&1
  echo "$? $(grep '^loss' "$work/eval_$dev.out")" > "$work/eval_$dev.rc"
  "$moe" generate --ckpt "$ckpt" --prompt "abc def" -n 24 --temperature 0.8 --seed 5 \
    --prefill-chunk 3 --device $dev > "$work/gen_$dev.out" 2>&1
  echo $? > "$work/gen_$dev.rc"
done
cat "$work/eval_cpu-strict.rc"
check "eval --device cpu-strict: exit 0" "[ \"\$(cut -d' ' -f1 '$work/eval_cpu-strict.rc')\" = 0 ]"
check "eval: the same loss line on cpu and cpu-strict" \
  "grep -q '^0 loss ' '$work/eval_cpu.rc' && cmp -s '$work/eval_cpu.rc' '$work/eval_cpu-strict.rc'"
check "generate --device cpu-strict: exit 0" "[ \"\$(cat '$work/gen_cpu-strict.rc')\" = 0 ]"
# the text: the output without the device's own lines (its name, its describe())
strip() { grep -av -e 'cpu-strict' -e '^device' -e 'BLAS' "$1"; }
check "generate: the same text on cpu and cpu-strict" \
  "[ \"\$(cat '$work/gen_cpu.rc')\" = 0 ] && [ \"\$(strip '$work/gen_cpu.out')\" = \"\$(strip '$work/gen_cpu-strict.out')\" ]"
grep -ah "cpu-strict:" "$work"/*.out && fail=1 # a fault report anywhere fails
[ $fail -eq 0 ] && [ -z "${KEEP:-}" ] && rm -rf "$work"
exit $fail
