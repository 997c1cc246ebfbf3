#!/usr/bin/env bash
# The load alert rule (warm-up grace log.alert_after, then the median of max/mean over the last
# log.alert_window steps above log.load_alert, or an expert with no token in the window) and
# the moe smoke gate (docs/training.md "moe smoke", docs/expert-load.md "Load alerts").
#   alerts.sh MOE_BINARY WORKDIR SOURCE_DIR
# MOE_TEST_LOAD_MOM="A-B:V,..." (test-only, train/step_log.c) makes the rule see layer 0's max/mean
# as V on steps A..B: a synthetic overload on a healthy run.
set -u
moe=$1 work=$2 src=$3
rm -rf "$work" && mkdir -p "$work"
fail=0
check() { if eval "$2"; then echo "  ok    $1"; else echo "  FAIL  $1"; fail=1; fi; }

head -c 20000 /dev/zero | tr '\0' 'a' > "$work/collapse.txt"
python3 -c "import random; random.seed(1); print(''.join(random.choice('abcdefghijklmnopqrstuvwxyz ,.') for _ in range(40000)))" > "$work/random.txt"
python3 -c "import random; random.seed(2); print(''.join(random.choice('abc') for _ in range(40000)))" > "$work/abc.txt"
for corpus in collapse random abc; do
  cat > "$work/$corpus.cfg" <<CFG
model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2; d_ff = 32;
          n_experts = 8; top_k = 1; max_seq_len = 32; capacity_factor = 1.25; };
train = { steps = 40; batch_size = 4; seq_len = 32; warmup_steps = 5; threads = 2; eval_batches = 1; };
data = { dir = "$work/data_$corpus"; text = ["$work/$corpus.txt"]; };
log = { dir = "$work/run_$corpus"; interval = 1; load_alert = 5.0; alert_after = 30; alert_window = 10; };
CFG
done
# the warnings of a run's output, one per line: "STEP LAYER KIND"
warnings() { sed -nE 's/^warning: step ([0-9]+) layer ([0-9]+): (median|[0-9]+ dead).*/\1 \2 \3/p' "$1"; }

echo "the alert rule in training (grace 30 steps, window 10, load_alert 5)"
"$moe" train "$work/collapse.cfg" > "$work/collapse.out" 2>&1
rc=$?
warnings "$work/collapse.out" | head -3
check "a collapsing router (8.00x from step 1) runs on with warn (exit $rc)" "[ $rc -eq 0 ]"
check "nothing fires during the grace and while the window fills (steps 1-39)" \
  "[ \"\$(warnings '$work/collapse.out' | awk '\$1 < 40' | wc -l)\" -eq 0 ]"
check "it fires at step 40 = alert_after + alert_window, naming the window, the median, the setting" \
  "grep -q 'warning: step 40 layer 0: median max/mean load 8.00 over steps 31-40, hottest expert [0-9] (log.load_alert = 5.00; 1 step in alert since the last report)' '$work/collapse.out'"
check "and reports the dead experts of the window" \
  "grep -Eq 'warning: step 40 layer 0: [1-7] dead experts? \(no token in steps 31-40\):( [0-7])+ \(1 step in alert' '$work/collapse.out'"
"$moe" train "$work/collapse.cfg" --set 'train.load_alert_action="stop"' --set "log.dir=\"$work/run_stop\"" \
  > "$work/stop.out" 2>&1
rc=$?
tail -1 "$work/stop.out"
check "load_alert_action = \"stop\" stops at step 40 (exit $rc), naming the rule's settings" \
  "[ $rc -eq 1 ] && grep -q 'stopping at step 40: layer 0: median max/mean load 8.00 over steps 31-40, hottest expert [0-9] (log.load_alert = 5.00, log.alert_window = 10, log.alert_after = 30, train.load_alert_action = \"stop\")' '$work/stop.out'"

echo "synthetic overloads on a healthy run (random bytes)"
MOE_TEST_LOAD_MOM="1-30:10,33-36:10" "$moe" train "$work/random.cfg" --set "log.dir=\"$work/run_spike\"" \
  > "$work/spike.out" 2>&1
rc=$?
warnings "$work/spike.out" | head -3
check "10x during the grace and a 4-step spike after it: no warning (exit $rc)" \
  "[ $rc -eq 0 ] && [ \"\$(warnings '$work/spike.out' | wc -l)\" -eq 0 ]"
MOE_TEST_LOAD_MOM="31-40:10" "$moe" train "$work/random.cfg" --set "log.dir=\"$work/run_sustained\"" \
  --set log.alert_after=20 --set log.interval=40 > "$work/sustained.out" 2>&1
rc=$?
warnings "$work/sustained.out"
check "grace 20: a sustained 10x from step 31 fires once half the window is above (steps 35-40)" \
  "[ $rc -eq 0 ] && [ \"\$(warnings '$work/sustained.out')\" = '36 0 median' ] &&
   grep -q 'warning: step 36 layer 0: median max/mean load 10.00 over steps 27-36, hottest expert [0-7] (log.load_alert = 5.00; 6 steps in alert since the last report)' '$work/sustained.out'"
MOE_TEST_LOAD_MOM="31-40:10" "$moe" train "$work/random.cfg" --set "log.dir=\"$work/run_sustained_stop\"" \
  --set log.alert_after=20 --set 'train.load_alert_action="stop"' > "$work/sustained_stop.out" 2>&1
rc=$?
check "with stop it ends at step 35 (exit $rc)" \
  "[ $rc -eq 1 ] && grep -q 'stopping at step 35: layer 0: median max/mean load [0-9.]* over steps 26-35' '$work/sustained_stop.out'"

echo "moe smoke: the shipped configs pass"
cd "$src" || exit 1
"$moe" smoke configs/default.cfg --set "data.dir=\"$work/data_repo\"" --set "log.dir=\"$work/smoke_default\"" \
  > "$work/smoke_default.out" 2>&1
rc=$?
grep -E '^smoke:|note:' "$work/smoke_default.out"
check "configs/default.cfg: exit 0 (got $rc) and a one-line verdict" \
  "[ $rc -eq 0 ] && [ \$(grep -c '^smoke: ' '$work/smoke_default.out') -eq 1 ] && grep -q '^smoke: PASS: 10 steps' '$work/smoke_default.out'"
shakespeare="$src/../shared/data/tinyshakespeare.txt"
if [ -f "$shakespeare" ]; then
  "$moe" smoke configs/shakespeare.cfg --set "data.text=[\"$shakespeare\"]" --set "data.dir=\"$work/data_shakespeare\"" \
    --set "log.dir=\"$work/smoke_shakespeare\"" > "$work/smoke_shakespeare.out" 2>&1
  rc=$?
  grep -E '^smoke:|note:' "$work/smoke_shakespeare.out"
  check "configs/shakespeare.cfg: exit 0 (got $rc)" \
    "[ $rc -eq 0 ] && grep -q '^smoke: PASS: 10 steps' '$work/smoke_shakespeare.out'"
else
  echo "  skip  configs/shakespeare.cfg: no $shakespeare"
fi
cd "$work" || exit 1

echo "moe smoke: broken configs fail, saying which check and why"
smoke_case() { # NAME CONFIG CHECKS VERDICT_PATTERN FAIL_PATTERN [--set ...]
  local name=$1 cfg=$2 checks=$3 line=$4
  shift 4
  "$moe" smoke "$work/$cfg.cfg" --set "log.dir=\"$work/smoke_$name\"" "$@" > "$work/smoke_$name.out" 2>&1
  local rc=$?
  grep -E '^smoke:' "$work/smoke_$name.out"
  check "$name: exit 1 (got $rc), verdict '$checks'" \
    "[ $rc -eq 1 ] && grep -qx 'smoke: FAILED (exit 1): $checks' '$work/smoke_$name.out'"
  check "$name: the failure says why" "grep -Eq '$line' '$work/smoke_$name.out'"
}
smoke_case collapse collapse "collapse, dead experts" \
  '^smoke: FAIL collapse: layer 0: on every one of the 10 steps one expert received >= 100.0% of the tokens \(8.00x the mean load; collapse: >= 95%\)'
smoke_case nan_init random "finite" \
  '^smoke: FAIL finite: 10 steps skipped for a non-finite loss or gradient; stopping at step 10' --set model.init_std=1e30
smoke_case big_logits random "logits" \
  '^smoke: FAIL logits: layer [01]: max \|router logit\| [0-9.e+]+ on the last step exceeds 50' --set model.init_std=20.0
smoke_case dead abc "dead experts" \
  '^smoke: FAIL dead experts: layer 0: [1-7] dead experts? \(no token in any of the 10 steps\):( [0-7])+ while capacity_factor 1.25 dropped'
smoke_case load_rule collapse "collapse, dead experts, load alert" \
  '^smoke: FAIL load alert: stopping at step 15: layer 0: median max/mean load 8.00 over steps 6-15' \
  --steps 20 --set log.alert_after=5
"$moe" smoke "$work/abc.cfg" --set "log.dir=\"$work/smoke_dropless\"" --set model.capacity_factor=0.0 \
  > "$work/smoke_dropless.out" 2>&1
rc=$?
check "dead experts in a dropless config are a note, not a failure (exit $rc)" \
  "[ $rc -eq 0 ] && grep -q 'note: [1-7] dead experts\\? (no token in any step)' '$work/smoke_dropless.out'"
[ $fail -eq 0 ] && echo "alerts: all passed" || echo "alerts: FAILED"
exit $fail
