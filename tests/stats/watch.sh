#!/usr/bin/env bash
# moe stats --watch on a live run: a training of 1500 tiny steps in the background, watched
# every 0.2 s. Passes when the watch saw the run at several steps, ended by itself (exit 0)
# once the run logged its last step, and its last refresh shows step 1500/1500 and the report.
#   watch.sh MOE WORKDIR
set -u
moe=$1 work=$2
rm -rf "$work" && mkdir -p "$work"
python3 -c "
import random; random.seed(1)
open('$work/text.txt', 'w').write(''.join(random.choice('abcdefgh ijkl,.\n') for _ in range(40000)))"
cat > "$work/w.cfg" <<CFG
model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; d_ff = 24; n_experts = 8;
          top_k = 2; max_seq_len = 32; capacity_factor = 1.0; };
train = { steps = 1500; batch_size = 2; seq_len = 32; warmup_steps = 0; eval_interval = 0;
          threads = 1; };
data = { dir = "$work/data"; text = ["$work/text.txt"]; };
log = { dir = "$work/run"; interval = 100; };
checkpoint = { interval = 0; };
CFG
"$moe" train "$work/w.cfg" > "$work/train.log" 2>&1 &
pid=$!
timeout 120 "$moe" stats "$work/run" --watch --interval 0.2 > "$work/watch.log" 2>&1
rc=$?
wait $pid
trc=$?
heads=$(grep -c '^moe stats --watch' "$work/watch.log")
distinct=$(grep '^moe stats --watch' "$work/watch.log" | sed 's/.*step \([0-9]*\)\/.*/\1/' | sort -u | wc -l)
last=$(grep '^moe stats --watch' "$work/watch.log" | tail -1)
echo "watch exit $rc, train exit $trc, $heads refreshes at $distinct different steps; last: $last"
tail -n +2 "$work/watch.log" | tail -8
[ $rc -eq 0 ] && [ $trc -eq 0 ] && [ "$distinct" -ge 2 ] &&
  echo "$last" | grep -q 'step 1500/1500' &&
  awk '/^moe stats --watch/ {buf = ""} {buf = buf $0 "\n"} END {printf "%s", buf}' "$work/watch.log" |
  grep -q 'steps 1..1500'
