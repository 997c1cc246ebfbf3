#!/usr/bin/env bash
# The inference commands on hostile folders, through the real binary: exit codes and memory.
#   inference_cli.sh MOE_BINARY WORKDIR
# - generate sizes its KV cache for the prompt plus -n tokens: a config.json that says
#   max_position_embeddings = 2^20 (legal) does not make it allocate gigabytes (checked under
#   a 1 GiB address-space limit; before the fix this model asked for 2 GiB of KV cache);
# - eval, generate and export of a damaged moe.c checkpoint exit non-zero naming the file;
# - eval of a checkpoint whose final norm weight is 1e30 (CRC32 updated, so it loads) exits 1:
#   its loss (~1e29) has no finite perplexity (it printed "ppl inf" and exited 0).
set -u
moe=$1 work=$2
# shellcheck source=../lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/../lib.sh"
new_workdir "$work"

random_text "$work/text.txt" 2 20000 'abcdefgh ,.'
tiny_cfg "$work/tiny.cfg" model.d_model=64 model.n_layers=4 model.n_kv_heads=4 model.d_ff=32 \
  model.capacity_factor= train.steps=2 train.eval_interval= train.eval_batches=1 \
  log.interval=100 checkpoint.interval= checkpoint.keep=
"$moe" train "$work/tiny.cfg" > "$work/train.out" 2>&1 || { cat "$work/train.out"; exit 1; }
ckpt="$work/run/ckpt/latest"
"$moe" export --ckpt "$ckpt" --out "$work/hf" > /dev/null || exit 1
python3 - "$work/hf/config.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1])); c["max_position_embeddings"] = 1 << 20
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY

echo "generate: the KV cache is sized for the prompt plus -n, not max_position_embeddings"
if ldd "$moe" 2>/dev/null | grep -q libasan; then
  echo "  skip  (AddressSanitizer build: an address-space limit does not apply)"
else
  # 1 GiB beyond the address space the CUDA libraries take when the build links them (their
  # files are mapped whole: cuBLAS is ~600 MB), so the limit tests the KV cache either way
  extra=0
  for lib in $(ldd "$moe" 2>/dev/null | awk '/libcublas|libcudart/ {print $3}'); do
    extra=$((extra + $(stat -Lc %s "$lib") / 1024))
  done
  ( ulimit -v $((1048576 + extra)); "$moe" generate --ckpt "$work/hf" --prompt "abc" -n 8 --temperature 0 ) \
    > "$work/gen.out" 2>&1
  rc=$?
  check "generate under a 1 GiB address-space limit succeeds (rc $rc)" "[ $rc -eq 0 ]"
  [ $rc -eq 0 ] || tail -3 "$work/gen.out"
fi

echo "a damaged checkpoint: eval, generate and export exit 1 naming the shard"
cp -r "$work/run/ckpt/step_00000002" "$work/damaged_step" 2>/dev/null
mkdir -p "$work/dmg" && mv "$work/damaged_step" "$work/dmg/step_00000002"
shard=$(ls "$work/dmg/step_00000002"/model-0000*.safetensors | head -1)
python3 - "$shard" <<'PY'
import sys
p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[-5] ^= 0x10; open(p, "wb").write(b)
PY
"$moe" prepare --text "$work/text.txt" --out "$work/tok" > /dev/null
for cmd in "eval --data $work/tok/val.bin --seq-len 16" "generate --prompt abc -n 4" "export --out $work/never"; do
  "$moe" ${cmd%% *} --ckpt "$work/dmg/step_00000002" ${cmd#* } > "$work/dmg.out" 2>&1
  rc=$?
  check "${cmd%% *}: exit 1 and 'CRC32 mismatch' (rc $rc)" \
    "[ $rc -eq 1 ] && grep -q 'CRC32 mismatch' '$work/dmg.out' && grep -q '$(basename "$shard")' '$work/dmg.out'"
done
check "export wrote nothing" "[ ! -e '$work/never' ]"

echo "a checkpoint whose model.norm.weight is 1e30, CRC32 updated: eval exits 1"
mkdir -p "$work/norm" && cp -r "$work/run/ckpt/step_00000002" "$work/norm/"
python3 - "$work/norm/step_00000002" <<'PY'
import json, os, struct, sys, zlib
d = sys.argv[1]
index = json.load(open(os.path.join(d, "model.safetensors.index.json")))
shard = os.path.join(d, index["weight_map"]["model.norm.weight"])
b = bytearray(open(shard, "rb").read())
n = struct.unpack_from("<Q", b, 0)[0]
begin, end = json.loads(b[8:8 + n])["model.norm.weight"]["data_offsets"]
for at in range(8 + n + begin, 8 + n + end, 4):
    struct.pack_into("<f", b, at, 1e30)
open(shard, "wb").write(b)
state_path = os.path.join(d, "trainer_state.json")
state = json.load(open(state_path))
state["crc32"][os.path.basename(shard)] = "%08x" % zlib.crc32(bytes(b))
json.dump(state, open(state_path, "w"), indent=1)
PY
"$moe" eval --ckpt "$work/norm/step_00000002" --data "$work/tok/val.bin" --seq-len 16 \
  > "$work/norm.out" 2>&1
rc=$?
check "eval: exit 1, 'perplexity overflows', the largest weight named (rc $rc)" \
  "[ $rc -eq 1 ] && grep -q 'perplexity overflows' '$work/norm.out' &&
   grep -qF 'largest |w|: 1e+30 in model.norm.weight' '$work/norm.out'"
[ $rc -eq 1 ] && grep -q 'perplexity overflows' "$work/norm.out" || tail -3 "$work/norm.out"
[ $fail -eq 0 ] && rm -rf "$work"
exit $fail
