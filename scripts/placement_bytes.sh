#!/usr/bin/env bash
# Exchange bytes per token and the hottest rank's load, default placement against the
# `moe stats --placement R` proposal (parallel.expert_placement), on configs/shakespeare.cfg.
#
#   scripts/placement_bytes.sh [MOE] [OUT_DIR]    (RANKS="2 4" STEPS=30 by default)
#
# Per R: a default-placement run of STEPS steps with each exchange (parallel.exchange "rows":
# one row per assignment; "dedup", the default: one per token and destination rank); the
# proposal planned from the dedup run's first half (steps 1 .. STEPS/2, a copy of the run with
# those records only); a dedup run with the proposal.
# Reported over the second half (the steps the proposal did not see) and over all steps:
# exchange_bytes / tokens (expert_load.jsonl, forward + backward, per layer) and the hottest
# rank's received rows over the mean (max_r received_rows_r / mean), mean and P99 over the
# (step, layer) records.
set -euo pipefail
MOE=${1:-build/moe}
OUT=${2:-runs/placement_bytes}
RANKS=${RANKS:-2 4}
STEPS=${STEPS:-30}
TEXT=${TEXT:-/work/shared/data/tinyshakespeare.txt}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
mkdir -p "$OUT"
train() { # R NAME [--set ...]
    local R=$1 name=$2
    shift 2
    grep -q '^done:' "$OUT/$name.log" 2>/dev/null && return 0 # finished before: kept
    mpirun --oversubscribe --bind-to none -x OMP_NUM_THREADS=1 -np "$R" "$MOE" train \
        configs/shakespeare.cfg --overwrite --set "data.text=[\"$TEXT\"]" \
        --set "data.dir=\"$OUT/data\"" --set "log.dir=\"$OUT/$name\"" --set train.steps="$STEPS" \
        --set train.warmup_steps=$((STEPS / 3)) --set train.eval_interval=0 --set log.interval=1 \
        --set train.threads=1 --set checkpoint.interval=0 "$@" >"$OUT/$name.log"
}
for R in $RANKS; do
    train "$R" "r${R}_rows" --set 'parallel.exchange="rows"'
    train "$R" "r${R}_default"
    half="$OUT/r${R}_first_half"
    rm -rf "$half" && mkdir -p "$half"
    cp "$OUT/r${R}_default/config.cfg" "$half/"
    /usr/bin/python3 -c "
import json, sys
for l in open(sys.argv[1]):
    if json.loads(l)['step'] <= int(sys.argv[2]): sys.stdout.write(l)
" "$OUT/r${R}_default/expert_load.jsonl" $((STEPS / 2)) >"$half/expert_load.jsonl"
    "$MOE" stats "$half" --placement "$R" | tee "$OUT/r${R}_proposal.txt"
    key=$("$MOE" stats "$half" --placement "$R" --json |
        /usr/bin/python3 -c "import json, sys; print(json.load(sys.stdin)['expert_placement'])")
    train "$R" "r${R}_placed" --set "parallel.expert_placement=$key"
    /usr/bin/python3 - "$OUT" "$R" "$STEPS" "$key" <<'EOF'
import json, sys
import numpy as np
out, R, steps, key = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
for name in ("rows", "default", "placed"):
    recs = [json.loads(l) for l in open("%s/r%d_%s/expert_load.jsonl" % (out, R, name))]
    for what, sel in (("steps %d-%d" % (steps // 2 + 1, steps), [r for r in recs if r["step"] > steps // 2]),
                      ("all %d steps" % steps, recs)):
        bpt = sum(r["exchange_bytes"] for r in sel) / sum(r["tokens"] for r in sel)
        hot = np.array([max(r["received_rows"]) / np.mean(r["received_rows"]) for r in sel])
        print("R=%d %-8s %-12s exchange bytes/token/layer %8.1f  hottest rank load mean %.3f P99 %.3f  %s, %s" %
              (R, name, what, bpt, hot.mean(), np.percentile(hot, 99), key if name == "placed" else "contiguous",
               "rows" if name == "rows" else "dedup"))
EOF
done
