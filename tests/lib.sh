# shellcheck shell=bash disable=SC2034,SC2154 # (variables set here, or read, for the sourcing script)
# tests/lib.sh: what the shell tests that drive the moe binary share. Sourced (after `set -u`
# and with $work set) by tests/train/{cli,hardening,strict_cli,bf16_cli,families_cli}.sh,
# tests/checkpoint/{crash_safety,inference_cli}.sh and tests/cuda/gpu_cli.sh:
#   fail                      0; a failed check sets it to 1 (the script exits with it)
#   check NAME CONDITION      evals CONDITION: prints "  ok    NAME", or "  FAIL  NAME" and fail=1
#   new_workdir DIR           DIR emptied: removed, then made again
#   random_text FILE SEED COUNT [LETTERS]
#                             COUNT characters drawn from LETTERS by Python's random, seeded
#   tiny_cfg FILE [GROUP.KEY=VALUE...]
#                             the tiny config the tests train, with some keys changed
#   val_of METRICS            the last val_loss of a run's metrics.jsonl
#   within A B TOL            true when |A - B| <= TOL |B|
fail=0

check() { if eval "$2"; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }

new_workdir() { rm -rf "$1" && mkdir -p "$1"; }

val_of() { python3 -c "import json,sys; print([json.loads(l)['val_loss'] for l in open(sys.argv[1]) if 'val_loss' in l][-1])" "$1"; }
within() { python3 -c "import sys; a, b, t = map(float, sys.argv[1:]); sys.exit(0 if abs(a - b) <= t * abs(b) else 1)" "$@"; }

random_text() { # FILE SEED COUNT [LETTERS]; LETTERS 'abcdefgh ijklmnop,.' unless given
  python3 -c "import random; random.seed($2); print(''.join(random.choice('${4:-abcdefgh ijklmnop,.}') for _ in range($3)))" > "$1"
}

# tiny_cfg FILE [GROUP.KEY=VALUE...]: writes FILE, a config of 2 layers, d_model 32, 4 experts,
# top-2, 4 steps of 2 x 32 tokens from $work/text.txt (data in $work/data, the run in
# $work/run, a checkpoint every 2 steps). Each GROUP.KEY=VALUE (written as for moe's --set)
# replaces that key's value or adds the key to its group; GROUP.KEY= (no value) leaves the key
# out, and a group with no key left is left out. One line a group, "GROUP = { KEY = VALUE; ... };"
# (hardening.sh edits the file with sed).
tiny_cfg() {
  local file=$1 setting key group
  shift
  local -A value=() body=()
  local -a keys=() groups=()
  for setting in model.vocab_size=256 model.d_model=32 model.n_layers=2 model.n_heads=4 \
      model.n_kv_heads=2 model.d_ff=48 model.n_experts=4 model.top_k=2 model.max_seq_len=32 \
      model.capacity_factor=1.25 train.steps=4 train.batch_size=2 train.seq_len=32 \
      train.warmup_steps=1 train.eval_interval=0 train.eval_batches=2 train.threads=2 \
      "data.dir=\"$work/data\"" "data.text=[\"$work/text.txt\"]" "log.dir=\"$work/run\"" \
      log.interval=1 checkpoint.interval=2 checkpoint.keep=2 "$@"; do
    key=${setting%%=*}
    [ -n "${value[$key]+set}" ] || keys+=("$key")
    value[$key]=${setting#*=}
  done
  for key in "${keys[@]}"; do
    [ -n "${value[$key]}" ] || continue
    group=${key%%.*}
    [ -n "${body[$group]+set}" ] || groups+=("$group")
    body[$group]+="${key#*.} = ${value[$key]}; "
  done
  for group in "${groups[@]}"; do echo "$group = { ${body[$group]}};"; done > "$file"
}
