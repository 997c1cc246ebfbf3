#!/usr/bin/env bash
# Installs NVIDIA's cudnn-frontend headers (header-only C++, MIT licence), which the CUDA
# build's cuDNN attention (MOE_CUDNN, cuda/attention_cudnn.cpp) compiles against:
#
#   scripts/install_cudnn_frontend.sh     # -> /opt/cudnn-frontend/include (or $CUDNN_FRONTEND_PATH)
#
# The pinned release's headers, from PyPI's nvidia-cudnn-frontend wheel (its include/ folder,
# about 1 MB; nothing is installed into a Python) or else a shallow git clone of the tag, each
# bounded by `timeout 120`; nothing is built. Idempotent: nothing happens when the headers are
# there. CMake finds them there (or through CUDNN_FRONTEND_PATH) and turns MOE_CUDNN on where
# cuDNN's own headers (cudnn.h) are installed too; cuDNN's library is loaded at run time, by
# the runs that set model.attention = "cudnn". Skipped with one line when neither source can
# be reached. Always exits 0.
set -u
VERSION=${CUDNN_FRONTEND_VERSION:-1.23.0}
DEST=${CUDNN_FRONTEND_PATH:-/opt/cudnn-frontend}
[ -f "$DEST/include/cudnn_frontend.h" ] && exit 0
skip() { echo "install_cudnn_frontend.sh: $* -- the CUDA build goes without cuDNN attention"; exit 0; }
mkdir -p "$(dirname "$DEST")" 2> /dev/null && [ -w "$(dirname "$DEST")" ] ||
    skip "cannot write $(dirname "$DEST") (set CUDNN_FRONTEND_PATH)"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the wheel is a zip whatever its Python tag: any one of the release's wheels holds the headers
if timeout 120 python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.11 \
    --implementation cp --platform manylinux_2_28_x86_64 -d "$tmp" \
    "nvidia-cudnn-frontend==$VERSION" > "$tmp/log" 2>&1 &&
    python3 - "$tmp" <<'PY'
import glob, os, sys, zipfile
tmp = sys.argv[1]
with zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0]) as z:
    names = [n for n in z.namelist() if n.startswith("include/") and not n.endswith("/")]
    if not any(n == "include/cudnn_frontend.h" for n in names):
        sys.exit(1)
    for n in names:
        z.extract(n, os.path.join(tmp, "fe"))
PY
then
    src="$tmp/fe/include"
elif command -v git > /dev/null && timeout 120 git clone -q --depth 1 --branch "v$VERSION" \
    https://github.com/NVIDIA/cudnn-frontend.git "$tmp/git" >> "$tmp/log" 2>&1; then
    src="$tmp/git/include"
else
    skip "neither PyPI's nvidia-cudnn-frontend==$VERSION nor GitHub could be reached ($(tail -1 "$tmp/log"))"
fi
rm -rf "$DEST" && mkdir -p "$DEST" && cp -r "$src" "$DEST/include" || skip "cannot copy into $DEST"
echo "install_cudnn_frontend.sh: cudnn-frontend $VERSION headers in $DEST/include"
