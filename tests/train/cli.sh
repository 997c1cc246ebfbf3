#!/usr/bin/env bash
# The command line (issue 9): --help on every subcommand, moe help, moe --version, usage errors
# (exit 2, the usage on stderr), moe train --dry-run (the header of a real run, no run
# directory), messages that name the config key of a path, resuming a finished run, a resume
# with another train.steps, and what moe eval's number is.
#   cli.sh MOE_BINARY WORKDIR SOURCE_DIR
set -u
moe=$1 work=$2 src=$3
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"

echo "--help, moe help, --version"
for c in prepare train smoke stats eval generate export; do
  "$moe" $c --help > "$work/help_$c.out" 2> "$work/help_$c.err"
  rc=$?
  check "moe $c --help: exit 0, its usage on stdout, nothing on stderr (exit $rc)" \
    "[ $rc -eq 0 ] && head -1 '$work/help_$c.out' | grep -q '^usage: moe $c ' && [ ! -s '$work/help_$c.err' ]"
  "$moe" help $c > "$work/helpcmd_$c.out" 2>&1
  check "moe help $c prints the same" "[ \$? -eq 0 ] && cmp -s '$work/help_$c.out' '$work/helpcmd_$c.out'"
done
"$moe" train configs/x.cfg --set a.b=1 -h > "$work/help_late.out" 2>&1
check "-h after other arguments: the usage, exit 0" "[ \$? -eq 0 ] && grep -q '^usage: moe train' '$work/help_late.out'"
"$moe" help > "$work/help.out" 2>&1
check "moe help: the command list, exit 0" "[ \$? -eq 0 ] && grep -q '^  generate ' '$work/help.out'"
"$moe" --help > "$work/help2.out" 2>&1
check "moe --help: the same" "[ \$? -eq 0 ] && cmp -s '$work/help.out' '$work/help2.out'"
"$moe" > "$work/none.out" 2> "$work/none.err"
check "moe alone: the usage on stderr, exit 2" "[ \$? -eq 2 ] && [ ! -s '$work/none.out' ] && grep -q '^usage: moe' '$work/none.err'"
"$moe" --version > "$work/version.out" 2>&1
cat "$work/version.out"
check "moe --version: a version and a git revision" \
  "[ \$? -eq 0 ] && grep -Eq '^moe [0-9]+\.[0-9]+\.[0-9]+ \(git [^ )]+\)$' '$work/version.out'"

echo "usage errors: exit 2, the message and the command's usage on stderr"
usage_error() { # NAME WANT_MESSAGE ARGS...
  local name=$1 want=$2
  shift 2
  "$moe" "$@" > "$work/ue.out" 2> "$work/ue.err"
  local rc=$?
  check "$name (exit $rc)" "[ $rc -eq 2 ] && [ ! -s '$work/ue.out' ] && grep -qF -- \"$want\" '$work/ue.err' && grep -q '^usage: moe $1 ' '$work/ue.err'"
}
usage_error "train: unknown option" "moe train: error: unknown option '--bogus'" train "$work/x.cfg" --bogus
usage_error "train: no CONFIG" "a CONFIG file is required" train --dry-run
usage_error "train: --set without its value" "'--set' needs a value" train "$work/x.cfg" --set
usage_error "smoke: unknown option" "moe smoke: error: unknown option '--bogus'" smoke "$work/x.cfg" --bogus
usage_error "stats: unknown option" "unknown option '--bogus'" stats "$work" --bogus
usage_error "eval: unknown option" "moe eval: error: unknown option '--bogus'" eval --bogus 1
usage_error "eval: --data missing" "--data is required" eval --ckpt x
usage_error "generate: unknown option" "moe generate: error: unknown option '--bogus'" generate --bogus
usage_error "generate: --prompt --help is a prompt (then --ckpt is missing)" "--ckpt is required" generate --prompt --help
usage_error "export: a value missing" "'--out' needs a value" export --ckpt x --out
usage_error "prepare: --text missing" "--text is required" prepare --out x
"$moe" bogus > "$work/ue.out" 2> "$work/ue.err"
check "an unknown command: exit 2, the overview on stderr" "[ \$? -eq 2 ] && grep -q \"unknown command 'bogus'\" '$work/ue.err'"

echo "moe train --dry-run"
random_text "$work/text.txt" 2 30000
tiny_cfg "$work/tiny.cfg"
"$moe" train --dry-run "$work/tiny.cfg" > "$work/dry.out" 2>&1
rc=$?
sed -n '/^model:/,$p' "$work/dry.out"
check "exit 0 (got $rc)" "[ $rc -eq 0 ]"
check "no run directory, no data prepared" "[ ! -e '$work/run' ] && [ ! -e '$work/data' ]"
check "the resolved config, every key" "grep -q '^  init_std = ' '$work/dry.out' && grep -q '^  steps = 4;' '$work/dry.out'"
# 2 layers, d 32, E 4, k 2, ff 48: an expert has 3*32*48 = 4608 weights; dense = embed and
# lm_head 2*256*32 + per layer (2 norms 64, wqkv (4+2*2)*8*32 = 2048, wo 1024, router 128)
# + the final norm 32 = 22,944; total 22,944 + 2*4*4608 = 59,808; active 22,944 + 2*2*4608
check "parameters: total, active per token" \
  "grep -q '^parameters: 59,808 total, 41,376 active per token (22,944 dense + top-2 of 4 experts of 4,608' '$work/dry.out'"
# forward: 2 x (2 x (2048*32/32... per layer 2048 + 1024 + 128 + 2*4608) + 256*32) = 2 x 33,024;
# attention 2 layers x 4 x 32 x 32 = 8,192; 3 x (66,048 + 8,192) to train
check "FLOPs per token, forward and training" \
  "grep -A1 '^FLOPs per token:' '$work/dry.out' | tr '\n' ' ' | grep -q '^FLOPs per token: 74.24K forward (2 x 33.02K matmul weights + 8.19K attention: .*, not halved for the causal mask); 222.72K to train (3 x forward)'"
check "memory: parameters, gradients, AdamW moments, activations, expert buffers" \
  "grep -A1 '^memory (fp32, as allocated for 2 x 32 tokens)' '$work/dry.out' | tr '\n' ' ' | grep -q 'parameters 233.6 KiB, gradients 233.6 KiB, *AdamW moments 467.2 KiB, activations .* expert buffers'"
check "BLAS and threads" "grep -q '^BLAS: .*(kernels .*); threads: 2 (train.threads)' '$work/dry.out'"
check "the data it would prepare" "grep -q 'data.dir/train.bin, missing: prepared from data.text by the run' '$work/dry.out'"
"$moe" train "$work/tiny.cfg" > "$work/train.out" 2>&1
rc=$?
check "the real run (exit $rc) prints the same model and parameter lines before step 1" \
  "[ $rc -eq 0 ] && [ \"\$(grep -A1 '^model:' '$work/dry.out')\" = \"\$(grep -A1 '^model:' '$work/train.out')\" ] &&
   [ \$(grep -n '^parameters:' '$work/train.out' | cut -d: -f1) -lt \$(grep -n '^step ' '$work/train.out' | head -1 | cut -d: -f1) ]"
same_lines() { # PREFIX: the line starting with it and the next one, in both outputs
  [ "$(grep -A1 "^$1" "$work/dry.out")" = "$(grep -A1 "^$1" "$work/train.out")" ]
}
check "... and the FLOPs, memory and BLAS lines" "same_lines FLOPs && same_lines memory && [ \"\$(grep ^BLAS $work/dry.out)\" = \"\$(grep ^BLAS $work/train.out)\" ]"
"$moe" train --dry-run "$work/tiny.cfg" > "$work/dry2.out" 2>&1
check "a dry run into the finished run's log.dir says it holds a run" "grep -q 'holds a run (metrics.jsonl, expert_load.jsonl, ckpt/): moe train needs --resume' '$work/dry2.out'"

echo "resuming"
cp -a "$work/run" "$work/run.before"
"$moe" train "$work/tiny.cfg" --resume "$work/run" > "$work/finished.out" 2>&1
rc=$?
cat "$work/finished.out"
check "a finished run: exit 0, says so" \
  "[ $rc -eq 0 ] && grep -qx 'run already finished at step 4 (train.steps = 4): nothing to do; raise train.steps to continue' '$work/finished.out'"
check "no val loss nan, no training, nothing written" \
  "! grep -q 'nan' '$work/finished.out' && ! grep -q '^step ' '$work/finished.out' && diff -r '$work/run' '$work/run.before' > /dev/null"
"$moe" train "$work/tiny.cfg" --resume "$work/run" --set train.steps=3 > "$work/finished3.out" 2>&1
check "train.steps below the checkpoint's step: the same" "[ \$? -eq 0 ] && grep -q '^run already finished at step 4 (train.steps = 3)' '$work/finished3.out'"
"$moe" train "$work/tiny.cfg" --resume "$work/run/ckpt/step_00000002" --set train.steps=6 > "$work/longer.out" 2>&1
rc=$?
grep -E "warning|resumed|learning rate|done" "$work/longer.out"
check "train.steps 4 -> 6: warned that the cosine schedule is re-stretched (exit $rc)" \
  "[ $rc -eq 0 ] && grep -qx 'warning: train.steps 4 -> 6 since the checkpoint: the cosine schedule is re-stretched over the new length' '$work/longer.out' && grep -q '^done: 6 steps' '$work/longer.out'"
"$moe" train "$work/tiny.cfg" --resume "$work/run/ckpt/step_00000004" --set train.steps=6 > "$work/same.out" 2>&1
check "the schedule of the checkpoint (step 4 of the 6-step run): no warning" \
  "[ \$? -eq 0 ] && ! grep -q 'warning: train' '$work/same.out'"
"$moe" train "$work/tiny.cfg" --resume "$work/run/ckpt/step_00000004" --set train.steps=6 --set train.lr=1e-3 > "$work/lr.out" 2>&1
check "train.lr changed: warned with the learning rate at the resumed step" \
  "[ \$? -eq 0 ] && grep -q '^warning: train.lr 0.0003 -> 0.001 since the checkpoint' '$work/lr.out' && grep -q '^  the learning rate at step 5: ' '$work/lr.out'"

echo "moe eval says what the number is"
"$moe" eval --ckpt "$work/run/ckpt/latest" --data "$work/data/val.bin" --seq-len 32 > "$work/eval.out" 2> "$work/eval.err"
rc=$?
cat "$work/eval.err" "$work/eval.out"
check "the device, the BLAS and its kernels on stderr" "grep -q '^device: cpu; BLAS: .* (kernels [^)]*); .*threads: ' '$work/eval.err'"
check "nats per token, the token count, perplexity, bits per byte (exit $rc)" \
  "[ $rc -eq 0 ] && grep -Eq '^loss [0-9.]+ nats/token \(mean cross-entropy over [0-9]+ tokens\) \| ppl [0-9.]+ \| [0-9.]+ bits/byte$' '$work/eval.out'"
check "bits/byte = loss / ln 2" "python3 -c \"
import math, re, sys
m = re.match(r'loss ([0-9.]+) .* \| ppl ([0-9.]+) \| ([0-9.]+) bits/byte', open('$work/eval.out').read())
l, p, b = map(float, m.groups())
sys.exit(not (abs(b - l / math.log(2)) < 1e-3 and abs(p - math.exp(l)) < 1e-3 * p))\""

echo "paths from the config: the message names the key"
msg() { # NAME WANT SETS...
  local name=$1 want=$2
  shift 2
  "$moe" train "$work/tiny.cfg" --set "log.dir=\"$work/run_msg\"" "$@" > "$work/msg.out" 2>&1
  local rc=$?
  check "$name (exit $rc)" "[ $rc -eq 1 ] && grep -qF -- \"$want\" '$work/msg.out'"
  rm -rf "$work/run_msg"
}
msg "data.train" "data.train = 'nope.bin': token file 'nope.bin': cannot open" --set 'data.train="nope.bin"' --set 'data.val="nope.bin"'
msg "data.val" "data.val = '$work/nope.bin'" --set "data.train=\"$work/data/train.bin\"" --set "data.val=\"$work/nope.bin\""
msg "data.dir without data.text" "data.dir/train.bin = '$work/empty/train.bin': " --set "data.dir=\"$work/empty\"" --set 'data.text=[]'
hint="point at the text with --set 'data.text=[\"path/to/input.txt\"]'"
msg "data.text[1], and how to point at the text" "data.text[1] = '$work/nope.txt': No such file or directory" --set "data.dir=\"$work/data2\"" --set "data.text=[\"$work/text.txt\", \"$work/nope.txt\"]"
check "... $hint" 'grep -qF -- "$hint" "$work/msg.out"'
msg "train.init_from" "train.init_from = '$work/no_ckpt': " --set "train.init_from=\"$work/no_ckpt\""

echo "configs/shakespeare.cfg from another directory"
(cd "$work" && "$moe" train "$src/configs/shakespeare.cfg" --set "data.dir=\"$work/sh\"" --set "log.dir=\"$work/sh_run\"" > "$work/sh.out" 2>&1)
rc=$?
if [ -f "$work/../shared/data/tinyshakespeare.txt" ]; then
  echo "  skip  (a tinyshakespeare.txt beside the work folder)"
else
  check "the missing text names data.text[0] and how to point at it (exit $rc)" \
    "[ $rc -eq 1 ] && grep -qF \"data.text[0] = '../shared/data/tinyshakespeare.txt'\" '$work/sh.out' && grep -qF -- \"\$hint\" '$work/sh.out'"
fi
check "its comment says where the text comes from" "grep -q 'karpathy/char-rnn/master/data/tinyshakespeare/input.txt' '$src/configs/shakespeare.cfg'"

[ $fail -eq 0 ] && echo "cli: all passed" || echo "cli: FAILED"
exit $fail
