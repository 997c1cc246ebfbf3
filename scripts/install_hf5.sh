#!/usr/bin/env bash
# Installs the LATEST transformers 5.x with PyTorch 2.x from PyPI into a venv, for the second run
# of the Hugging Face compatibility check (scripts/check_hf.py against what users run today;
# scripts/install_hf.sh keeps the transformers 4.40 + Debian torch 1.13 run):
#
#   scripts/install_hf5.sh            # -> /opt/moe-hf5/bin/python (or $MOE_HF5_VENV/bin/python)
#
# PyPI's torch wheels pull the CUDA libraries: about 6 GB on disk, 3-4 minutes here. So the
# install is skipped (one line says why; check_hf then reports itself skipped, exit 77) only
# when PyPI is unreachable or the disk has less than 10 GB free; otherwise it runs, bounded by
# `timeout 900`. Idempotent: nothing happens when the venv already imports transformers 5 and
# torch 2. The pip log is kept in $VENV.log. Always exits 0.
set -u

VENV=${MOE_HF5_VENV:-/opt/moe-hf5}
SPEC=${MOE_HF5_SPEC:-"transformers>=5,<6 torch>=2,<3 tokenizers safetensors numpy tensorboardX pillow"}
PROBE='import torch, numpy, safetensors, tokenizers, transformers, tensorboardX, PIL
from transformers import MixtralConfig, MixtralForCausalLM
assert transformers.__version__.split(".")[0] == "5" and torch.__version__.split(".")[0] == "2"'

ok() { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "$PROBE" >/dev/null 2>&1; }
# moe serve's test clients (tests/serve/serve_openai.py): the openai package and the
# Prometheus parser, and the gguf package (export_gguf's independent GGUF reader), small,
# added to a venv that has the rest
clients() {
  "$VENV/bin/python" -c 'import openai, prometheus_client, gguf' >/dev/null 2>&1 && return 0
  timeout 300 "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q \
    --timeout 60 --retries 2 openai prometheus-client gguf >>"$VENV.log" 2>&1 ||
    echo "install_hf5.sh: openai/prometheus-client/gguf not installed (see $VENV.log): moe serve's client test and export_gguf will be skipped"
  return 0
}
skip() { echo "install_hf5.sh: $* -- the transformers 5.x checks will be skipped"; exit 0; }
ok && { clients; exit 0; }

PY=$(command -v python3) || skip "no python3"
"$PY" -c 'import venv, ensurepip' >/dev/null 2>&1 || skip "$PY has no venv/ensurepip"
mkdir -p "$(dirname "$VENV")" 2>/dev/null && [ -w "$(dirname "$VENV")" ] ||
  skip "cannot write $(dirname "$VENV") (set MOE_HF5_VENV)"
free_kb=$(df -Pk "$(dirname "$VENV")" | awk 'NR == 2 {print $4}')
[ "${free_kb:-0}" -ge $((10 * 1024 * 1024)) ] || skip "less than 10 GB free on $(dirname "$VENV")"
"$PY" - <<'PY' >/dev/null 2>&1 || skip "PyPI is unreachable"
import urllib.request
urllib.request.urlopen("https://pypi.org/simple/transformers/", timeout=15).read(1)
PY

LOG="$VENV.log"
exec 9>"$VENV.lock" || skip "cannot create $VENV.lock"
flock -w 920 9 || skip "another install_hf5.sh holds $VENV.lock"
ok && { clients; exit 0; }
echo "install_hf5.sh: installing $SPEC into $VENV (log: $LOG)"
rm -rf "$VENV"
# shellcheck disable=SC2086
if ! timeout 900 bash -c 'set -e; "$1" -m venv "$2"; "$2/bin/python" -m pip install \
      --disable-pip-version-check --no-input -q --timeout 60 --retries 2 $3' \
      _ "$PY" "$VENV" "$SPEC" >"$LOG" 2>&1; then
  rm -rf "$VENV"
  skip "install failed or timed out (see $LOG)"
fi
ok || { "$VENV/bin/python" -c "$PROBE" >>"$LOG" 2>&1; rm -rf "$VENV"; skip "installed, but the import check failed (see $LOG)"; }
echo "install_hf5.sh: done: $("$VENV/bin/python" -c 'import torch, transformers; print("transformers", transformers.__version__, "torch", torch.__version__)')"
clients
exit 0
