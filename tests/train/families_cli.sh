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
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { if eval "$2"; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }
val_of() { python3 -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$1"; }
within() { python3 -c "import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)" "$@"; }
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
family() { # NAME: its keys
  case $1 in
  qwen3_moe) echo 'family = "qwen3_moe"; qk_norm = "head"; head_dim = 24; first_k_dense = 1; dense_d_ff = 96;' ;;
  qwen2_moe) echo 'family = "qwen2_moe"; qkv_bias = true; shared_d_ff = 48; shared_gate = true; sparse_step = 2; dense_d_ff = 96; norm_topk_prob = false;' ;;
  olmoe) echo 'family = "olmoe"; qk_norm = "full"; norm_topk_prob = false;' ;;
  esac
}
for f in qwen3_moe qwen2_moe olmoe; do
  cat > "$work/$f.cfg" <<CFG
model = { vocab_size = 256; d_model = 64; n_layers = 2; n_heads = 4; n_kv_heads = 2; d_ff = 64;
          n_experts = 4; top_k = 2; max_seq_len = 32; $(family $f) };
train = { steps = 40; batch_size = 4; seq_len = 32; warmup_steps = 2; lr = 3e-3; threads = 2;
          eval_interval = 40; eval_batches = 4; };
data = { dir = "$work/data"; text = ["$work/text.txt"]; };
log = { interval = 20; };
checkpoint = { interval = 40; };
CFG
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
