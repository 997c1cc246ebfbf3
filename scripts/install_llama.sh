#!/usr/bin/env bash
# Installs llama-cpp-python (which builds llama.cpp from its source distribution) with numpy
# into a venv outside the repository, for the llama.cpp part of the GGUF check
# (tests/checkpoint/gguf_check.py; without it that part reports itself skipped):
#
#   scripts/install_llama.sh          # -> /opt/moe-llama/bin/python (or $MOE_LLAMA_VENV)
#
# The build takes 10-20 minutes on 2 cores, so scripts/test.sh runs this only when asked
# (MOE_INSTALL_LLAMA=1); bounded by `timeout 2400`, idempotent (nothing happens when the venv
# imports llama_cpp), the pip log in $VENV.log. Always exits 0.
set -u
VENV=${MOE_LLAMA_VENV:-/opt/moe-llama}
skip() { echo "install_llama.sh: $* -- the llama.cpp part of export_gguf will be skipped"; exit 0; }
[ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import llama_cpp, numpy' >/dev/null 2>&1 && exit 0
PY=$(command -v python3) || skip "no python3"
command -v cmake >/dev/null && command -v c++ >/dev/null || skip "no cmake or C++ compiler"
mkdir -p "$(dirname "$VENV")" 2>/dev/null && [ -w "$(dirname "$VENV")" ] ||
  skip "cannot write $(dirname "$VENV") (set MOE_LLAMA_VENV)"
echo "install_llama.sh: building llama-cpp-python into $VENV (10-20 minutes; log: $VENV.log)"
rm -rf "$VENV"
if ! CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 2400 bash -c 'set -e; "$1" -m venv "$2";
      "$2/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-cache-dir \
      --timeout 60 --retries 2 llama-cpp-python numpy' _ "$PY" "$VENV" >"$VENV.log" 2>&1; then
  rm -rf "$VENV"
  skip "install failed or timed out (see $VENV.log)"
fi
echo "install_llama.sh: done: llama-cpp-python $("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)')"
exit 0
