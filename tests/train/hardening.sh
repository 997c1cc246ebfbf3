#!/usr/bin/env bash
# Issue 28 (hardening, second round) through the binary: every case here exited 0 with a wrong
# or lost answer, blocked, grew without bound or leaked before its fix.
#   --prompts as /dev/zero, a FIFO, a file with a NUL byte or over 16 MiB (item 3);
#   eval and generate with stdout on /dev/full (item 6);
#   a resumed run whose final norm weight is 1e30 (CRC updated): skipped, then stopped (item 7);
#   export, eval and generate of a damaged checkpoint: refused without a leak (item 10; the
#   sanitizer build's LeakSanitizer reports one as "LeakSanitizer");
#   a fresh run's logs emptied while it writes (copytruncate): no NUL bytes after (item 12);
#   under mpirun, ranks told different things: refused within seconds naming the rank, the run
#   directory untouched (item 2).
#   hardening.sh MOE_BINARY WORKDIR [MPIRUN COMMAND...]
set -u
moe=$1 work=$2
shift 2
mpirun=("$@")
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"
no_leak() { ! grep -q LeakSanitizer "$1"; }

random_text "$work/text.txt" 3 30000
tiny_cfg "$work/tiny.cfg" train.threads=1
"$moe" train "$work/tiny.cfg" > "$work/train.out" 2>&1
check "a 4-step run to work on (exit $?)" "[ -d '$work/run/ckpt/step_00000004' ]"
ckpt=$work/run/ckpt/step_00000004

echo "--prompts: only a regular file of at most 16 MiB without NUL bytes (item 3)"
prompts() { # NAME FILE WANT
  timeout 30 "$moe" generate --ckpt "$ckpt" --prompts "$2" -n 2 > "$work/p.out" 2> "$work/p.err"
  local rc=$?
  local want=$3
  check "$1: exit 1 (got $rc), naming the file" "[ $rc -eq 1 ] && grep -qF -- \"\$want\" '$work/p.err'"
}
prompts "/dev/zero" /dev/zero "--prompts /dev/zero: not a regular file (a character device): a prompt list must be a regular file"
mkfifo "$work/prompts.fifo"
prompts "a FIFO (blocked forever)" "$work/prompts.fifo" "prompts.fifo: not a regular file (a FIFO)"
printf 'first prompt\nab\0cd\n' > "$work/nul.txt"
prompts "a NUL byte in a line (was cut silently)" "$work/nul.txt" "nul.txt:2: NUL byte at column 3"
truncate -s 17M "$work/big.txt"
prompts "17 MiB" "$work/big.txt" "is 17825792 bytes, more than the 16777216 (16 MiB) a prompt list file may have"
printf 'ab\ncd\n' > "$work/two.txt"
timeout 60 "$moe" generate --ckpt "$ckpt" --prompts "$work/two.txt" -n 2 > "$work/p.out" 2> "$work/p.err"
check "two good prompts: exit 0, both printed" "[ \$? -eq 0 ] && grep -q '^ab' '$work/p.out' && grep -q '^cd' '$work/p.out'"

echo "a stdout that cannot be written is a failure (item 6)"
"$moe" prepare --text "$work/text.txt" --out "$work/evaldata" > /dev/null 2>&1
"$moe" eval --ckpt "$ckpt" --data "$work/evaldata/val.bin" --seq-len 16 --max-windows 2 > /dev/full 2> "$work/full.err"
rc=$?
check "eval > /dev/full: exit 1 (got $rc), saying why" \
  "[ $rc -eq 1 ] && grep -q 'eval: cannot write the output to standard output: No space left on device' '$work/full.err'"
"$moe" generate --ckpt "$ckpt" --prompt ab -n 2 > /dev/full 2> "$work/full.err"
rc=$?
check "generate > /dev/full: exit 1 (got $rc)" "[ $rc -eq 1 ] && grep -q 'generate: cannot write the output' '$work/full.err'"

echo "damaged checkpoints: refused, nothing leaked (item 10)"
cp -a "$ckpt" "$work/damaged"
shard=$(ls "$work/damaged"/model-*.safetensors | head -1)
truncate -s -8 "$shard"
for cmd in "export --ckpt $work/damaged --out $work/export" \
           "eval --ckpt $work/damaged --data $work/evaldata/val.bin --seq-len 16" \
           "generate --ckpt $work/damaged --prompt ab -n 2"; do
  $moe $cmd > "$work/d.out" 2> "$work/d.err"
  rc=$?
  check "${cmd%% *} of a truncated shard: exit 1 (got $rc), no leak" \
    "[ $rc -eq 1 ] && grep -q 'moe: error: ' '$work/d.err' && no_leak '$work/d.err' && [ ! -e '$work/export' ]"
done

cp -a "$ckpt" "$work/fifo_ckpt"
rm "$work/fifo_ckpt/$(basename "$shard")" && mkfifo "$work/fifo_ckpt/$(basename "$shard")"
timeout 30 "$moe" eval --ckpt "$work/fifo_ckpt" --data "$work/evaldata/val.bin" > "$work/d.out" 2> "$work/d.err"
rc=$?
check "eval of a checkpoint whose shard is a FIFO: exit 1 (got $rc, 124: it blocked)" \
  "[ $rc -eq 1 ] && grep -q 'not a regular file (a FIFO)' '$work/d.err'"

echo "a resumed run at a loss of 1e29 is not training (item 7)"
cp -a "$work/run" "$work/run_huge"
python3 - "$work/run_huge/ckpt/step_00000004" <<'PY'
import json, os, struct, sys, zlib
folder = sys.argv[1]
index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))
shard = os.path.join(folder, index["weight_map"]["model.norm.weight"])
data = bytearray(open(shard, "rb").read())
n = struct.unpack("<Q", data[:8])[0]
info = json.loads(data[8:8 + n])["model.norm.weight"]
a, b = info["data_offsets"]
data[8 + n + a:8 + n + b] = struct.pack("<%df" % ((b - a) // 4), *[1e30] * ((b - a) // 4))
open(shard, "wb").write(data)
state_path = os.path.join(folder, "trainer_state.json")
state = json.load(open(state_path))
state["crc32"][os.path.basename(shard)] = "%08x" % zlib.crc32(bytes(data))
json.dump(state, open(state_path, "w"), indent=2)
PY
"$moe" train "$work/tiny.cfg" --set "log.dir=\"$work/run_huge\"" --set train.steps=8 \
  --set train.max_skipped=2 --resume "$work/run_huge" > "$work/huge.out" 2> "$work/huge.err"
rc=$?
check "exit 1 (got $rc): every step skipped, the run stopped" \
  "[ $rc -eq 1 ] && grep -q 'step 5: cross-entropy beyond 709.78 nats/token' '$work/huge.err' &&
   grep -q 'stopping at step 6: 2 consecutive steps' '$work/huge.err'"
check "no step trained at that loss" "! grep -q '^step  *[5-8] ' '$work/huge.out'"

echo "a fresh run's logs emptied while it writes (item 12)"
sed -e 's/steps = 4;/steps = 3000;/' -e "s|$work/run\"|$work/run_rot\"|" -e 's/interval = 2; keep/interval = 0; keep/' \
  "$work/tiny.cfg" > "$work/rot.cfg"
"$moe" train "$work/rot.cfg" > "$work/rot.out" 2>&1 &
pid=$!
for _ in $(seq 600); do # until 20 records are written
  [ "$(wc -l < "$work/run_rot/metrics.jsonl" 2>/dev/null || echo 0)" -ge 20 ] && break
  sleep 0.05
done
: > "$work/run_rot/metrics.jsonl"
: > "$work/run_rot/expert_load.jsonl"
emptied=$(kill -0 $pid 2>/dev/null && echo 1 || echo 0)
wait $pid
rc=$?
check "the run went on after its logs were emptied (exit $rc)" "[ $rc -eq 0 ] && [ $emptied = 1 ] && [ -s '$work/run_rot/metrics.jsonl' ]"
for f in metrics.jsonl expert_load.jsonl; do
  check "$f: no NUL bytes, starts with a record" \
    "[ \$(tr -cd '\\000' < '$work/run_rot/$f' | wc -c) -eq 0 ] && head -c 9 '$work/run_rot/$f' | grep -q '^{\"step\":'"
done
"$moe" stats "$work/run_rot" > "$work/rot_stats.out" 2>&1
check "moe stats reads them (exit $?)" "grep -q 'max/mean' '$work/rot_stats.out'"

if [ ${#mpirun[@]} -gt 0 ]; then
  echo "ranks told different things: refused within seconds, naming the rank (item 2)"
  cp -a "$work/run" "$work/run.before"
  mpmd() { # NAME WANT ARGS_RANK0 -- ARGS_RANK1
    local name=$1 want=$2
    shift 2
    local a=() b=()
    while [ "$1" != -- ]; do a+=("$1"); shift; done
    shift
    b=("$@")
    local t0=$SECONDS
    timeout 60 "${mpirun[@]}" -np 1 "$moe" "${a[@]}" : -np 1 "$moe" "${b[@]}" > "$work/mpmd.out" 2>&1
    local rc=$? dt=$((SECONDS - t0))
    check "$name: refused (exit $rc, not 124) in $dt s" \
      "[ $rc -ne 0 ] && [ $rc -ne 124 ] && grep -qF -- \"\$want\" '$work/mpmd.out'"
    [ $rc -eq 0 ] || [ $rc -eq 124 ] || grep -qF -- "$want" "$work/mpmd.out" || sed 's/^/    /' "$work/mpmd.out" | head -8
  }
  mpmd "--resume on rank 0, --overwrite on rank 1" \
    "the ranks were told different things: rank 1 would overwrite the run (--overwrite), rank 0 resume from $work/run/ckpt/step_00000004 (step 4)" \
    train "$work/tiny.cfg" --set train.steps=6 --resume "$work/run" -- train "$work/tiny.cfg" --set train.steps=6 --overwrite
  check "... and the run directory is as it was" "diff -r '$work/run' '$work/run.before' > /dev/null"
  mpmd "train on rank 0, eval on rank 1" "rank 1 runs \`moe eval\`, rank 0 \`moe train\`" \
    train "$work/tiny.cfg" --set "log.dir=\"$work/run_mpmd\"" -- eval --ckpt "$ckpt" --data "$work/evaldata/val.bin"
  mpmd "train on rank 0, generate on rank 1" "only moe train and moe eval run on several ranks" \
    train "$work/tiny.cfg" --set "log.dir=\"$work/run_mpmd\"" -- generate --ckpt "$ckpt" --prompt ab
  mpmd "eval of two data files" "rank 1 reads --ckpt $ckpt --data $work/evaldata/train.bin" \
    eval --ckpt "$ckpt" --data "$work/evaldata/val.bin" -- eval --ckpt "$ckpt" --data "$work/evaldata/train.bin"
  mpmd "--dry-run on one rank only" "rank 1 would start a run (--dry-run), rank 0 start a run" \
    train "$work/tiny.cfg" --set "log.dir=\"$work/run_dry\"" -- train "$work/tiny.cfg" --set "log.dir=\"$work/run_dry\"" --dry-run
  check "... and nothing was created" "[ ! -e '$work/run_mpmd' ] && [ ! -e '$work/run_dry' ]"
else
  echo "(no mpirun: the rank checks are not run)"
fi

[ $fail -eq 0 ] && echo "hardening: all passed" || echo "hardening: FAILED"
exit $fail
