#!/usr/bin/env bash
# The model families through the real binary (docs/training.md "Model families"):
# configs/qwen3-moe-tiny.cfg trains from scratch (its checkpoint a qwen3_moe folder, the dense
# layer's load not logged); each family's tiny config trains 40 steps in fp32 and bf16 with
# validation losses within 3% (bf16_cli.sh's bound); a config with no model keys fine-tunes a
# checkpoint through train.init_from (its model the folder's) and one that disagrees is refused;
# eval and generate run on it; a combination the family cannot express is refused naming it.
#   families_cli.sh MOE_BINARY SOURCE_DIR WORKDIR
set -u
moe=$1 src=$2 work=$3
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"
python3 -c "import random; random.seed(5); w=['the','cat','sat','on','a','mat','and','dog','ran',',','.']; print(' '.join(random.choice(w) for _ in range(12000)))" > "$work/text.txt"
data=(--set "data.dir=\"$work/data\"" --set "data.text=[\"$work/text.txt\"]")

echo "configs/qwen3-moe-tiny.cfg"
"$moe" train "$src/configs/qwen3-moe-tiny.cfg" "${data[@]}" --set train.steps=20 \
  --set train.warmup_steps=2 --set train.eval_interval=20 --set checkpoint.interval=20 \
  --set "log.dir=\"$work/q3\"" > "$work/q3.out" 2>&1
check "20 steps from scratch (exit $?)" "grep -q '^done: 20 steps' '$work/q3.out'"
check "its checkpoint is a Qwen3MoeForCausalLM folder" \
  "grep -q '\"model_type\":[[:space:]]*\"qwen3_moe\"' '$work/q3/ckpt/step_00000020/config.json' && grep -q 'Qwen3MoeForCausalLM' '$work/q3/ckpt/step_00000020/config.json'"
check "layer 0 is dense: no load record of it, records of layers 1-3" \
  "! grep -q '\"layer\":0,' '$work/q3/expert_load.jsonl' && grep -q '\"layer\":3,' '$work/q3/expert_load.jsonl'"

echo "each family in fp32 and bf16"
family() { # NAME: its keys, as GROUP.KEY=VALUE
  case $1 in
  qwen3_moe) echo 'model.family="qwen3_moe" model.qk_norm="head" model.head_dim=24 model.first_k_dense=1 model.dense_d_ff=96' ;;
  qwen2_moe) echo 'model.family="qwen2_moe" model.qkv_bias=true model.shared_d_ff=48 model.shared_gate=true model.sparse_step=2 model.dense_d_ff=96 model.norm_topk_prob=false' ;;
  olmoe) echo 'model.family="olmoe" model.qk_norm="full" model.norm_topk_prob=false' ;;
  esac
}
for f in qwen3_moe qwen2_moe olmoe; do
  # shellcheck disable=SC2046 # (one word a key)
  tiny_cfg "$work/$f.cfg" model.d_model=64 model.d_ff=64 model.capacity_factor= train.steps=40 \
    train.batch_size=4 train.warmup_steps=2 train.lr=3e-3 train.eval_interval=40 \
    train.eval_batches=4 log.dir= log.interval=20 checkpoint.interval=40 checkpoint.keep= $(family $f)
  for dt in fp32 bf16; do
    "$moe" train "$work/$f.cfg" --set train.dtype="\"$dt\"" --set log.dir="\"$work/${f}_$dt\"" \
      > "$work/${f}_$dt.out" 2>&1
    check "$f $dt: 40 steps (exit $?)" "grep -q '^done: 40 steps' '$work/${f}_$dt.out'"
  done
  vf=$(val_of "$work/${f}_fp32/metrics.jsonl") vb=$(val_of "$work/${f}_bf16/metrics.jsonl")
  check "$f: validation loss bf16 $vb vs fp32 $vf: within 3%" "within $vb $vf 0.03"
done

echo "train.init_from a checkpoint with no model keys"
ck=$work/qwen2_moe_fp32/ckpt/step_00000040
cat > "$work/finetune.cfg" <<CFG
train = { init_from = "$ck"; steps = 5; batch_size = 4; seq_len = 32; warmup_steps = 0;
          eval_interval = 5; eval_batches = 2; threads = 2; };
model = { max_seq_len = 32; };
data = { dir = "$work/data"; text = ["$work/text.txt"]; };
CFG
"$moe" train "$work/finetune.cfg" --set "log.dir=\"$work/ft\"" > "$work/ft.out" 2>&1
check "fine-tunes it (exit $?)" "grep -q '^done: 5 steps' '$work/ft.out' && grep -q 'initialised from' '$work/ft.out'"
check "its model is the folder's (family, shared expert, sparse_step)" \
  "grep -q 'family = \"qwen2_moe\"' '$work/ft/config.cfg' && grep -q 'shared_d_ff = 48' '$work/ft/config.cfg' && grep -q 'sparse_step = 2' '$work/ft/config.cfg'"
"$moe" train "$work/finetune.cfg" --set "log.dir=\"$work/ft2\"" --set model.shared_d_ff=32 > "$work/ft2.out" 2>&1
check "a key that disagrees with the folder is refused naming both (exit $?)" \
  "grep -q 'model.shared_d_ff: 32, but train.init_from' '$work/ft2.out'"

echo "eval and generate"
"$moe" eval --ckpt "$ck" --data "$work/data/val.bin" --seq-len 32 > "$work/eval.out" 2>&1
check "moe eval (exit $?)" "grep -q 'loss' '$work/eval.out'"
"$moe" generate --ckpt "$ck" --prompt "the cat" -n 16 --temperature 0 > "$work/gen.out" 2>&1
check "moe generate (exit $?)" "[ -s '$work/gen.out' ] && ! grep -q 'error' '$work/gen.out'"

echo "a combination the family cannot express"
"$moe" train "$work/olmoe.cfg" --set model.shared_d_ff=16 --set "log.dir=\"$work/bad\"" > "$work/bad.out" 2>&1
check "olmoe with a shared expert: refused naming the family (exit $?)" \
  "grep -q 'model.family = \"olmoe\" cannot express this model' '$work/bad.out'"

[ $fail -eq 0 ] && echo "families_cli: all passed" || echo "families_cli: FAILED"
exit $fail
