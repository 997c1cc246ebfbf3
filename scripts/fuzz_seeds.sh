#!/usr/bin/env bash
# Regenerates the seed corpora of tests/fuzz/corpus/ from the project's own output: a
# 2-layer d_model = 8 model trained for 3 steps on a 16-token vocabulary (train, resolved
# config, checkpoint folder, HF export in bf16), and `moe prepare` token files. Seeds are
# named seed_*; other corpus entries (crash reproducers, tests/fuzz/README.md) are kept.
#
#   scripts/fuzz_seeds.sh [MOE_BINARY]     # default build/moe
set -euo pipefail
cd "$(dirname "$0")/.."
moe=$(realpath "${1:-build/moe}")
corpus=tests/fuzz/corpus
# a fixed folder: its path is written into the configs and trainer_state.json
work=/tmp/moe-fuzz-seeds
rm -rf "$work" && mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# Token files of a 16-token vocabulary in the format of data/token_file.h (`moe prepare`
# only makes byte-level ones, whose 256-row embedding would make the seeds several times larger).
python3 - "$work" <<'PY'
import random, struct, sys
random.seed(1)
for name, n in (("train", 1024), ("val", 256)):
    toks = [random.randrange(16) for _ in range(n)]
    with open(f"{sys.argv[1]}/{name}.bin", "wb") as f:
        f.write(b"MOETOK1\0" + struct.pack("<IIQII", 1, 2, n, 16, 0) + struct.pack(f"<{n}H", *toks))
PY
cat > "$work/tiny.cfg" <<CFG
model = { vocab_size = 16; d_model = 8; n_layers = 2; n_heads = 2; n_kv_heads = 1; d_ff = 4;
          n_experts = 4; top_k = 2; max_seq_len = 16; capacity_factor = 1.25; };
train = { steps = 3; batch_size = 2; seq_len = 8; warmup_steps = 1; threads = 1;
          eval_interval = 0; eval_batches = 1; };
data = { train = "$work/train.bin"; val = "$work/val.bin"; };
log = { dir = "$work/run"; interval = 1; };
checkpoint = { interval = 0; keep = 1; };
CFG
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
"$moe" train "$work/tiny.cfg" > "$work/train.log"
# a second run with the other options that change the files: tied embeddings, sigmoid
# scoring with the aux-loss-free bias (a bias file), grad_accum 2 (micro_counts), SGD
"$moe" train "$work/tiny.cfg" --set model.tie_embeddings=true --set 'model.scoring="sigmoid"' \
  --set model.bias_rate=0.01 --set train.grad_accum=2 --set 'train.optimizer="sgd"' \
  --set "log.dir=\"$work/run2\"" > "$work/train2.log"
ckpt="$work/run/ckpt/$(cat "$work/run/ckpt/latest")"
ckpt2="$work/run2/ckpt/$(cat "$work/run2/ckpt/latest")"
"$moe" export --ckpt "$ckpt" --out "$work/export" --dtype bf16 > /dev/null
printf 'The MoE layer routes each token to its top-k experts.\n' > "$work/text.txt"
"$moe" prepare --text "$work/text.txt" --out "$work/prep" --val-fraction 0.2 > /dev/null

seed() { # seed TARGET NAME FILE
  mkdir -p "$corpus/$1"
  cp "$3" "$corpus/$1/seed_$2"
}
rm -f "$corpus"/*/seed_*
seed safetensors f32_model "$ckpt/model-00001-of-00001.safetensors"
seed safetensors f32_exp_avg_sq "$ckpt/optimizer-exp_avg_sq-00001-of-00001.safetensors"
seed safetensors bf16_export "$work/export/model-00001-of-00001.safetensors"
seed token_file u16_train "$work/prep/train.bin"
seed token_file u16_val "$work/prep/val.bin"
seed config tiny.cfg "$work/tiny.cfg"
seed config resolved.cfg "$work/run/config.cfg"
seed config resolved2.cfg "$work/run2/config.cfg"
seed config default.cfg configs/default.cfg
seed hf_config ckpt.json "$ckpt/config.json"
seed hf_config bias.json "$ckpt2/config.json"
seed hf_config export.json "$work/export/config.json"
seed trainer_state adamw.json "$ckpt/trainer_state.json"
seed trainer_state sgd_bias.json "$ckpt2/trainer_state.json"
seed stats expert_load.jsonl "$work/run/expert_load.jsonl"
seed stats micro_counts.jsonl "$work/run2/expert_load.jsonl"
# metrics.jsonl (read by --watch): its clock readings fixed, so that the seed is the same bytes
python3 - "$work/run/metrics.jsonl" "$work/metrics.jsonl" <<'PY'
import json, sys
with open(sys.argv[1]) as f, open(sys.argv[2], "w") as out:
    for line in f:
        r = json.loads(line)
        r.update({k: 0.01 for k in ("step_s", "tokens_per_s") if k in r})
        r["time"] = {k: 0.001 for k in r.get("time", {})}
        out.write(json.dumps(r, separators=(",", ":")) + "\n")
PY
seed stats metrics.jsonl "$work/metrics.jsonl"
mkdir -p "$corpus/ckpt_folder"
python3 tests/fuzz/archive.py pack "$ckpt" "$corpus/ckpt_folder/seed_adamw"
python3 tests/fuzz/archive.py pack "$ckpt2" "$corpus/ckpt_folder/seed_sgd_bias"
python3 tests/fuzz/archive.py pack "$work/export" "$corpus/ckpt_folder/seed_hf_bf16"
# the single-file HF layout (model.safetensors, no index), which the loader also reads
mkdir "$work/single"
cp "$work/export/config.json" "$work/single/"
cp "$work/export/model-00001-of-00001.safetensors" "$work/single/model.safetensors"
python3 tests/fuzz/archive.py pack "$work/single" "$corpus/ckpt_folder/seed_hf_single"
du -b "$corpus"/*/seed_* | sort -k2
