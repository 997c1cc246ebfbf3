#!/usr/bin/env python3
"""Expert parallelism against one rank (DESIGN.md §4): `moe train` under mpirun -np R with
grad_accum G against one process with grad_accum G*R, on the same data and seed, for 5 steps.
Compares every step's loss (metrics.jsonl) and every tensor of the final checkpoint (each rank
of the first EP group writes its experts' shard, rank 0 the dense tensors), and prints the
largest relative differences.

  ep_parity.py MOE MPIRUN_ARGS... -- WORKDIR

Cases: R = 2 and 4; ep_size R, R/2 and 1 (data parallelism only); dropless, capacity with both drop policies (drops
happen), the aux-loss-free bias, group-limited sigmoid routing with head_dim 12, global-batch
balancing (model.aux_scope "global", also with a Qwen2-MoE layer stack); SGD (the bar: 1e-6 on losses and weights) and one AdamW
case (reported: AdamW's first step maps g to g/(|g|+eps), which turns last-bit differences of
gradients that cancel to ~1e-8 into ~1e-4 weight differences; its losses stay within 1e-5).
Then a checkpoint of 4 ranks resumes on 2 ranks and on 1 rank: the next losses equal those
of the uninterrupted 4-rank run; its layout (one shard per writer) is checked, AdamW's
per-rank moments resume exactly on 4 ranks, and a write failing on one rank fails every rank
and keeps the previous checkpoint.
"""
import json
import os
import random
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from checkpoint_reader import losses, read_st, rel  # noqa: E402 (exits 77 without numpy)
from runlib import empty_work, mpi_args  # noqa: E402

TOL = 1e-6


def main():
    moe, mpirun, work = mpi_args()
    empty_work(work)
    # The text: 3,300 random bytes whose 92 training windows of 32 tokens each open with a byte
    # of their own, so no two tokens of different sequences enter the router with the same
    # history. Parity holds to rounding only while no routing or capacity decision sits on a
    # near-tie; the earlier text (60,000 bytes of 20 letters) met one at step 5 under OpenBLAS's
    # SkylakeX/Cooperlake kernels, which moe picks on an AVX-512 CPU: losses equal to 1e-9 up to
    # step 4, then one token kept in one run and dropped in the other, weights 1.2e-5 apart.
    # This text passes under the Haswell, Zen, SkylakeX, Cooperlake, Sandybridge and Prescott
    # kernels (OPENBLAS_CORETYPE).
    random.seed(3)
    text = [random.choice("abcdefgh ijklmnop,.\n") for _ in range(3300)]
    for w in range(92):
        text[w * 32] = chr(33 + w)  # "!" .. "|": 92 distinct printable bytes
    with open(os.path.join(work, "text.txt"), "w") as f:
        f.write("".join(text))

    def cfg(name, extra_model, optimizer, G, steps=5, ckpt=5):
        path = os.path.join(work, name + ".cfg")
        with open(path, "w") as f:
            f.write("""model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2;
          d_ff = 24; n_experts = 8; top_k = 2; max_seq_len = 32; %s };
train = { steps = %d; batch_size = 2; seq_len = 32; grad_accum = %d; warmup_steps = 0;
          optimizer = "%s"; lr = %s; min_lr = 0.0; eval_interval = 0; threads = 1; };
data = { dir = "%s/data"; text = ["%s/text.txt"]; };
log = { dir = "%s/run_%s"; interval = 1; };
checkpoint = { interval = %d; keep = 5; };
""" % (extra_model, steps, G, optimizer, "0.5" if optimizer == "sgd" else "0.003", work, work,
       work, name, ckpt))
        return path

    def train(path, ranks, *more):
        cmd = ([moe] if ranks == 1 else mpirun + ["-np", str(ranks), moe]) + ["train", path] + list(more)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("ep_parity: FAIL: %s\n%s%s" % (" ".join(cmd), r.stdout[-2000:], r.stderr[-2000:]))
        return r.stdout

    fails = 0
    cases = [("dropless", "", "sgd", 2, 0), ("capacity_probs", "capacity_factor = 1.0;", "sgd", 2, 0),
             # ep_size 1: data parallelism only, every rank holds every expert (no exchange)
             ("data_parallel", "capacity_factor = 1.0;", "sgd", 2, 1),
             ("capacity_position", 'capacity_factor = 1.0; drop_policy = "position";', "sgd", 4, 0),
             ("ep_half_bias", "capacity_factor = 1.0; bias_rate = 0.001;", "sgd", 4, 2),
             ("adamw", "capacity_factor = 1.0;", "adamw", 2, 0),
             # group-limited sigmoid routing with the bias and head_dim 12 (32 / 4 = 8)
             ("groups_head_dim", 'scoring = "sigmoid"; n_group = 4; topk_group = 2; head_dim = 12; '
              "capacity_factor = 1.0; bias_rate = 0.001;", "sgd", 4, 2),
             # global-batch balancing: f from the counts of every micro-batch of every rank
             ("global_aux", 'aux_scope = "global"; capacity_factor = 1.0;', "sgd", 2, 0),
             # with a Qwen2-MoE layer stack: layer 0 dense, q/k/v biases, a gated shared expert
             ("global_aux_qwen2", 'aux_scope = "global"; family = "qwen2_moe"; qkv_bias = true; '
              "shared_d_ff = 16; shared_gate = true; sparse_step = 2; norm_topk_prob = false; "
              "capacity_factor = 1.0;", "sgd", 4, 2)]
    for name, extra, opt, R, ep in cases:
        one = cfg(name + "_one", extra, opt, R)
        par = cfg(name + "_ep", extra, opt, 1)
        train(one, 1)
        more = ["--set", "parallel.ep_size=%d" % ep] if ep else []
        out = train(par, R, *more)
        l1, l2 = losses(os.path.join(work, "run_" + name + "_one")), losses(os.path.join(work, "run_" + name + "_ep"))
        dl = max(abs(a - b) / abs(a) for a, b in zip(l1, l2))
        w1 = read_st(os.path.join(work, "run_" + name + "_one", "ckpt", "step_00000005"))
        w2 = read_st(os.path.join(work, "run_" + name + "_ep", "ckpt", "step_00000005"))
        dw = max(rel(w2[k], w1[k]) for k in w1) if set(w1) == set(w2) else float("inf")
        drops = sum(json.loads(l)["dropped"] for l in open(os.path.join(work, "run_" + name + "_ep", "expert_load.jsonl")))
        bar = (TOL, TOL) if opt == "sgd" else (1e-5, float("inf"))
        ok = len(l1) == len(l2) == 5 and dl <= bar[0] and dw <= bar[1] and ("capacity" not in extra or drops > 0)
        fails += not ok
        print("  %s  R=%d ep=%d %-18s %s: losses %.2e, weights %.2e (worst tensor), %d dropped" %
              ("ok  " if ok else "FAIL", R, ep or R, name, opt, dl, dw, drops))

    # the global scope is in effect: the same run with the micro-batch scope (capacity_probs,
    # one rank, grad_accum 2) has other losses
    lg = losses(os.path.join(work, "run_global_aux_one"))
    lm = losses(os.path.join(work, "run_capacity_probs_one"))
    d = max(abs(a - b) / abs(a) for a, b in zip(lg, lm))
    ok = len(lg) == len(lm) == 5 and d > 1e-6
    fails += not ok
    print("  %s  aux_scope \"global\" changes the losses of grad_accum 2 (by %.2e)" % ("ok  " if ok else "FAIL", d))

    # moe stats --capacity reads an EP run: grad_accum x ranks capacity groups per step
    r = subprocess.run([moe, "stats", os.path.join(work, "run_capacity_position_ep"), "--capacity", "--json"],
                       capture_output=True, text=True)
    try:
        groups = json.loads(r.stdout)["grad_accum"]
    except (ValueError, KeyError):
        groups = None
    ok = r.returncode == 0 and groups == 4
    fails += not ok
    print("  %s  moe stats --capacity on the 4-rank run: %s capacity groups per step (1 x 4 ranks)%s" %
          ("ok  " if ok else "FAIL", groups, "" if ok else "\n" + r.stderr[-800:]))

    # resume: 4 ranks for 3 steps with a checkpoint at 3, then steps 4-5 on 2 and on 1 rank
    name = "resume"
    full = cfg(name + "_full", "capacity_factor = 1.0;", "sgd", 1, steps=5, ckpt=3)
    train(full, 4)
    ref = losses(os.path.join(work, "run_resume_full"))
    ckpt3 = os.path.join(work, "run_resume_full", "ckpt", "step_00000003")
    for R, G in [(2, 2), (1, 4)]:
        tag = "resume_on_%d" % R
        path = cfg(tag, "capacity_factor = 1.0;", "sgd", G, steps=5, ckpt=5)
        run = os.path.join(work, "run_" + tag)
        os.makedirs(os.path.join(run, "ckpt"))
        shutil.copytree(ckpt3, os.path.join(run, "ckpt", "step_00000003"))
        with open(os.path.join(run, "ckpt", "latest"), "w") as f:
            f.write("step_00000003\n")
        shutil.copy(os.path.join(work, "run_resume_full", "metrics.jsonl"), run)
        shutil.copy(os.path.join(work, "run_resume_full", "expert_load.jsonl"), run)
        train(path, R, "--resume", run)
        got = losses(run)
        d = max(abs(a - b) / abs(a) for a, b in zip(got[3:], ref[3:]))
        ok = len(got) == 5 and d <= TOL
        fails += not ok
        print("  %s  a 4-rank checkpoint at step 3 resumed on %d rank(s) (grad_accum %d): steps 4-5 "
              "within %.2e of the 4-rank run" % ("ok  " if ok else "FAIL", R, G, d))
    # the 4-rank checkpoint: the writers' files (rank r's experts in file r + 1, rank 0's with the
    # dense tensors), named by the index; the ep_size = 2 run of 4 ranks has 2 writers
    def layout_ok(folder, writers, experts_per_writer):
        index = json.load(open(os.path.join(folder, "model.safetensors.index.json")))["weight_map"]
        want = {}
        for name in index:
            e = int(name.split(".experts.")[1].split(".")[0]) if ".experts." in name else 0
            want[name] = "model-%05d-of-%05d.safetensors" % (e // experts_per_writer + 1, writers)
        tensors = set(k for k in read_st(folder) if "e_score_correction_bias" not in k)  # router_bias file
        return index == want and tensors == set(index)
    for folder, writers, what in [(ckpt3, 4, "4 ranks, ep_size 4"),
                                  (os.path.join(work, "run_ep_half_bias_ep", "ckpt", "step_00000005"), 2,
                                   "4 ranks, ep_size 2")]:
        ok = layout_ok(folder, writers, 8 // writers)
        fails += not ok
        print("  %s  checkpoint of %s: one shard per writer of experts (rank 0's with the dense tensors), "
              "%d shards in the index" % ("ok  " if ok else "FAIL", what, writers))

    # AdamW: a 4-rank checkpoint (moments written by each rank) resumes on the same 4 ranks
    # exactly, and on 2 ranks within the AdamW bar
    full = cfg("adam_full", "capacity_factor = 1.0;", "adamw", 1, steps=5, ckpt=3)
    train(full, 4)
    ref = losses(os.path.join(work, "run_adam_full"))
    ck_a = os.path.join(work, "run_adam_full", "ckpt", "step_00000003")
    moments = sorted(f for f in os.listdir(ck_a) if f.startswith("optimizer-"))
    ok = moments == ["optimizer-exp_avg%s-%05d-of-00004.safetensors" % (sq, i) for sq in ("", "_sq")
                     for i in range(1, 5)]
    fails += not ok
    print("  %s  AdamW moments: one shard per model shard (%d files)" % ("ok  " if ok else "FAIL", len(moments)))
    for R, G, bar in [(4, 1, 0.0), (2, 2, 1e-5)]:
        tag = "adam_on_%d" % R
        path = cfg(tag, "capacity_factor = 1.0;", "adamw", G, steps=5, ckpt=0)
        run = os.path.join(work, "run_" + tag)
        os.makedirs(os.path.join(run, "ckpt"))
        shutil.copytree(ck_a, os.path.join(run, "ckpt", "step_00000003"))
        with open(os.path.join(run, "ckpt", "latest"), "w") as f:
            f.write("step_00000003\n")
        for f in ("metrics.jsonl", "expert_load.jsonl"):
            shutil.copy(os.path.join(work, "run_adam_full", f), run)
        train(path, R, "--resume", run)
        got = losses(run)
        d = max(abs(a - b) / abs(a) for a, b in zip(got[3:], ref[3:]))
        ok = len(got) == 5 and d <= bar
        fails += not ok
        print("  %s  AdamW: the 4-rank checkpoint at step 3 resumed on %d ranks: steps 4-5 within %.2e "
              "(bar %.0e)" % ("ok  " if ok else "FAIL", R, d, bar))

    # a write failing on one rank (rank 2, second save): every rank exits non-zero naming it,
    # and the first checkpoint stays the latest, intact
    fpath = cfg("save_fail", "", "sgd", 1, steps=4, ckpt=2)
    r = subprocess.run(mpirun + ["-x", "MOE_TEST_SAVE_FAIL=2:2", "-np", "4", moe, "train", fpath],
                       capture_output=True, text=True, timeout=120)
    froot = os.path.join(work, "run_save_fail", "ckpt")
    latest = open(os.path.join(froot, "latest")).read().strip() if os.path.exists(os.path.join(froot, "latest")) else None
    ev = subprocess.run([moe, "eval", "--ckpt", os.path.join(froot, "latest"), "--data",
                         os.path.join(work, "data", "val.bin"), "--seq-len", "32", "--max-windows", "1"],
                        capture_output=True, text=True)
    ok = (r.returncode != 0 and "rank 2: checkpoint: a write failure injected on rank 2" in r.stdout + r.stderr
          and latest == "step_00000002" and ev.returncode == 0 and sorted(os.listdir(froot)) == ["latest", "step_00000002"])
    fails += not ok
    print("  %s  a checkpoint write failing on rank 2: exit %d on all ranks, latest = %s, still loads%s" %
          ("ok  " if ok else "FAIL", r.returncode, latest, "" if ok else "\n" + (r.stdout + r.stderr)[-1500:] + ev.stderr))

    # moe eval under mpirun: the experts spread over the ranks, the windows too (a rank past
    # the end repeats a window it does not count): the loss of one rank
    ck = os.path.join(work, "run_resume_full", "ckpt", "step_00000005")
    val = os.path.join(work, "data", "val.bin")
    evals = {}
    for R in (1, 2, 4):
        cmd = ([moe] if R == 1 else mpirun + ["-np", str(R), moe]) + ["eval", "--ckpt", ck, "--data", val, "--seq-len", "32"]
        r = subprocess.run(cmd, capture_output=True, text=True)
        evals[R] = float(r.stdout.split()[1]) if r.returncode == 0 and r.stdout.startswith("loss ") else float("nan")
    for R in (2, 4):
        d = abs(evals[R] - evals[1]) / evals[1]
        ok = d <= TOL
        fails += not ok
        print("  %s  moe eval on %d ranks: loss %.6f, one rank %.6f (relative %.1e)" %
              ("ok  " if ok else "FAIL", R, evals[R], evals[1], d))

    # the 4-rank checkpoint in Hugging Face transformers (when a venv has it: install_hf*.sh)
    hf_py = next((p for p in [os.environ.get("MOE_HF_PYTHON", ""), "/opt/moe-hf5/bin/python",
                              "/opt/moe-hf/bin/python"] if p and os.access(p, os.X_OK)), None)
    if hf_py:
        npy = os.path.join(work, "ep4_logits.npy")
        subprocess.run([moe, "eval", "--ckpt", ck, "--data", val, "--seq-len", "32", "--max-windows",
                        "1", "--logits", npy], check=True, capture_output=True)
        code = """
import struct, sys, numpy as np, torch
from transformers import MixtralForCausalLM
b = open(sys.argv[2], "rb").read()
dt = struct.unpack("<I", b[12:16])[0]
toks = np.frombuffer(b[32:32 + 32 * dt], dtype=np.uint16 if dt == 2 else np.uint32).astype(np.int64)
m = MixtralForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32).eval()
with torch.no_grad():
    hf = m(torch.tensor(toks)[None]).logits[0].double().numpy()
ours = np.load(sys.argv[3]).astype(np.float64)
print(np.linalg.norm(hf - ours) / np.linalg.norm(hf))
"""
        r = subprocess.run([hf_py, "-c", code, ck, val, npy], capture_output=True, text=True)
        try:
            d = float(r.stdout.strip().splitlines()[-1])
        except (ValueError, IndexError):
            d = float("inf")
        ok = d <= 1e-4
        fails += not ok
        print("  %s  transformers (%s) loads the 4-rank checkpoint: logits within %.1e of moe eval%s" %
              ("ok  " if ok else "FAIL", hf_py, d, "" if ok else "\n" + r.stderr[-1500:]))
    else:
        print("  skip  transformers: no venv (scripts/install_hf5.sh)")

    # failure: a rank killed mid-run, a rank on the fatal path, configs that differ by rank
    import time
    base = cfg("fail", "", "sgd", 1, steps=50, ckpt=0)
    fail_cases = [
        ("a rank killed (SIGKILL) at step 2", mpirun + ["-x", "MOE_TEST_KILL=1:2", "-np", "2", moe, "train", base], None),
        ("parallel.ep_size = 3 on 2 ranks: the fatal path on every rank",
         mpirun + ["-np", "2", moe, "train", base, "--overwrite", "--set", "parallel.ep_size=3"],
         "parallel.ep_size = 3 must divide the 2 ranks"),
        ("configs that differ between ranks", mpirun + ["-np", "1", moe, "train", base, "--overwrite", ":", "-np", "1",
         moe, "train", base, "--overwrite", "--set", "train.lr=0.1"], "rank 1's resolved config differs"),
    ]
    for what, cmd, message in fail_cases:
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            rc, err = r.returncode, r.stdout + r.stderr
        except subprocess.TimeoutExpired:
            rc, err = None, "timed out after 60 s"
        dt = time.time() - t0
        ok = rc not in (0, None) and dt < 30 and (message is None or message in err)
        fails += not ok
        print("  %s  %s: every rank ended, exit %s after %.1f s%s" % ("ok  " if ok else "FAIL", what, rc, dt,
              "" if ok else "\n" + err[-1500:]))
    print("%d failure(s)" % fails)
    sys.exit(1 if fails else 0)


main()
