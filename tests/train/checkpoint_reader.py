"""Shared by the expert-parallel tests (ep_parity.py, placement.py, zero.py): a checkpoint's tensors,
a run's losses, and the relative difference they are compared by. Needs numpy: without it
(python3-numpy is optional, scripts/test.sh) importing this exits 77, ctest's skip."""
import json
import os
import struct
import sys

try:
    import numpy as np
except ImportError:
    print(f"{os.path.basename(sys.argv[0])}: numpy is not installed: skipped")
    sys.exit(77)


def read_st(folder, moments=False):
    """All tensors of the safetensors files of folder by name, float64: the model's, or with
    moments=True the AdamW moment files' (named "exp_avg:NAME" and "exp_avg_sq:NAME")."""
    out = {}
    for f in sorted(os.listdir(folder)):
        if not f.endswith(".safetensors") or f.startswith("optimizer") != moments:
            continue
        prefix = f.split("-0")[0].replace("optimizer-", "") + ":" if moments else ""
        with open(os.path.join(folder, f), "rb") as fh:
            n = struct.unpack("<Q", fh.read(8))[0]
            hdr = json.loads(fh.read(n))
            data = fh.read()
        for name, t in hdr.items():
            if name != "__metadata__":
                a, b = t["data_offsets"]
                out[prefix + name] = np.frombuffer(data[a:b], dtype=np.float32).astype(np.float64)
    return out


def losses(run):
    """The loss of every step of run's metrics.jsonl."""
    return [json.loads(l)["loss"] for l in open(os.path.join(run, "metrics.jsonl"))]


def rel(a, b):
    """|a - b| / |b| (|a - b| when b is zero)."""
    n = np.linalg.norm(b)
    return float(np.linalg.norm(a - b) / n) if n > 0 else float(np.linalg.norm(a - b))
