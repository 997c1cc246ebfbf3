#!/usr/bin/env python3
"""parallel.expert_placement (DESIGN.md §4): training with a non-trivial expert-to-rank mapping
equals training with the default placement and training on one rank.

  placement.py MOE [MPIRUN_ARGS...] -- WORKDIR

Without MPIRUN_ARGS only the one-process checks run (the config's errors, a placement on one
rank against none). With them, for R = 2 and 4 (SGD, capacity with drops; R = 4 with the
aux-loss-free bias and the position policy): every step's loss and every tensor of the final
checkpoint (gate rows, experts, bias: by their global names) within 1e-6 of the default
placement on R ranks and of one rank with R-fold accumulation; expert_load.jsonl's per-expert
counts, kept counts and co-activations (global expert order) identical to the default run's;
each expert's shard written by the rank that holds it. Then the placed 4-rank checkpoint at
step 3 resumes on one rank with the default placement (steps 4-5 within 1e-6 of the placed
run), and an AdamW checkpoint of a placed 2-rank run resumes on 2 ranks with the default
placement (its gate moments are stored in global row order).
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
PLACE = [5, 2, 7, 0, 3, 6, 1, 4]  # rank order: R = 2 holds {5,2,7,0}, {3,6,1,4}


def load_fields(run):
    """Per (step, layer): the per-expert fields of expert_load.jsonl."""
    out = {}
    for l in open(os.path.join(run, "expert_load.jsonl")):
        r = json.loads(l)
        out[(r["step"], r["layer"])] = (r["counts"], r["kept"], r.get("coactivation"))
    return out


def main():
    moe, mpirun, work = mpi_args()
    empty_work(work)
    random.seed(5)
    with open(os.path.join(work, "text.txt"), "w") as f:
        f.write("".join(random.choice("abcdefgh ijklmnop,.\n") for _ in range(60000)))

    def cfg(name, extra_model, G, steps=5, ckpt=5, optimizer="sgd", parallel=""):
        path = os.path.join(work, name + ".cfg")
        with open(path, "w") as f:
            f.write("""model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; n_kv_heads = 2;
          d_ff = 24; n_experts = 8; top_k = 2; max_seq_len = 32; %s };
train = { steps = %d; batch_size = 2; seq_len = 32; grad_accum = %d; warmup_steps = 0;
          optimizer = "%s"; lr = %s; min_lr = 0.0; eval_interval = 0; threads = 1; };
data = { dir = "%s/data"; text = ["%s/text.txt"]; };
log = { dir = "%s/run_%s"; interval = 1; };
checkpoint = { interval = %d; keep = 5; };
parallel = {
  %s
};
""" % (extra_model, steps, G, optimizer, "0.5" if optimizer == "sgd" else "0.003", work, work, work,
       name, ckpt, parallel))
        return path

    def placed(p):
        return "expert_placement = [%s];" % ", ".join(map(str, p))

    def train(path, ranks, *more, fail_ok=False):
        cmd = ([moe] if ranks == 1 else mpirun + ["-np", str(ranks), moe]) + ["train", path] + list(more)
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0 and not fail_ok:
            sys.exit("placement: FAIL: %s\n%s%s" % (" ".join(cmd), r.stdout[-2000:], r.stderr[-2000:]))
        return r

    fails = 0

    def report(ok, text):
        nonlocal fails
        fails += not ok
        print("  %s  %s" % ("ok  " if ok else "FAIL", text))

    # the config's errors, at the key's line
    for what, value, message in [
            ("too short", "[0, 1, 2]", "has 3 entries, model.n_experts = 8"),
            ("a repeat", "[0, 1, 2, 3, 4, 5, 6, 6]", "expert 6 is listed twice (entry 7)"),
            ("out of range", "[0, 1, 2, 3, 4, 5, 6, 8]", "entry 7 is expert 8, model.n_experts = 8"),
            ("not an integer", '(0, 1, 2, 3, 4, 5, 6, "7")', "expert_placement[7]: expected an expert index"),
            ("not a list", "3", "expected a list of expert indices")]:
        path = cfg("bad", "", 1, parallel="expert_placement = %s;" % value)
        r = train(path, 1, fail_ok=True)
        err = r.stdout + r.stderr
        ok = r.returncode != 0 and ("%s:9: parallel.expert_placement" % path) in err and message in err
        report(ok, "expert_placement %s: %s" % (what, err.strip().splitlines()[-1] if err.strip() else "(no message)"))

    def compare(a, b):
        """Largest relative loss and weight differences of runs a and b; are the per-expert logs equal."""
        ra, rb = os.path.join(work, "run_" + a), os.path.join(work, "run_" + b)
        la, lb = losses(ra), losses(rb)
        dl = max(abs(x - y) / abs(y) for x, y in zip(la, lb)) if len(la) == len(lb) else float("inf")
        wa = read_st(os.path.join(ra, "ckpt", "step_00000005"))
        wb = read_st(os.path.join(rb, "ckpt", "step_00000005"))
        dw = max(rel(wa[k], wb[k]) for k in wb) if set(wa) == set(wb) else float("inf")
        return dl, dw, load_fields(ra), load_fields(rb)

    # one process: a placement only reorders the experts inside it
    extra = "capacity_factor = 1.0; bias_rate = 0.001;"
    train(cfg("one_default", extra, 2), 1)
    train(cfg("one_placed", extra, 2, parallel=placed(PLACE)), 1)
    dl, dw, fa, fb = compare("one_placed", "one_default")
    report(dl <= TOL and dw <= TOL and fa == fb,
           "one rank, placement %s vs none: losses %.2e, weights %.2e, per-expert logs %s" %
           (PLACE, dl, dw, "equal" if fa == fb else "DIFFER"))
    if not mpirun:
        print("%d failure(s) (no MPI: the multi-rank cases did not run)" % fails)
        sys.exit(1 if fails else 0)

    # R ranks with a placement vs the default placement and vs one rank
    perm4 = [6, 1, 3, 4, 7, 0, 2, 5]  # R = 4: {6,1}, {3,4}, {7,0}, {2,5}
    for R, ep, perm, extra in [(2, 2, PLACE, "capacity_factor = 1.0;"),
                               (4, 4, perm4, 'capacity_factor = 1.0; drop_policy = "position"; bias_rate = 0.001;'),
                               (4, 2, PLACE, "capacity_factor = 1.0;")]:
        tag = "r%d_ep%d" % (R, ep)
        R_ = "R=%d ep_size=%d" % (R, ep)
        train(cfg(tag + "_one", extra, R), 1)
        train(cfg(tag + "_default", extra, 1, parallel="ep_size = %d;" % ep), R)
        train(cfg(tag + "_placed", extra, 1, parallel="ep_size = %d; %s" % (ep, placed(perm))), R)
        dl, dw, fp, fd = compare(tag + "_placed", tag + "_default")
        dl1, dw1, _, f1 = compare(tag + "_placed", tag + "_one")
        drops = sum(sum(c) - sum(k) for c, k, _ in fp.values())
        same1 = all(fp[s][:2] == f1[s][:2] for s in f1) and len(fp) == len(f1)
        report(dl <= TOL and dw <= TOL and fp == fd and drops > 0,
               "%s placement %s vs the default placement: losses %.2e, weights %.2e (worst tensor), "
               "counts/kept/co-activations %s, %d dropped" % (R_, perm, dl, dw, "equal" if fp == fd else "DIFFER", drops))
        report(dl1 <= TOL and dw1 <= TOL and same1,
               "%s placement %s vs one rank (grad_accum %d): losses %.2e, weights %.2e, counts %s" %
               (R_, perm, R, dl1, dw1, "equal" if same1 else "DIFFER"))
        # rank r's experts received the kept rows of the experts the placement gives it (one
        # micro-batch per rank and step: the forward's rows)
        # (rank r holds what place r %% ep_size of its EP group holds); with replicas (ep_size < R)
        # the counts are the world's, the rows each group's: checked with ep_size = R only
        El = 8 // ep
        recs = [json.loads(l) for l in open(os.path.join(work, "run_" + tag + "_placed", "expert_load.jsonl"))]
        held = all(r["received_rows"] == [sum(r["kept"][e] for e in perm[j * El:(j + 1) * El]) for j in range(R)]
                   for r in recs)
        if ep == R:
            report(held and len(recs) == 10, "%s: each rank's received rows = the kept counts of its experts "
                   "%s (%d records)" % (R_, [perm[j * El:(j + 1) * El] for j in range(R)], len(recs)))
        # each expert's tensors are in the file of the rank holding it (rank 0's has the dense ones)
        ck = os.path.join(work, "run_" + tag + "_placed", "ckpt", "step_00000005")
        index = json.load(open(os.path.join(ck, "model.safetensors.index.json")))["weight_map"]
        want = {}
        for name in index:
            e = int(name.split(".experts.")[1].split(".")[0]) if ".experts." in name else None
            want[name] = "model-%05d-of-%05d.safetensors" % ((perm.index(e) // El if e is not None else 0) + 1, ep)
        report(index == want, "%s checkpoint: expert e's tensors in the shard of the rank holding it "
               "(rank %d holds experts %s)" % (R_, 1, perm[El:2 * El]))

    # moe stats --placement's proposal is a value of the key
    r = subprocess.run([moe, "stats", os.path.join(work, "run_r4_ep4_default"), "--placement", "4", "--json"],
                       capture_output=True, text=True)
    try:
        doc = json.loads(r.stdout)
        prop = next(m for m in doc["mappings"] if m["mapping"] == "proposal")
        key = doc["expert_placement"]
    except (ValueError, KeyError, StopIteration):
        key, prop = None, None
    ok = key is not None and sorted(key) == list(range(8)) and all(
        prop["rank_of_expert"][e] == key.index(e) // 2 for e in range(8))
    report(ok, "moe stats --placement 4 --json: expert_placement %s, the proposal's ranks in rank order" % key)
    # the placed 4-rank run's checkpoint at step 3 resumes on one rank, default placement
    extra = 'capacity_factor = 1.0; drop_policy = "position"; bias_rate = 0.001;'
    train(cfg("resume_full", extra, 1, ckpt=3, parallel=placed(perm4)), 4)

    def resume_from(src, tag, R, path):
        run = os.path.join(work, "run_" + tag)
        os.makedirs(os.path.join(run, "ckpt"))
        shutil.copytree(os.path.join(work, "run_" + src, "ckpt", "step_00000003"),
                        os.path.join(run, "ckpt", "step_00000003"))
        with open(os.path.join(run, "ckpt", "latest"), "w") as f:
            f.write("step_00000003\n")
        for f in ("metrics.jsonl", "expert_load.jsonl"):
            shutil.copy(os.path.join(work, "run_" + src, f), run)
        train(path, R, "--resume", run)
        ref, got = losses(os.path.join(work, "run_" + src)), losses(run)
        return max(abs(a - b) / abs(a) for a, b in zip(got[3:], ref[3:])) if len(got) == 5 else float("inf")

    d = resume_from("resume_full", "resume_on_1", 1, cfg("resume_on_1", extra, 4))
    report(d <= TOL, "the placed 4-rank checkpoint at step 3 resumed on 1 rank, default placement: "
           "steps 4-5 within %.2e" % d)
    # AdamW: the moments of the gate rows travel in global order (bar: AdamW's, as in ep_parity)
    train(cfg("adam_full", "capacity_factor = 1.0;", 1, ckpt=3, optimizer="adamw", parallel=placed(PLACE)), 2)
    d = resume_from("adam_full", "adam_default", 2, cfg("adam_default", "capacity_factor = 1.0;", 1, optimizer="adamw"))
    report(d <= 1e-5, "AdamW: a placed 2-rank checkpoint at step 3 resumed on 2 ranks, default placement: "
           "steps 4-5 within %.2e (bar 1e-5)" % d)
    print("%d failure(s)" % fails)
    sys.exit(1 if fails else 0)


main()
