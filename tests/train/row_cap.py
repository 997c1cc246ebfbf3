#!/usr/bin/env python3
"""The dropless row cap (model.dropless_max_rows, docs/training.md "Memory plan") under expert
parallelism: `moe train` under mpirun -np 2 (ep_size 2, top-1 of 8 experts, dropless, 64
tokens per rank: the worst routing sends all 128 tokens of both ranks to one rank's experts).

  row_cap.py MOE MPIRUN_ARGS... -- WORKDIR

- A normal text with a cap of 120 rows: the run completes, its losses equal the uncapped run's
  bit for bit, and the dry run prints the expert buffers at the cap and at the worst routing.
- A text of one repeated byte (every token of every rank has the same history, so the router
  sends them all to one expert: 128 rows on one rank), with both exchanges (rows, dedup):
  exit 1, never a crash or a hang, and a message that names the step, the layer, the rank,
  its rows, its hottest expert and the cap; no checkpoint written.
Exit 77 without MPI.
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work, mpi_args  # noqa: E402

CFG = """model = {{ vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2;
          d_ff = 24; n_experts = 8; top_k = 1; max_seq_len = 32; capacity_factor = 0.0;
          dropless_max_rows = {cap}; }};
train = {{ steps = 3; batch_size = 2; seq_len = 32; warmup_steps = 0; lr = 1e-3; min_lr = 0.0;
          eval_interval = 0; threads = 1; }};
data = {{ dir = "{work}/data_{text}"; text = ["{work}/{text}.txt"]; }};
log = {{ dir = "{work}/run_{name}"; interval = 1; }};
checkpoint = {{ interval = 3; }};
parallel = {{ ep_size = 2; exchange = "{exchange}"; }};
"""


def main():
    moe, mpirun, work = mpi_args()
    if not mpirun:
        print("skip: no MPI")
        sys.exit(77)
    fresh_work(work, seed=11, chars=20000)
    with open(os.path.join(work, "same.txt"), "w") as f:
        f.write("a" * 20000)
    report = Report()

    def run(name, text, cap, exchange="rows", dry=False):
        path = os.path.join(work, name + ".cfg")
        with open(path, "w") as f:
            f.write(CFG.format(cap=cap, work=work, text=text, name=name, exchange=exchange))
        if dry:
            return subprocess.run([moe, "train", path, "--dry-run"], capture_output=True, text=True, timeout=120)
        return subprocess.run(mpirun + ["-np", "2", moe, "train", path], capture_output=True, text=True,
                              timeout=300)

    def losses(name):
        with open(os.path.join(work, "run_" + name, "metrics.jsonl")) as f:
            return [json.loads(line)["loss"] for line in f if '"loss"' in line]

    a, b = run("uncapped", "text", 0), run("capped", "text", 120)
    report(a.returncode == 0 and b.returncode == 0, "a normal text: the uncapped and the capped (120 of 128 rows) runs complete")
    if a.returncode == 0 and b.returncode == 0:
        la, lb = losses("uncapped"), losses("capped")
        report(len(la) == 3 and la == lb, "the capped run's losses equal the uncapped run's, bit for bit: %s" % lb)
    else:
        print(a.stderr[-1500:], b.stderr[-1500:])
    d = run("capped", "text", 120, dry=True)
    report(d.returncode == 0 and "at the cap of 120 rows" in d.stdout and "worst routing" in d.stdout,
           "the dry run prints the expert buffers at the cap and at the worst routing")
    print("\n".join(line for line in d.stdout.splitlines() if "memory" in line or "expert" in line.lower())[-1500:])
    for exchange in ("rows", "dedup"):
        r = run("skewed_" + exchange, "same", 120, exchange)
        err = r.stderr
        line = next((l for l in err.splitlines() if "dropless row cap" in l), "")
        print("    " + line)
        report(r.returncode == 1 and "step 1" in line and "layer 0" in line and "128 rows" in line
               and "hottest: expert" in line and "cap of 120 rows" in line and "dropless_max_rows" in line,
               "one repeated byte, %s exchange: exit 1 naming the step, layer, rank, rows, expert and cap (rc %d)" % (exchange, r.returncode))
        report(not os.path.exists(os.path.join(work, "run_skewed_" + exchange, "ckpt", "latest")),
               "%s exchange: no checkpoint written" % exchange)
    report.exit()


if __name__ == "__main__":
    main()
