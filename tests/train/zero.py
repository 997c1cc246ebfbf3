#!/usr/bin/env python3
"""The sharded optimizer (parallel.shard_optimizer, ZeRO-1; train/zero.h) against the same run
unsharded, under mpirun:

  zero.py MOE MPIRUN_ARGS... -- WORKDIR

- R = 2 and 4 ranks, SGD and AdamW, fp32 and bf16, an EP x DP layout (R = 4, ep_size 2, bf16:
  the dense moments in 4 pieces, each EP rank's experts held twice, their moments in 2
  pieces, the others' bf16 copies rounded locally): the losses within 1e-6 and the
  weights after 4 steps within 1e-6 (relative, worst tensor), the AdamW moments of the
  checkpoint (gathered to the whole layout) within 1e-6 of the unsharded run's.
- Checkpoints: a sharded run's checkpoint resumed unsharded, an unsharded one resumed sharded
  (same R) and a sharded one of 2 ranks resumed on 1 rank with grad_accum 2: steps 3-4 equal
  the uninterrupted run's.
- The run header and the dry run print the optimizer bytes per rank with sharding.
- A NaN planted in rank 1's expert gradient is named, with its rank, by the skip's warning.
Exit 77 without MPI or numpy.
"""
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work, mpi_args  # noqa: E402

from checkpoint_reader import losses, read_st, rel  # noqa: E402 (exits 77 without numpy)

TOL = 1e-6
# The AdamW moments (m, v) themselves: with R > 2 the reduce-scatter sums the ranks' gradients
# in another order than the all-reduce, and v, a square, carries that rounding to ~1e-6 of the
# largest element in some tensors (3.5e-6 measured under ASan + UBSan at R = 4): weights and
# losses stay within TOL (the bars), the moments within this.
MOMENT_TOL = 1e-4
CFG = """model = {{ vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2;
          d_ff = 24; n_experts = 8; top_k = 2; max_seq_len = 32; capacity_factor = 0.0; }};
train = {{ steps = 4; batch_size = 2; seq_len = 32; grad_accum = {G}; warmup_steps = 0;
          optimizer = "{opt}"; lr = {lr}; min_lr = 0.0; eval_interval = 0; threads = 1;
          weight_decay = 0.1; dtype = "{dtype}"; }};
data = {{ dir = "{work}/data"; text = ["{work}/text.txt"]; }};
log = {{ dir = "{work}/run_{name}"; interval = 1; }};
checkpoint = {{ interval = 2; keep = 5; }};
parallel = {{ ep_size = {ep}; shard_optimizer = {shard}; }};
"""


def worst(a, b):
    """The largest relative difference of a tensor of a against b (inf: other names)."""
    if set(a) != set(b) or not a:
        return float("inf")
    return max(rel(a[k], b[k]) for k in b)


def main():
    moe, mpirun, work = mpi_args()
    if not mpirun:
        print("skip: no MPI")
        sys.exit(77)
    fresh_work(work, seed=5, chars=8000)
    report = Report()

    def cfg(name, opt, shard, ep=0, G=1, dtype="fp32"):
        path = os.path.join(work, name + ".cfg")
        with open(path, "w") as f:
            f.write(CFG.format(G=G, opt=opt, lr="0.5" if opt == "sgd" else "0.003", dtype=dtype,
                               work=work, name=name, ep=ep, shard="true" if shard else "false"))
        return path

    def train(path, ranks, *more):
        cmd = ([moe] if ranks == 1 else mpirun + ["-np", str(ranks), moe]) + ["train", path] + list(more)
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            print("    FAILED: %s\n%s%s" % (" ".join(cmd), r.stdout[-1500:], r.stderr[-1500:]))
        return r

    def run_dir(name):
        return os.path.join(work, "run_" + name)

    def step(name, s):
        return os.path.join(run_dir(name), "ckpt", "step_%08d" % s)

    # sharded against unsharded: the same R, the same layout
    cases = [("r2_sgd", 2, "sgd", 0, "fp32"), ("r2_adamw", 2, "adamw", 0, "fp32"),
             ("r2_adamw_bf16", 2, "adamw", 0, "bf16"), ("r4_sgd", 4, "sgd", 0, "fp32"),
             ("r4_ep2_adamw_bf16", 4, "adamw", 2, "bf16"),
             ("r2_ep1_adamw", 2, "adamw", 1, "fp32")]  # data parallelism only: experts replicated
    for name, R, opt, ep, dtype in cases:
        a = train(cfg(name + "_plain", opt, False, ep, dtype=dtype), R)
        b = train(cfg(name + "_zero", opt, True, ep, dtype=dtype), R)
        if a.returncode or b.returncode:
            report(False, "%s: both runs complete" % name)
            continue
        la, lb = losses(run_dir(name + "_plain")), losses(run_dir(name + "_zero"))
        dl = max(abs(x - y) / abs(x) for x, y in zip(la, lb)) if len(la) == len(lb) == 4 else float("inf")
        dw = worst(read_st(step(name + "_zero", 4), False), read_st(step(name + "_plain", 4), False))
        dm = worst(read_st(step(name + "_zero", 4), True), read_st(step(name + "_plain", 4), True)) \
            if opt == "adamw" else 0.0
        report(dl <= TOL and dw <= TOL and dm <= (TOL if R <= 2 else MOMENT_TOL),
               "R=%d ep=%d %s %s: sharded against unsharded: losses %.1e, weights %.1e, moments %.1e"
               % (R, ep or R, opt, dtype, dl, dw, dm))
        if name == "r2_adamw":
            line = next((x for x in b.stdout.splitlines() if x.startswith("optimizer sharded")), "")
            print("    " + line)
            report("R = 2:" in line and "unsharded" in line, "the run header prints the moments per rank")

    # resume across sharding: checkpoints at step 2 of the R = 2 AdamW runs
    ref = losses(run_dir("r2_adamw_plain"))
    ref_w = read_st(step("r2_adamw_plain", 4), False)
    # (one rank with grad_accum 2 sums the same gradients in another order, which AdamW's
    # m / sqrt(v) magnifies for tiny gradients: its bars are ep_parity's for AdamW, 1e-5 losses)
    for tag, src, R, G, shard, lbar, wbar in [
            ("zero_to_plain", "r2_adamw_zero", 2, 1, False, TOL, TOL),
            ("plain_to_zero", "r2_adamw_plain", 2, 1, True, TOL, TOL),
            ("zero_to_one", "r2_adamw_zero", 1, 2, False, 1e-5, float("inf"))]:
        path = cfg(tag, "adamw", shard, G=G)
        run = run_dir(tag)
        os.makedirs(os.path.join(run, "ckpt"))
        shutil.copytree(step(src, 2), os.path.join(run, "ckpt", "step_00000002"))
        with open(os.path.join(run, "ckpt", "latest"), "w") as f:
            f.write("step_00000002\n")
        for log in ("metrics.jsonl", "expert_load.jsonl"):
            shutil.copy(os.path.join(run_dir(src), log), run)
        r = train(path, R, "--resume", run)
        got = losses(run) if r.returncode == 0 else []
        dl = max(abs(x - y) / abs(y) for x, y in zip(got[2:], ref[2:])) if len(got) == 4 else float("inf")
        dw = worst(read_st(step(tag, 4), False), ref_w) if len(got) == 4 else float("inf")
        report(dl <= lbar and dw <= wbar,
               "%s: step 2's checkpoint resumed on %d rank(s)%s: steps 3-4 losses %.1e, weights %.1e"
               % (tag, R, " sharded" if shard else "", dl, dw))

    # a NaN planted in rank 1's expert gradient (MOE_TEST_NAN): the skip's warning names that
    # tensor and rank, sharded or not (rank 0 holds neither the expert nor, sharded, the sums
    # outside its piece)
    want = "first non-finite gradient: model.layers.1.block_sparse_moe.experts.4.w2.weight (rank 1)"
    for shard in (True, False):
        tag = "nan_zero" if shard else "nan_plain"
        r = subprocess.run(mpirun + ["-x", "MOE_TEST_NAN=1:2", "-np", "2", moe, "train",
                                     cfg(tag, "adamw", shard, ep=2)], capture_output=True, text=True,
                           timeout=300)
        warn = [x for x in r.stderr.splitlines() if "step 2:" in x and "non-finite" in x]
        report(r.returncode == 0 and warn and all(want in x for x in warn),
               "%s: rank 1's NaN is named: %s" % (tag, warn[0] if warn else r.stderr[-400:]))

    d = subprocess.run([moe, "train", cfg("dry", "adamw", True), "--dry-run"], capture_output=True,
                       text=True, timeout=120)
    line = next((x for x in d.stdout.splitlines() if x.startswith("optimizer sharded")), "")
    print("    " + line)
    report(d.returncode == 0 and "R = 2:" in line and "R = 4:" in line,
           "the dry run prints the moments per rank for R = 2, 4, 8")
    report.exit()


if __name__ == "__main__":
    main()
