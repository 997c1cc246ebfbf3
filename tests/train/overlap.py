#!/usr/bin/env python3
"""The overlap of exchange and experts (parallel.overlap_chunks, docs/expert-parallelism.md):
each exchange in C chunks of each rank's experts, chunk i+1's rows travelling while the
experts compute chunk i, trains bit for bit as one exchange, for both exchanges (rows, dedup). Each case trains 4 steps under
mpirun with C = 1, 2, 3 (uneven chunks) and 4 and compares every step's logged loss, gradient
norm and load figures as text, each layer's exchange bytes, and the checkpoint's model and
AdamW moment files byte for byte.

  overlap.py MOE MPIRUN_ARGS... -- WORKDIR

Cases (2 ranks, 8 experts, 4 a rank): fp32 with capacity drops and router jitter, bf16,
fp32 with train.recompute = "moe", and an expert placement (each rank's chunks are groups of
its slots); then 4 ranks in EP groups of 2 (expert data parallelism)
with C = 2; each with both exchanges. And the refusal of more chunks than a rank has experts.
Skipped (77) without MPI.

MOE_TEST_DEVICE=cuda (scripts/gpu_check.sh, where there are 2 GPUs): the 2-rank cases on the
GPUs (--device cuda) with the NCCL transport, the transfers on NCCL's side stream; exit 77
where there is no CUDA device.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work, mpi_args  # noqa: E402

BASE = """model = {{ vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2;
          d_ff = 48; n_experts = 8; top_k = 2; max_seq_len = 32; capacity_factor = 1.0;
          router_jitter = 0.05; }};
train = {{ steps = 4; batch_size = 2; seq_len = 32; warmup_steps = 1; lr = 3e-3; min_lr = 0.0;
          eval_interval = 0; threads = 1; grad_accum = 2; {train} }};
data = {{ dir = "{work}/data"; text = ["{work}/text.txt"]; }};
log = {{ dir = "{work}/run_{name}"; interval = 1; }};
checkpoint = {{ interval = 4; }};
parallel = {{ ep_size = 2; exchange = "{exchange}"; overlap_chunks = {chunks}; {placement} }};
"""
PLACED = "expert_placement = [5, 0, 7, 2, 1, 6, 3, 4];"
CASES = [  # name, train, ranks, chunk counts (the first is the reference), exchange, parallel extra
    ("fp32", "", 2, [1, 2, 3, 4], "rows", ""),
    ("fp32", "", 2, [1, 2, 3, 4], "dedup", ""),
    ("bf16", 'dtype = "bf16";', 2, [1, 2, 4], "rows", ""),
    ("bf16", 'dtype = "bf16";', 2, [1, 4], "dedup", ""),
    ("recompute", 'recompute = "moe";', 2, [1, 4], "rows", ""),
    ("recompute", 'recompute = "moe";', 2, [1, 4], "dedup", ""),
    ("placement", "", 2, [1, 2], "dedup", PLACED),
    ("edp4", "", 4, [1, 2], "rows", ""),
    ("edp4", "", 4, [1, 2], "dedup", ""),
]


def main():
    moe, mpirun, work = mpi_args()
    if not mpirun:
        print("skip: no MPI")
        sys.exit(77)
    fresh_work(work, seed=7, chars=20000)
    report = Report()
    device = os.environ.get("MOE_TEST_DEVICE", "cpu")
    on_gpu = ["--device", device, "--set", 'parallel.transport="nccl"'] if device != "cpu" else []

    def config(name, train, chunks, exchange="rows", placement=""):
        run = "%s_%d_%s" % (name, chunks, exchange)
        path = os.path.join(work, run + ".cfg")
        with open(path, "w") as f:
            f.write(BASE.format(train=train, work=work, name=run, chunks=chunks, exchange=exchange,
                                placement=placement))
        return run, path

    def train(ranks, path):
        r = subprocess.run(mpirun + ["-np", str(ranks), moe, "train", path] + on_gpu,
                           capture_output=True, text=True, timeout=300)
        if r.returncode and ("no CUDA device" in r.stdout + r.stderr or "unknown device" in r.stdout + r.stderr):
            print("skip: no CUDA device (or a build without CUDA)")
            sys.exit(77)
        return r

    def steps(run):
        """Every step's metrics.jsonl line without times, and each layer's exchange bytes."""
        out = []
        with open(os.path.join(work, "run_" + run, "metrics.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "loss" in j:
                    out.append(json.dumps({k: v for k, v in j.items()
                                           if not k.endswith("_s") and k not in ("time", "tok_s")},
                                          sort_keys=True))
        with open(os.path.join(work, "run_" + run, "expert_load.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "exchange_bytes" in j:
                    out.append("%s %s %s" % (j.get("step"), j.get("layer"), j["exchange_bytes"]))
        return out

    def ckpt(run, f):
        with open(os.path.join(work, "run_" + run, "ckpt", "step_00000004", f), "rb") as fh:
            return fh.read()

    for case, extra, ranks, counts, exchange, placement in CASES:
        name = "%s, %s" % (case, exchange)
        if on_gpu and ranks > 2:
            continue  # one GPU per rank: the machine has 2
        runs = []
        for c in counts:
            run, path = config(case, extra, c, exchange, placement)
            r = train(ranks, path)
            report(r.returncode == 0, "%s, overlap_chunks %d: moe train exit %d %s" %
                   (name, c, r.returncode, (r.stdout + r.stderr)[-600:] if r.returncode else ""))
            runs.append(run if r.returncode == 0 else None)
        if None in runs:
            continue
        ref = steps(runs[0])
        report(len(ref) > 4, "%s: 4 steps and the layers' exchange bytes logged" % name)
        files = sorted(f for f in os.listdir(os.path.join(work, "run_" + runs[0], "ckpt", "step_00000004"))
                       if f.endswith(".safetensors") and f.startswith(("model", "optimizer-exp_avg")))
        for c, run in zip(counts[1:], runs[1:]):
            report(steps(run) == ref, "%s, overlap_chunks %d: every step's loss, gnorm, load and "
                   "exchange bytes equal one exchange's" % (name, c))
            same = [ckpt(run, f) == ckpt(runs[0], f) for f in files]
            report(len(files) >= 3 and all(same), "%s, overlap_chunks %d: model, exp_avg and "
                   "exp_avg_sq files byte for byte (%d files)" % (name, c, len(files)))

    # the refusal, naming the key
    _, path = config("refuse", "", 8)
    r = train(2, path)
    want = "parallel.overlap_chunks = 8 exceeds the 4 experts"
    report(r.returncode != 0 and want in r.stdout + r.stderr,
           "overlap_chunks 8 refused: %s" % (r.stdout + r.stderr).strip()[-300:])
    report.exit()


if __name__ == "__main__":
    main()
