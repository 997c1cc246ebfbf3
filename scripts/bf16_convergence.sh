#!/usr/bin/env bash
# bf16 vs fp32 convergence (docs/bf16.md): trains configs/shakespeare.cfg for STEPS steps
# (default 300; warmup 30, cosine to the end, validation at the end over 16 batches) once with
# train.dtype = "fp32" and once with "bf16", same seed and data, and checks that bf16's final
# validation loss is within 2% of fp32's. Prints both losses, the relative difference and the
# wall time of each run; exit 1 when the bound fails.
#   scripts/bf16_convergence.sh [BUILD_DIR=build] [STEPS=300] [OUT=runs/bf16_convergence]
# DTYPES="bf16" reruns only that one and compares with the fp32 run already in OUT.
# Not a ctest: two 300-step runs take 10-40 minutes on 2 shared cores.
set -euo pipefail
BUILD=${1:-build}
STEPS=${2:-300}
OUT=${3:-runs/bf16_convergence}
MOE="$BUILD/moe"
[ -x "$MOE" ] || { echo "no $MOE: build first (cmake --build $BUILD)" >&2; exit 2; }
mkdir -p "$OUT"
val_of() {
  python3 - "$1" <<'PY'
import json, sys
v = [json.loads(l)["val_loss"] for l in open(sys.argv[1]) if '"val_loss"' in l]
print(f"{v[-1]:.6f}")
PY
}
declare -A VAL SECS
for dt in ${DTYPES:-fp32 bf16}; do
  rm -rf "$OUT/$dt"
  t0=$(date +%s.%N)
  "$MOE" train configs/shakespeare.cfg --set train.steps="$STEPS" \
    --set train.warmup_steps=$((STEPS / 10)) --set train.eval_interval="$STEPS" \
    --set train.dtype="\"$dt\"" --set log.dir="\"$OUT/$dt\"" --set log.interval=50 \
    > "$OUT/$dt.log" 2>&1 || { echo "$dt run failed: $OUT/$dt.log" >&2; tail -5 "$OUT/$dt.log" >&2; exit 1; }
  t1=$(date +%s.%N)
  SECS[$dt]=$(python3 -c "print(f'{$t1 - $t0:.0f}')")
  echo "$dt: val_loss $(val_of "$OUT/$dt/metrics.jsonl") after $STEPS steps (${SECS[$dt]} s)"
done
for dt in fp32 bf16; do VAL[$dt]=$(val_of "$OUT/$dt/metrics.jsonl"); done
python3 - "${VAL[fp32]}" "${VAL[bf16]}" <<'PY'
import sys
f, b = map(float, sys.argv[1:])
rel = (b - f) / f
print(f"bf16 - fp32: {rel * 100:+.2f}% of fp32 (bound: within 2%)")
sys.exit(0 if abs(rel) <= 0.02 else 1)
PY
