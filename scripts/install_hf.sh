#!/usr/bin/env bash
# Installs Hugging Face transformers for the compatibility check (scripts/check_hf.py) into a
# venv that reuses the system's Debian torch 1.13 (python3-torch) and numpy:
#
#   scripts/install_hf.sh            # -> /opt/moe-hf/bin/python (or $MOE_HF_VENV/bin/python)
#
# transformers 4.40.2 is the pin: it has MixtralForCausalLM (added in 4.36) and still runs on
# torch 1.13 (5.x needs torch >= 2). Everything is installed with --no-deps and exact pins, so
# pip never pulls a torch or a numpy of its own; torch stays Debian's.
#
# Idempotent (does nothing when the venv already imports transformers), quiet, bounded in time
# (pip --timeout 30, the whole install under `timeout 300`), and it always exits 0: when the
# install fails it prints one line saying the HF checks will be skipped (check_hf.py then exits
# 77, CTest's skip code). The pip log is kept in $VENV.log.
set -u

VENV=${MOE_HF_VENV:-/opt/moe-hf}
PY=/usr/bin/python3
PKGS=(
  transformers==4.40.2 tokenizers==0.19.1 safetensors==0.4.3 huggingface_hub==0.23.4
  regex==2024.5.15 filelock==3.15.4 fsspec==2024.6.1 packaging==24.1 tqdm==4.66.4
)
PROBE='import torch, numpy, safetensors, transformers
from transformers import MixtralConfig, MixtralForCausalLM'

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$PROBE" >/dev/null 2>&1; then
  exit 0
fi

skip() { echo "install_hf.sh: $* -- HF checks will be skipped"; exit 0; }

[ -x "$PY" ] || skip "no $PY"
"$PY" -c 'import torch, numpy' >/dev/null 2>&1 ||
  skip "$PY cannot import torch/numpy (apt-get install python3-torch python3-numpy)"
"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 ||
  skip "$PY has no venv/ensurepip (apt-get install python3-venv)"
mkdir -p "$(dirname "$VENV")" 2>/dev/null && [ -w "$(dirname "$VENV")" ] ||
  skip "cannot write $(dirname "$VENV") (set MOE_HF_VENV)"

LOG="$VENV.log"
# one installer at a time (parallel ctest, two shells); the loser re-checks after the winner
exec 9>"$VENV.lock" || skip "cannot create $VENV.lock"
flock -w 320 9 || skip "another install_hf.sh holds $VENV.lock"
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$PROBE" >/dev/null 2>&1; then
  exit 0
fi

echo "install_hf.sh: installing transformers 4.40.2 into $VENV (log: $LOG)"
rm -rf "$VENV"
if ! timeout 300 bash -c '
  set -e
  "$1" -m venv --system-site-packages "$2"
  venv=$2
  shift 2
  "$venv/bin/python" -m pip install --disable-pip-version-check --no-input -q \
      --timeout 30 --retries 2 --only-binary=:all: --no-deps "$@"
' _ "$PY" "$VENV" "${PKGS[@]}" >"$LOG" 2>&1; then
  rm -rf "$VENV"
  skip "install failed or timed out (see $LOG)"
fi
# torch must still be Debian's 1.13 and Mixtral must import
if ! "$VENV/bin/python" -c "$PROBE
assert torch.__version__.startswith('1.13'), torch.__version__" >>"$LOG" 2>&1; then
  rm -rf "$VENV"
  skip "installed, but the import check failed (see $LOG)"
fi
echo "install_hf.sh: done: $("$VENV/bin/python" -c 'import torch, transformers; print("transformers", transformers.__version__, "torch", torch.__version__)')"
exit 0
