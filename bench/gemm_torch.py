"""PyTorch's own GEMM rate on bench_blas's shapes (the PyTorch column of scripts/bench_blas).

Reads the shapes bench_blas prints (--shapes) on stdin and times torch.matmul on each, fp32
and bf16 (bf16 inputs and output, what torch.autocast runs), median of --reps after 2 warm-ups,
torch.set_num_threads(--threads). One JSON line per group, as bench_blas prints them, then
{"lib": "torch", ...} with the version and the BLAS torch reports.
"""
import argparse
import json
import statistics
import sys
import time
from collections import OrderedDict

import torch


def time_mm(a, b, reps):
    t = []
    for r in range(reps + 2):
        t0 = time.perf_counter()
        torch.matmul(a, b)
        if r >= 2:
            t.append(time.perf_counter() - t0)
    return statistics.median(t)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--no-bf16", action="store_true",
                    help="fp32 only (CPUs without bf16 instructions emulate it at ~2 GFLOP/s)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    groups = OrderedDict()
    for line in sys.stdin:
        s = json.loads(line)
        groups.setdefault(s["group"], []).append(s)
    for g, shapes in groups.items():
        flops, t = 0.0, {torch.float32: 0.0}
        if not args.no_bf16:
            t[torch.bfloat16] = 0.0
        for s in shapes:
            m, n, k = s["m"], s["n"], s["k"]
            flops += 2.0 * m * n * k * s["times"]
            for dt in t:
                a = torch.randn(k, m) if s["ta"] else torch.randn(m, k)
                b = torch.randn(n, k) if s["tb"] else torch.randn(k, n)
                a, b = a.to(dt), b.to(dt)
                t[dt] += s["times"] * time_mm(a.t() if s["ta"] else a, b.t() if s["tb"] else b, args.reps)
        print(json.dumps({"group": g, "fp32_gflops": round(flops / t[torch.float32] * 1e-9, 2),
                          "bf16_gflops": round(flops / t[torch.bfloat16] * 1e-9, 2) if not args.no_bf16
                          else None}))
    cfg = torch.__config__.show()
    blas = "MKL" if "USE_MKL=ON" in cfg else ("OpenBLAS" if "openblas" in cfg.lower() else "?")
    isa = torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "?"
    print(json.dumps({"lib": "torch", "path": torch.__file__, "threads": args.threads,
                      "kernel": "torch %s, %s, %s" % (torch.__version__, blas, isa), "bf16": True}))


if __name__ == "__main__":
    main()
