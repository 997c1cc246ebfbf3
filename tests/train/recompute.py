#!/usr/bin/env python3
"""Activation recompute (train.recompute, docs/training.md "Memory plan"): "moe" and "layer"
give the same training as "none", bit for bit. Each case trains 4 steps three times (none,
moe, layer) and compares every step's logged loss, gradient norm and load figures as text,
and the checkpoint's model and AdamW moment files byte for byte (the second moment is the
squared gradient's running average: equal files mean equal gradients at every step).

  recompute.py MOE MPIRUN_ARGS... -- WORKDIR

Cases: one rank fp32 (capacity drops, router jitter), one rank bf16, a Qwen2-MoE layout
(dense first layer, gated shared expert, q/k/v biases) in fp32 and bf16, and under mpirun -np 2
expert parallelism with both exchanges (rows, dedup), drops and jitter. The dry run's
activation memory falls from none to moe to layer. MPI cases are skipped without MPI.

MOE_TEST_DEVICE=cuda (ctest train_recompute_cuda, label GPU): the one-rank cases on the GPU
(--device cuda), exit 77 where there is no CUDA device.
"""
import json
import os
import re
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work, mpi_args  # noqa: E402

BASE = """model = {{ vocab_size = 256; d_model = 32; n_layers = 3; n_heads = 4; n_kv_heads = 2;
          d_ff = 48; n_experts = 4; top_k = 2; max_seq_len = 32; capacity_factor = 1.0;
          router_jitter = 0.05; {model} }};
train = {{ steps = 4; batch_size = 2; seq_len = 32; warmup_steps = 1; lr = 3e-3; min_lr = 0.0;
          eval_interval = 0; threads = 1; grad_accum = 2; recompute = "{mode}"; {train} }};
data = {{ dir = "{work}/data"; text = ["{work}/text.txt"]; }};
log = {{ dir = "{work}/run_{name}"; interval = 1; }};
checkpoint = {{ interval = 4; }};
{parallel}
"""
QWEN2 = ('family = "qwen2_moe"; first_k_dense = 1; dense_d_ff = 40; shared_d_ff = 24; '
         'shared_gate = true; qkv_bias = true; norm_topk_prob = false;')
CASES = [  # name, model, train, parallel, ranks
    ("fp32", "", "", "", 1),
    ("bf16", "", 'dtype = "bf16";', "", 1),
    ("qwen2", QWEN2, "", "", 1),
    ("qwen2_bf16", QWEN2, 'dtype = "bf16";', "", 1),
    ("ep_rows", "", "", 'parallel = { ep_size = 2; exchange = "rows"; };', 2),
    ("ep_dedup", "", "", 'parallel = { ep_size = 2; exchange = "dedup"; };', 2),
]
MODES = ["none", "moe", "layer"]


def main():
    moe, mpirun, work = mpi_args()
    fresh_work(work, seed=5, chars=20000)
    report = Report()
    device = os.environ.get("MOE_TEST_DEVICE", "cpu")
    if device != "cpu":
        mpirun = []  # the GPU variant: one rank

    def config(case, mode):
        name, model, train, parallel, _ = case
        path = os.path.join(work, "%s_%s.cfg" % (name, mode))
        with open(path, "w") as f:
            f.write(BASE.format(model=model, train=train, parallel=parallel, mode=mode, work=work,
                                name=name + "_" + mode))
        return path

    def steps(run):
        """Every step's line of metrics.jsonl without the times (they differ run to run)."""
        out = []
        with open(os.path.join(work, "run_" + run, "metrics.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if "loss" not in j:
                    continue
                for k in list(j):
                    if k in ("time", "tok_s", "wall_s", "elapsed_s", "step_s", "optimizer_s") or k.endswith("_s"):
                        del j[k]
                out.append(json.dumps(j, sort_keys=True))
        return out

    def ckpt(run, f):
        with open(os.path.join(work, "run_" + run, "ckpt", "step_00000004", f), "rb") as fh:
            return fh.read()

    for case in CASES:
        name, ranks = case[0], case[4]
        if ranks > 1 and not mpirun:
            print("  skip  %s: no MPI" % name)
            continue
        ok = True
        for mode in MODES:
            cmd = [moe, "train", config(case, mode)] + (["--device", device] if device != "cpu" else [])
            if ranks > 1:
                cmd = mpirun + ["-np", str(ranks)] + cmd
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if r.returncode and "no CUDA device" in r.stdout + r.stderr:
                print("skip: no CUDA device")
                sys.exit(77)
            if r.returncode:
                report(False, "%s, recompute %s: moe train exit %d: %s" % (name, mode, r.returncode,
                                                                         (r.stdout + r.stderr)[-800:]))
                ok = False
        if not ok:
            continue
        ref = steps(name + "_none")
        report(len(ref) == 4, "%s: 4 steps logged" % name)
        for mode in MODES[1:]:
            run = name + "_" + mode
            report(steps(run) == ref, "%s, recompute %s: every step's loss, gnorm and load equal none's" % (name, mode))
            files = sorted(f for f in os.listdir(os.path.join(work, "run_%s_none" % name, "ckpt", "step_00000004"))
                           if f.endswith(".safetensors") and f.startswith(("model", "optimizer-exp_avg")))
            same = [ckpt(run, f) == ckpt(name + "_none", f) for f in files]
            report(len(files) >= 3 and all(same), "%s, recompute %s: model, exp_avg and exp_avg_sq files byte for byte "
                   "none's (%d files: %s)" % (name, mode, len(files), same))

    # the dry run: activations fall from none to moe to layer
    acts = []
    for mode in MODES:
        r = subprocess.run([moe, "train", config(CASES[0], mode), "--dry-run"], capture_output=True,
                           text=True, timeout=120)
        unit = {"KiB": 1, "MiB": 1024, "GiB": 1 << 20}
        got = [float(v) * unit[u] for v, u in re.findall(r"(?:activations|expert buffers) ([\d.]+) (KiB|MiB|GiB)",
                                                          r.stdout.replace("\n  ", " "))]
        acts.append(round(sum(got), 1) if len(got) == 2 else None)
    report(None not in acts and acts[0] > acts[1] > acts[2],
           "the dry run's activations and expert buffers: none %s > moe %s > layer %s KiB" % tuple(acts))
    report.exit()


if __name__ == "__main__":
    main()
