#!/usr/bin/env python3
"""expert_load.jsonl's "coactivation" (layers/moe.h coact, log.coactivation): every
log.interval steps, per layer, the upper triangle of the E x E counts of tokens whose top-k
held both experts, summed since the last such record. Checked against the logged per-expert
counts, exactly: for every expert i, sum_j coact(i, j) = (k - 1) x its routed assignments over
the same steps (each assignment pairs with the token's k - 1 others), and the total is
tokens x k (k - 1) / 2; under expert parallelism (2 ranks against one with grad_accum 2) the
matrices are the same; log.coactivation = false writes none.

  coactivation.py MOE MPIRUN_ARGS... -- WORKDIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work, mpi_args  # noqa: E402


def main():
    moe, mpirun, work = mpi_args()
    fresh_work(work, 6, 40000)
    report = Report()


    def run(name, G=1, ranks=1, k=3, coact="true"):
        cfg = os.path.join(work, name + ".cfg")
        with open(cfg, "w") as f:
            f.write("""model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; d_ff = 32; n_experts = 8;
          top_k = %d; max_seq_len = 32; capacity_factor = 1.0; init_std = 0.2; };
train = { steps = 17; batch_size = 2; seq_len = 32; grad_accum = %d; warmup_steps = 0; eval_interval = 0;
          threads = 1; optimizer = "sgd"; lr = 0.3; };
data = { dir = "%s/data"; text = ["%s/text.txt"]; };
log = { dir = "%s/run_%s"; interval = 5; coactivation = %s; };
""" % (k, G, work, work, work, name, coact))
        cmd = ([moe] if ranks == 1 else mpirun + ["-np", str(ranks), moe]) + ["train", cfg]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            sys.exit("coactivation: FAIL: %s\n%s" % (" ".join(cmd), r.stderr[-2000:]))
        return [json.loads(l) for l in open(os.path.join(work, "run_" + name, "expert_load.jsonl"))]

    E = 8
    for k in (2, 3):
        recs = run("k%d" % k, k=k)
        ok, n_logged = True, 0
        for layer in (0, 1):
            rs = [r for r in recs if r["layer"] == layer]
            since = 0
            routed, tokens = [0] * E, 0
            for r in rs:
                routed = [a + b for a, b in zip(routed, r["counts"])]
                tokens += r["tokens"]
                if "coactivation" not in r:
                    continue
                n_logged += 1
                tri = r["coactivation"]
                m = [[0] * E for _ in range(E)]
                it = iter(tri)
                for i in range(E):
                    for j in range(i + 1, E):
                        m[i][j] = m[j][i] = next(it)
                ok &= len(tri) == E * (E - 1) // 2 and r["coactivation_steps"] == r["step"] - since
                ok &= all(sum(m[i]) == (k - 1) * routed[i] for i in range(E))
                ok &= sum(tri) == tokens * k * (k - 1) // 2
                since, routed, tokens = r["step"], [0] * E, 0
        report(ok and n_logged == 8, "top-%d: %d records (steps 5, 10, 15, 17 x 2 layers); per expert the "
               "row sums = (k-1) x its routed assignments, the total = tokens x k(k-1)/2" % (k, n_logged))
    if mpirun:
        one = run("one", G=2, k=2)
        ep = run("ep", ranks=2, k=2)
        a = [r["coactivation"] for r in one if "coactivation" in r]
        b = [r["coactivation"] for r in ep if "coactivation" in r]
        report(a == b and len(a) == 8, "2 ranks (each its own tokens, summed) == one rank with grad_accum 2")
    # moe stats --placement on the top-2 run, recomputed here from its records
    def pct(v, q):  # numpy.percentile, linear
        v = sorted(v)
        x = (len(v) - 1) * q / 100.0
        lo = int(x)
        return v[lo] + (v[min(lo + 1, len(v) - 1)] - v[lo]) * (x - lo)

    recs = [json.loads(l) for l in open(os.path.join(work, "run_k2", "expert_load.jsonl"))]
    R, k = 2, 2

    def cost(rank_of):
        p99, same, tokens = 0, 0, 0
        for layer in (0, 1):
            rs = [r for r in recs if r["layer"] == layer]
            loads = []
            for r in rs:
                per = [0] * R
                for e, c in enumerate(r["counts"]):
                    per[rank_of[e]] += c
                loads.append(max(per) / (sum(per) / R))
                tokens += r["tokens"]
                if "coactivation" in r:
                    it = iter(r["coactivation"])
                    for i in range(E):
                        for j in range(i + 1, E):
                            c = next(it)
                            same += c if rank_of[i] == rank_of[j] else 0
            p99 = max(p99, pct(loads, 99))
        return p99, (R - 1) / R * (k - same / tokens)
    r = subprocess.run([moe, "stats", os.path.join(work, "run_k2"), "--placement", "2", "--json"],
                       capture_output=True, text=True)
    maps = {m["mapping"]: m for m in json.loads(r.stdout)["mappings"]} if r.returncode == 0 else {}
    ok = bool(maps)
    for name in ("contiguous", "greedy", "proposal"):
        if not ok:
            break
        m = maps[name]
        p99, dedup = cost(m["rank_of_expert"])
        ok &= sorted(m["rank_of_expert"]) == [0] * 4 + [1] * 4
        ok &= abs(m["p99_hottest_rank_load"] - p99) < 1e-9 and abs(m["rows_per_token_dedup"] - dedup) < 1e-9
        ok &= m["rows_per_token"] == k * (R - 1) / R
    if ok:
        g = maps["greedy"]["p99_hottest_rank_load"]
        obj = {n: maps[n]["p99_hottest_rank_load"] / g + maps[n]["rows_per_token_dedup"] / (k * (R - 1) / R)
               for n in ("contiguous", "greedy", "proposal")}
        ok &= obj["proposal"] <= min(obj["contiguous"], obj["greedy"]) + 1e-12
    report(ok, "moe stats --placement 2: P99 hottest-rank load and dedup rows/token of each mapping "
           "recomputed from the records; the proposal's objective <= contiguous's and greedy's")

    # scripts/plot_load.py draws them (and, for the 2-rank run, the per-rank loads)
    import struct
    plot = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "plot_load.py")

    def png_size(path):
        with open(path, "rb") as f:
            head = f.read(24)
        return struct.unpack(">II", head[16:24]) if head[:8] == b"\x89PNG\r\n\x1a\n" else None
    want = {"coactivation_layer0.png": (600, 500), "coactivation_layer1.png": (600, 500)}
    runs = [("run_k2", dict(want))] + ([("run_ep", dict(want, **{"rank_load.png": (1000, 800)}))] if mpirun else [])
    for name, files in runs:
        out = os.path.join(work, "plots_" + name)
        r = subprocess.run([sys.executable, plot, os.path.join(work, name), "--out", out, "--smooth", "3"],
                           capture_output=True, text=True)
        if r.returncode == 77:
            print("  skip  plot_load.py: no matplotlib")
            break
        sizes = {f: png_size(os.path.join(out, f)) if os.path.exists(os.path.join(out, f)) else None for f in files}
        report(r.returncode == 0 and sizes == files, "plot_load.py %s: %s" % (name, ", ".join(
            "%s %s" % (f, "x".join(map(str, v)) if v else "missing") for f, v in sizes.items())))

    off = run("off", coact="false")
    report(not any("coactivation" in r for r in off), "log.coactivation = false: no co-activation records")
    report.exit()


main()
