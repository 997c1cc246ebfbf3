#!/usr/bin/env bash
# bf16 through the real binary (docs/bf16.md): train.dtype = "bf16" trains and says so, the
# same 20 steps in fp32 and bf16 end at validation losses within 3% of each other; a bf16
# run resumes from an fp32 checkpoint (checkpoints are fp32 either way); moe eval --dtype
# bf16 is within 1% of fp32 eval on the same checkpoint and says its precision; moe generate
# --dtype bf16 runs; MOE_BF16_GEMM=reference evaluates the same within 1e-4; a bad dtype
# or MOE_BF16_GEMM is refused naming the key, option or variable.
#   bf16_cli.sh MOE_BINARY WORKDIR
set -u
moe=$1 work=$2
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"

python3 -c "import random; random.seed(3); w=['the','cat','sat','on','a','mat','and','dog','ran',',','.']; print(' '.join(random.choice(w) for _ in range(12000)))" > "$work/text.txt"
cat > "$work/tiny.cfg" <<CFG
model = { vocab_size = 256; d_model = 64; n_layers = 2; n_heads = 4; n_kv_heads = 2; d_ff = 64;
          n_experts = 4; top_k = 2; max_seq_len = 32; };
train = { steps = 20; batch_size = 4; seq_len = 32; warmup_steps = 2; lr = 3e-3; threads = 2;
          eval_interval = 20; eval_batches = 4; };
data = { dir = "$work/data"; text = ["$work/text.txt"]; };
log = { interval = 10; };
checkpoint = { interval = 10; };
CFG

echo "train.dtype"
for dt in fp32 bf16; do
  "$moe" train "$work/tiny.cfg" --set train.dtype="\"$dt\"" --set log.dir="\"$work/$dt\"" \
    > "$work/$dt.out" 2>&1
  check "$dt: 20 steps (exit $?)" "grep -q '^done: 20 steps' '$work/$dt.out'"
done
check "the run prints its precision" "grep -q '^precision: bf16: bf16 GEMM operands with fp32 accumulation' '$work/bf16.out' && grep -q '^precision: fp32 (train.dtype)' '$work/fp32.out'"
check "the memory line names it" "grep -q '^memory (bf16, ' '$work/bf16.out'"
check "describe() says which bf16 GEMM path" "grep -q '; bf16: \(native\|emulated\) (' '$work/bf16.out'"
vf=$(val_of "$work/fp32/metrics.jsonl") vb=$(val_of "$work/bf16/metrics.jsonl")
check "validation loss bf16 $vb vs fp32 $vf: within 3%" "within $vb $vf 0.03"

echo "resume an fp32 checkpoint in bf16"
"$moe" train "$work/tiny.cfg" --set train.steps=30 --set train.dtype='"bf16"' \
  --set log.dir="\"$work/fp32\"" --resume "$work/fp32" > "$work/resume.out" 2>&1
check "resumed at step 20, trained to 30 (exit $?)" "grep -q '^done: 30 steps' '$work/resume.out'"

echo "moe eval / generate --dtype bf16"
ck="$work/bf16/ckpt/latest"
"$moe" eval --ckpt "$ck" --data "$work/data/val.bin" --seq-len 32 > "$work/e32.out" 2> "$work/e32.err"
"$moe" eval --ckpt "$ck" --data "$work/data/val.bin" --seq-len 32 --dtype bf16 > "$work/e16.out" 2> "$work/e16.err"
l32=$(awk '{print $2}' "$work/e32.out") l16=$(awk '{print $2}' "$work/e16.out")
check "eval bf16 $l16 vs fp32 $l32: within 1%" "within $l16 $l32 0.01"
check "eval --dtype bf16 says so on stderr" "grep -q 'moe eval: precision bf16' '$work/e16.err'"
"$moe" generate --ckpt "$ck" --prompt "the cat" -n 16 --temperature 0 --dtype bf16 > "$work/g16.out" 2>&1
check "generate --dtype bf16 (exit $?)" "grep -q 'moe generate: precision bf16' '$work/g16.out' && [ \$(wc -c < '$work/g16.out') -gt 16 ]"

MOE_BF16_GEMM=reference "$moe" eval --ckpt "$ck" --data "$work/data/val.bin" --seq-len 32 --dtype bf16 \
  > "$work/eref.out" 2> "$work/eref.err"
lr=$(awk '{print $2}' "$work/eref.out")
check "MOE_BF16_GEMM=reference: says so, eval $lr vs $l16 within 1e-4 (the same arithmetic, other sums)" \
  "grep -q 'bf16: reference (forced by MOE_BF16_GEMM' '$work/eref.err' && within $lr $l16 1e-4"

echo "a bad dtype is refused"
MOE_BF16_GEMM=fast "$moe" eval --ckpt "$ck" --data "$work/data/val.bin" --dtype bf16 > "$work/bad0.out" 2>&1
check "MOE_BF16_GEMM=fast: exit 1 naming the variable and the choices (rc $?)" "grep -q \"MOE_BF16_GEMM='fast': expected auto, native, sbgemm, onednn, amx, emulated or reference\" '$work/bad0.out'"
"$moe" eval --ckpt "$ck" --data "$work/data/val.bin" --dtype fp16 > "$work/bad.out" 2>&1
check "--dtype fp16: exit 1 naming the option (rc $?)" "grep -q \"dtype 'fp16': expected fp32 or bf16\" '$work/bad.out'"
"$moe" train "$work/tiny.cfg" --set train.dtype='"f16"' --set log.dir="\"$work/bad\"" > "$work/bad2.out" 2>&1
check "train.dtype = \"f16\": names the key" "grep -q 'train.dtype: \"f16\" is not one of \"fp32\" or \"bf16\"' '$work/bad2.out'"

[ $fail -eq 0 ] && echo "bf16 cli: all passed" || echo "bf16 cli: FAILED"
exit $fail
