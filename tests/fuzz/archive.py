#!/usr/bin/env python3
"""Folder archives, the input format of the ckpt_folder fuzz target (archive.h).

    archive.py pack FOLDER OUT       # every regular file of FOLDER, sorted by name
    archive.py unpack ARCHIVE FOLDER # what the target would unpack (to look at a crash)
"""
import os
import re
import struct
import sys

MAX_FILES = 32  # ARCHIVE_MAX_FILES


def pack(folder, out):
    blob = bytearray()
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        raw = name.encode()
        assert len(raw) < 256, name
        data = open(path, "rb").read()
        blob += bytes([len(raw)]) + raw + struct.pack("<I", len(data)) + data
    open(out, "wb").write(bytes(blob))


def unpack(archive, folder):
    data = open(archive, "rb").read()
    os.makedirs(folder, exist_ok=True)
    at = files = 0
    while at < len(data) and files < MAX_FILES:
        n = data[at]
        at += 1
        name = re.sub(rb"[^A-Za-z0-9._-]", b"_", data[at:at + n]).decode()
        at += n
        size = int.from_bytes(data[at:at + 4], "little")  # short at the end: what is there
        at += min(4, len(data) - at)
        body = data[at:at + size]
        at += len(body)
        if name not in ("", ".", ".."):
            open(os.path.join(folder, name), "wb").write(body)
            files += 1
            print(f"{name}: {len(body)} bytes")


if __name__ == "__main__":
    if len(sys.argv) != 4 or sys.argv[1] not in ("pack", "unpack"):
        sys.exit(__doc__)
    (pack if sys.argv[1] == "pack" else unpack)(sys.argv[2], sys.argv[3])
