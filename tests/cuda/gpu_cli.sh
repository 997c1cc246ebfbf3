#!/usr/bin/env bash
# The command line on the GPU against the CPU: 20 training steps of a tiny config on cuda and
# on cpu (losses within 1e-4 relative, step by step), the same in bf16 (within 1e-3 of cpu
# bf16, 1e-2 of fp32), checkpoints crossing devices (a cuda
# checkpoint resumed on cpu, a cpu one on cuda: the resumed steps' losses within 1e-4 of the
# uninterrupted runs), moe eval on cuda (loss within 1e-5 of cpu) and moe generate on cuda
# (greedy: the same text as cpu; its KV cache lives on the device).
# Exit 77 (skipped) when the build or the machine has no CUDA device.
#   gpu_cli.sh MOE_BINARY WORKDIR
set -u
moe=$1 work=$2
gpu=${MOE_GPU_CLI_DEVICE:-cuda} # another device only to test this script itself on a CPU
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"

random_text "$work/text.txt" 7 30000
tiny_cfg "$work/tiny.cfg" model.d_model=64 model.max_seq_len=64 model.capacity_factor= \
  model.router_jitter=0.01 model.seq_aux_coef=0.001 train.steps=20 train.seq_len=64 \
  train.grad_accum=2 train.warmup_steps=2 train.eval_batches= checkpoint.interval=10

train() { # NAME DEVICE [args]: a run in $work/NAME
    local name=$1 dev=$2
    shift 2
    "$moe" train "$work/tiny.cfg" --device "$dev" --set "log.dir=\"$work/$name\"" "$@" \
        > "$work/$name.out" 2>&1
}
train gpu "$gpu"
rc=$?
if [ $rc -ne 0 ] && grep -q "no CUDA device" "$work/gpu.out"; then
    grep "error" "$work/gpu.out"
    echo "skipped: no CUDA device"
    exit 77
fi
check "moe train --device cuda: exit 0 (got $rc)" "[ $rc -eq 0 ]"
[ $rc -eq 0 ] || tail -5 "$work/gpu.out"
grep -E "^device:|^CUDA" "$work/gpu.out" | head -2
train cpu cpu
check "moe train --device cpu: exit 0" "[ $? -eq 0 ]"
train gpu_to_cpu cpu --resume "$work/gpu/ckpt/step_00000010"
check "a cuda checkpoint resumes on cpu" "[ $? -eq 0 ]"
train cpu_to_gpu "$gpu" --resume "$work/cpu/ckpt/step_00000010"
check "a cpu checkpoint resumes on cuda" "[ $? -eq 0 ]"

# losses of run A vs run B, steps FROM..20, relative 1e-4
close() {
    python3 - "$work/$1/metrics.jsonl" "$work/$2/metrics.jsonl" "$3" "${4:-1e-4}" <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in map(json.loads, open(p)) if "loss" in r and r["loss"] is not None}
a, b, first, tol = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
steps = [s for s in range(first, 21)]
worst = max(abs(a[s] - b[s]) / abs(b[s]) for s in steps)
print(f"    steps {first}..20: max relative loss difference {worst:.2e}")
sys.exit(0 if worst <= tol and all(s in a and s in b for s in steps) else 1)
PY
}
check "20 steps: cuda losses within 1e-4 of cpu" "close gpu cpu 1"
check "cuda step 10 -> cpu: steps 11..20 within 1e-4 of the cuda run" "close gpu_to_cpu gpu 11"
check "cpu step 10 -> cuda: steps 11..20 within 1e-4 of the cpu run" "close cpu_to_gpu cpu 11"

# bf16 mixed precision on the device (its kernels against the CPU's bf16 path)
train gpu_bf16 "$gpu" --set 'train.dtype="bf16"'
check "moe train --device cuda, train.dtype bf16: exit 0" "[ $? -eq 0 ]"
train cpu_bf16 cpu --set 'train.dtype="bf16"'
check "20 steps bf16: cuda losses within 1e-3 of cpu bf16" "close gpu_bf16 cpu_bf16 1 1e-3"
check "20 steps bf16 on cuda: losses within 1e-2 of fp32" "close gpu_bf16 gpu 1 1e-2"

ckpt="$work/gpu/ckpt/latest"
for dev in cpu "$gpu"; do
    "$moe" eval --ckpt "$ckpt" --data "$work/data/val.bin" --seq-len 64 --device $dev \
        > "$work/eval_$dev.out" 2>&1
    echo $? > "$work/eval_$dev.rc"
    "$moe" generate --ckpt "$ckpt" --prompt "abc def" -n 32 --temperature 0 --prefill-chunk 3 \
        --device $dev > "$work/gen_$dev.out" 2>&1
    echo $? > "$work/gen_$dev.rc"
done
check "moe eval --device cuda: exit 0" "[ \"\$(cat '$work/eval_$gpu.rc')\" = 0 ]"
check "moe eval: cuda loss within 1e-5 of cpu" "python3 - '$work/eval_$gpu.out' '$work/eval_cpu.out' <<'PY'
import re, sys
def loss(p): return float(re.search(r'^loss ([0-9.eE+-]+)', open(p).read(), re.M).group(1))
a, b = loss(sys.argv[1]), loss(sys.argv[2])
print(f'    eval loss cuda {a:.6f} cpu {b:.6f}')
sys.exit(0 if abs(a - b) <= 1e-5 * abs(b) else 1)
PY"
check "moe generate --device cuda: exit 0" "[ \"\$(cat '$work/gen_$gpu.rc')\" = 0 ]"
strip() { grep -av -e '^device' -e 'BLAS' -e '^CUDA' "$1"; }
check "generate (greedy): the same text on cuda and cpu" \
    "[ \"\$(strip '$work/gen_cpu.out')\" = \"\$(strip '$work/gen_$gpu.out')\" ]"
[ $fail -eq 0 ] && [ -z "${KEEP:-}" ] && rm -rf "$work"
exit $fail
