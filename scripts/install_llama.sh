#!/usr/bin/env bash
# Installs llama-cpp-python (which builds llama.cpp from its source distribution) with numpy
# into a venv outside the repository, for the llama.cpp part of the GGUF check
# (tests/checkpoint/gguf_check.py; without it that part reports itself skipped), and builds
# llama.cpp's `llama-server` from the same llama-cpp-python version's source distribution
# into $VENV/bin/llama-server, for the llama-server column of scripts/bench_serve:
#
#   scripts/install_llama.sh          # -> /opt/moe-llama/bin/python and bin/llama-server
#                                     #    (or under $MOE_LLAMA_VENV)
#
# Each part takes 10-20 minutes on 2 cores, so scripts/test.sh runs this only when asked
# (MOE_INSTALL_LLAMA=1). Each part is bounded by `timeout 2400` and idempotent (the python
# part does nothing when the venv imports llama_cpp, the server part nothing when
# $VENV/bin/llama-server runs); the logs are $VENV.log and $VENV-server.log. The server's
# sdist is kept in $VENV-src (or $MOE_LLAMA_SRC); its build tree there is removed once
# installed. The server is built without network access at build time (no curl, no OpenSSL,
# no web UI download). Always exits 0.
set -u
VENV=${MOE_LLAMA_VENV:-/opt/moe-llama}
SRC=${MOE_LLAMA_SRC:-$VENV-src}
skip() { echo "install_llama.sh: $* -- the llama.cpp part of export_gguf will be skipped"; exit 0; }
skip_server() {
  echo "install_llama.sh: $* -- the llama-server column of scripts/bench_serve will be skipped"
  exit 0
}
if ! { [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c 'import llama_cpp, numpy' >/dev/null 2>&1; }; then
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
fi

# llama-server, from the installed llama-cpp-python version's sdist (vendor/llama.cpp).
SERVER=$VENV/bin/llama-server
[ -x "$SERVER" ] && "$SERVER" --version >/dev/null 2>&1 && exit 0
VER=$("$VENV/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null) ||
  skip_server "cannot read the llama-cpp-python version"
mkdir -p "$SRC" 2>/dev/null && [ -w "$SRC" ] || skip_server "cannot write $SRC (set MOE_LLAMA_SRC)"
echo "install_llama.sh: building llama-server $VER into $SERVER (10-20 minutes; log: $VENV-server.log)"
if ! CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout 2400 bash -c '
    set -ex; py=$1 ver=$2 src=$3 server=$4
    sdist=$src/llama_cpp_python-$ver.tar.gz
    if [ ! -f "$sdist" ]; then
      "$py" -m pip download --disable-pip-version-check --no-input -q --no-cache-dir \
        --timeout 60 --retries 2 --no-binary :all: --no-deps -d "$src" "llama-cpp-python==$ver"
    fi
    tree=$src/llama_cpp_python-$ver
    if [ ! -f "$tree/.extracted" ]; then
      rm -rf "$tree"; tar -xzf "$sdist" -C "$src"; touch "$tree/.extracted"
    fi
    cmake -S "$tree/vendor/llama.cpp" -B "$tree/build" -DCMAKE_BUILD_TYPE=Release \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF
    cmake --build "$tree/build" --target llama-server
    install -m 755 "$tree/build/bin/llama-server" "$server.tmp"
    "$server.tmp" --version
    mv "$server.tmp" "$server"
    rm -rf "$tree"' _ "$VENV/bin/python" "$VER" "$SRC" "$SERVER" >"$VENV-server.log" 2>&1; then
  rm -f "$SERVER.tmp"
  skip_server "llama-server build failed or timed out (see $VENV-server.log)"
fi
echo "install_llama.sh: done: $SERVER ($("$SERVER" --version 2>&1 | grep -m1 -i version))"
exit 0
