#!/usr/bin/env bash
# moe smoke: exit 1 on a config built to collapse routing onto one expert (a corpus of one
# repeated byte: every token has the same hidden state, so the same expert), exit 0 on a
# healthy one (random bytes route evenly); the report names the alerts.
#   smoke_cli.sh MOE_BINARY WORKDIR
set -u
moe=$1 work=$2
mountpoint -q "$work/tmpfs" 2>/dev/null && umount "$work/tmpfs" # left by an interrupted run
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { if eval "$2"; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }

head -c 20000 /dev/zero | tr '\0' 'a' > "$work/collapse.txt"
python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefghijklmnopqrstuvwxyz ,.') for _ in range(40000)))" > "$work/random.txt"
for corpus in collapse random; do
  cat > "$work/$corpus.cfg" <<CFG
model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2; d_ff = 32;
          n_experts = 8; top_k = 1; max_seq_len = 32; capacity_factor = 1.25; };
train = { steps = 100; batch_size = 4; seq_len = 32; warmup_steps = 5; threads = 2; };
data = { dir = "$work/data_$corpus"; text = ["$work/$corpus.txt"]; };
log = { dir = "$work/run_$corpus"; interval = 100; load_alert = 1.5; alert_after = 0; };
CFG
done
echo "collapsed routing (one repeated byte)"
"$moe" smoke "$work/collapse.cfg" --steps 5 > "$work/collapse.out" 2>&1
rc=$?
cat "$work/collapse.out" | grep -E "layer|ALERT|smoke:|memory|throughput|dropped"
check "exit status 1 (got $rc)" "[ $rc -eq 1 ]"
check "the collapse check names the layer and expert" "grep -q 'FAIL collapse: layer 0 expert [0-9] has 8.00x the mean load' '$work/collapse.out'"
check "dead experts are reported" "grep -q 'dead expert' '$work/collapse.out'"
check "no checkpoint is written" "[ ! -d '$work/run_collapse/smoke/ckpt' ]"
echo "healthy routing (random bytes), load_alert 3"
"$moe" smoke "$work/random.cfg" --steps 5 --set log.load_alert=3.0 > "$work/random.out" 2>&1
rc=$?
grep -E "layer|ALERT|smoke:" "$work/random.out"
check "exit status 0 (got $rc)" "[ $rc -eq 0 ]"
check "the report has memory, throughput and router logits" \
  "grep -q '^memory' '$work/random.out' && grep -q '^estimated throughput' '$work/random.out' && grep -q '^router logits' '$work/random.out'"
echo "train.load_alert_action = \"stop\" stops a collapsing run"
"$moe" train "$work/collapse.cfg" --set 'train.load_alert_action="stop"' > "$work/stop.out" 2>&1
rc=$?
tail -2 "$work/stop.out"
check "exit status 1 (got $rc)" "[ $rc -eq 1 ]"
check "the message names the step (the first after a full window), layer, expert and the settings" \
  "grep -q 'stopping at step 50: layer 0: median max/mean load 8.00 over steps 1-50, hottest expert [0-9] (log.load_alert = 1.50, log.alert_window = 50, log.alert_after = 0, train.load_alert_action = \"stop\")' '$work/stop.out'"
"$moe" train "$work/collapse.cfg" --set train.steps=3 --set train.warmup_steps=1 --set log.interval=1 \
  --set "log.dir=\"$work/run_warn\"" > "$work/warn.out" 2>&1
rc=$?
check "with the default (warn) the same run goes on (exit $rc)" "[ $rc -eq 0 ] && grep -q 'done: 3 steps' '$work/warn.out'"
"$moe" train "$work/collapse.cfg" --set train.steps=4 --set train.warmup_steps=1 --set log.interval=4 \
  --set log.alert_window=1 --set "log.dir=\"$work/run_warn4\"" > "$work/warn4.out" 2>&1
check "console lines at steps 1 and 4 (window 1): the warning at step 4 counts steps 2-4 and names the worst" \
  "grep -q 'warning: step 2 layer 0: median max/mean load 8.00 over steps 2-2, hottest expert [0-9] (log.load_alert = 1.50; 3 steps in alert since the last report)' '$work/warn4.out'"
echo "grad_accum 2: each expert_load record has the micro-batches' own counts"
"$moe" train "$work/random.cfg" --set train.steps=3 --set train.warmup_steps=1 --set train.grad_accum=2 \
  --set "log.dir=\"$work/run_accum\"" > "$work/accum.out" 2>&1
rc=$?
check "the run exits 0 (got $rc)" "[ $rc -eq 0 ]"
check "6 records, each with 2 micro_counts rows of 8 summing to counts and to 2 x 128 x top_k" \
  "python3 - '$work/run_accum/expert_load.jsonl' <<'PY'
import json, sys
recs = [json.loads(l) for l in open(sys.argv[1])]
assert len(recs) == 6, len(recs)
for r in recs:
    m = r['micro_counts']
    assert len(m) == 2 and all(len(row) == 8 and sum(row) == 128 for row in m), m
    assert [a + b for a, b in zip(*m)] == r['counts'], (m, r['counts'])
PY"
"$moe" stats "$work/run_accum" --capacity > "$work/accum_stats.out" 2>&1
rc=$?
check "moe stats --capacity uses them: exit 0, no approximation note (got $rc)" \
  "[ $rc -eq 0 ] && grep -q 'grad_accum 2' '$work/accum_stats.out' && ! grep -q approximated '$work/accum_stats.out'"
echo "a run directory that holds a run: a new run is refused, --resume RUN_DIR continues, --overwrite starts over"
run="$work/run_twice"
sets=(--set train.warmup_steps=1 --set checkpoint.interval=2 --set "log.dir=\"$run\"")
"$moe" train "$work/random.cfg" "${sets[@]}" --set train.steps=4 > "$work/twice1.out" 2>&1
check "the first run exits 0" "[ $? -eq 0 ]"
cp -a "$run" "$work/run_twice.before"
"$moe" train "$work/random.cfg" "${sets[@]}" --set train.steps=4 > "$work/twice2.out" 2>&1
rc=$?
cat "$work/twice2.out"
check "the second run is refused (exit $rc)" "[ $rc -eq 1 ]"
check "the message names the directory and what it holds, offers --resume RUN_DIR, --overwrite, log.dir" \
  "grep -q 'train: $run already holds a run (metrics.jsonl, expert_load.jsonl, ckpt/)' '$work/twice2.out' &&
   grep -q -- '--resume $run ' '$work/twice2.out' && grep -q -- '--overwrite' '$work/twice2.out' &&
   grep -q 'log.dir' '$work/twice2.out'"
check "the old run is intact (logs, config, checkpoints)" "diff -rq '$run' '$work/run_twice.before'"
"$moe" train "$work/random.cfg" "${sets[@]}" --set train.steps=6 --resume "$run" > "$work/twice3.out" 2>&1
rc=$?
check "--resume RUN_DIR continues from RUN_DIR/ckpt/latest (step 4) to step 6 (exit $rc)" \
  "[ $rc -eq 0 ] && grep -q 'resumed from $run/ckpt/latest at step 4' '$work/twice3.out' &&
   [ \"\$(cat '$run/ckpt/latest')\" = step_00000006 ] && [ \$(wc -l < '$run/metrics.jsonl') -eq 6 ]"
echo "a note of the user's" > "$run/notes.txt" && echo "mine" > "$run/ckpt/README"
"$moe" train "$work/random.cfg" "${sets[@]}" --set train.steps=4 --overwrite > "$work/twice4.out" 2>&1
rc=$?
check "--overwrite starts over (exit $rc): 4 records, only this run's checkpoints (2, 4)" \
  "[ $rc -eq 0 ] && [ \$(wc -l < '$run/metrics.jsonl') -eq 4 ] &&
   [ \"\$(ls '$run/ckpt' | tr '\n' ' ')\" = 'README latest step_00000002 step_00000004 ' ]"
check "--overwrite leaves files it did not write" "[ -f '$run/notes.txt' ] && [ -f '$run/ckpt/README' ]"
mkdir -p "$work/run_nockpt" && echo '{"step":1}' > "$work/run_nockpt/metrics.jsonl"
"$moe" train "$work/random.cfg" "${sets[@]}" --resume "$work/run_nockpt" > "$work/nockpt.out" 2>&1
rc=$?
tail -1 "$work/nockpt.out"
check "--resume of a run directory without a checkpoint says so (exit $rc)" \
  "[ $rc -eq 1 ] && grep -q 'run_nockpt: a run directory with no checkpoint to resume from' '$work/nockpt.out'"
echo "a disk that fills mid-run (a 64 KiB tmpfs) stops the run at once, naming the file"
if mkdir -p "$work/tmpfs" && mount -t tmpfs -o size=64k tmpfs "$work/tmpfs" 2>/dev/null; then
  # ~1.7 KB of logs per step: the disk is full after a few dozen of the 2000 steps
  "$moe" train "$work/random.cfg" --set train.steps=2000 --set log.interval=100000 \
    --set "log.dir=\"$work/tmpfs/run\"" > "$work/full.out" 2>&1
  rc=$?
  umount "$work/tmpfs"
  tail -1 "$work/full.out"
  check "exit status 1 (got $rc)" "[ $rc -eq 1 ] && ! grep -q '^done:' '$work/full.out'"
  check "the message names the log and the OS error" \
    "grep -Eq '^moe: error: $work/tmpfs/run/(metrics|expert_load).jsonl: write failed: No space left on device$' '$work/full.out'"
else
  echo "  skip  cannot mount a tmpfs here (needs root); test_train_smoke covers it with /dev/full"
fi
[ $fail -eq 0 ] && echo "smoke cli: all passed" || echo "smoke cli: FAILED"
exit $fail
