#!/usr/bin/env python3
"""The memory plan holds: the dry run's "peak memory per rank, predicted" is within 10% of the
peak RSS the run then measures (getrusage, the "done:" line), for each train.recompute mode,
in fp32 and bf16, and the prediction falls with recompute.

  memory_plan.py MOE [MPIRUN_ARGS...] -- WORKDIR

A model big enough that its buffers outweigh the process (d 192, 8 experts of 384, 4 layers,
8 x 128 tokens: about 150 MiB), 2 steps, the end's validation and checkpoint. With MPI, also
2 ranks of expert parallelism with the sharded optimizer: rank 0's measured peak lies between
the dry run's figure at balanced routing and the one at the worst routing (what the expert
buffers are allocated for), each with the 10% margin.
"""
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work, mpi_args  # noqa: E402

CFG = """model = {{ vocab_size = 256; d_model = 192; n_layers = 4; n_heads = 6; n_kv_heads = 2;
          d_ff = 384; n_experts = 8; top_k = 2; max_seq_len = 128; capacity_factor = 1.25; }};
train = {{ steps = 2; batch_size = 8; seq_len = 128; warmup_steps = 0; lr = 1e-3; min_lr = 0.0;
          eval_interval = 0; eval_batches = 1; recompute = "{mode}"; dtype = "{dtype}"; }};
data = {{ dir = "{work}/data"; text = ["{work}/text.txt"]; }};
log = {{ dir = "{work}/run_{name}"; interval = 1; }};
{parallel}
"""
UNIT = {"KiB": 1 / 1024, "MiB": 1, "GiB": 1024}


def mib(text, pattern):
    m = re.search(pattern + r" ([\d.]+) (KiB|MiB|GiB)", text.replace("\n  ", " "))
    return float(m.group(1)) * UNIT[m.group(2)] if m else None


def main():
    moe, mpirun, work = mpi_args()
    fresh_work(work, seed=3, chars=60000)
    report = Report()
    for dtype in ("fp32", "bf16"):
        preds = []
        for mode in ("none", "moe", "layer"):
            path = os.path.join(work, "%s_%s.cfg" % (mode, dtype))
            with open(path, "w") as f:
                f.write(CFG.format(mode=mode, dtype=dtype, work=work, name=mode + "_" + dtype, parallel=""))
            run = subprocess.run([moe, "train", path], capture_output=True, text=True, timeout=300)
            # after the run, so that the token files exist and are counted as the run read them
            dry = subprocess.run([moe, "train", path, "--dry-run"], capture_output=True, text=True, timeout=120)
            pred, meas = mib(dry.stdout, "peak memory per rank, predicted:"), mib(run.stdout, "peak RSS")
            ok = run.returncode == 0 and pred and meas and abs(pred / meas - 1) <= 0.10
            report(ok, "%s recompute %s: predicted %s MiB, measured %s MiB (rc %d)%s"
                   % (dtype, mode, pred, meas, run.returncode, "" if ok else (run.stdout + run.stderr)[-600:]))
            preds.append(pred or 0)
        report(preds[0] > preds[1] > preds[2], "%s: the prediction falls none > moe > layer %s" % (dtype, preds))
    if not mpirun:
        print("  skip  2 ranks: no MPI")
        report.exit()
    path = os.path.join(work, "ep_fp32.cfg")
    with open(path, "w") as f:
        f.write(CFG.format(mode="none", dtype="fp32", work=work, name="ep",
                           parallel="parallel = { ep_size = 2; shard_optimizer = true; };"))
    run = subprocess.run(mpirun + ["-np", "2", moe, "train", path], capture_output=True, text=True, timeout=300)
    dry = subprocess.run(mpirun + ["-np", "2", moe, "train", path, "--dry-run"], capture_output=True, text=True,
                         timeout=120)
    worst = mib(dry.stdout, "peak memory per rank, predicted:")
    balanced = mib(dry.stdout, "at balanced routing, T k rows a rank:")
    meas = mib(run.stdout, "peak RSS")
    ok = run.returncode == 0 and worst and balanced and meas and 0.9 * balanced <= meas <= 1.1 * worst
    report(ok, "2 ranks, ep_size 2, sharded: measured %s MiB within [%s balanced, %s worst] MiB (+-10%%)%s"
           % (meas, balanced, worst, "" if ok else (run.stdout + run.stderr)[-600:] + dry.stdout[-600:]))
    report.exit()


if __name__ == "__main__":
    main()
