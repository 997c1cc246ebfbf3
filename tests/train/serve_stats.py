#!/usr/bin/env python3
"""Serving telemetry (infer/serve_stats.h) of `moe generate --stats-out` and `moe eval
--stats-out`, recomputed independently from the per-step records with numpy:

- every step's counts sum to tokens x top_k in every layer, its hottest share is max / sum;
- the summary's latency P50/P95/P99/max per kind are numpy's percentiles of the steps';
- per layer: the mean/P99/max of the hottest share, the min/max over windows of W steps of
  the window's mean hottest share and of its hottest expert's hit ratio (a last partial window
  counts when at least half full), and P99 cf = n_experts x P99 share;
- eval: one step per window of S tokens; the text summary is printed.

  serve_stats.py MOE WORKDIR
"""
import json
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work  # noqa: E402

try:
    import numpy as np
except ImportError:
    print("serve_stats: numpy is not installed: skipped")
    sys.exit(77)


def main():
    moe, work = sys.argv[1], sys.argv[2]
    fresh_work(work, 4, 40000)
    cfg = os.path.join(work, "s.cfg")
    with open(cfg, "w") as f:
        f.write("""model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; d_ff = 32; n_experts = 8;
          top_k = 2; max_seq_len = 128; init_std = 0.2; };
train = { steps = 20; batch_size = 2; seq_len = 64; warmup_steps = 0; eval_interval = 0; threads = 1; };
data = { dir = "%s/data"; text = ["%s/text.txt"]; };
log = { dir = "%s/run"; };
""" % (work, work, work))
    subprocess.run([moe, "train", cfg], check=True, capture_output=True)
    ck = os.path.join(work, "run", "ckpt", "latest")
    report = Report()


    def check(path, W, E=8, k=2, what=""):
        recs = [json.loads(l) for l in open(path)]
        steps, summary = recs[:-1], recs[-1]["summary"]
        L = len(steps[0]["layers"])
        ok = all(sum(l["counts"]) == s["tokens"] * k and
                 abs(l["hottest_share"] - max(l["counts"]) / sum(l["counts"])) < 1e-6 and
                 l["counts"][l["hottest_expert"]] == max(l["counts"]) for s in steps for l in s["layers"])
        report(ok, "%s: %d steps, counts sum to tokens x k, hottest share = max / sum" % (what, len(steps)))
        ok = True
        for kind, q in summary["latency"].items():
            lat = np.array([s["latency_s"] for s in steps if s["kind"] == kind])
            ok &= q["steps"] == len(lat) and all(
                abs(q[n] - np.percentile(lat, p)) <= 1e-6 * max(q[n], 1e-9) + 1e-12
                for n, p in (("p50_s", 50), ("p95_s", 95), ("p99_s", 99), ("max_s", 100)))
        report(ok, "%s: latency P50/P95/P99/max per kind equal numpy's (%s)" %
               (what, ", ".join("%s P99 %.3f ms" % (k_, 1e3 * v["p99_s"]) for k_, v in summary["latency"].items())))
        ok = True
        n = len(steps)
        bounds = [(a, min(a + W, n)) for a in range(0, n, W)]
        bounds = [b for b in bounds if b[1] - b[0] == W or 2 * (b[1] - b[0]) >= W or len(bounds) == 1]
        for l in range(L):
            h = np.array([s["layers"][l]["hottest_share"] for s in steps])
            got = summary["layers"][l]
            means = [h[a:b].mean() for a, b in bounds]
            ratios = []
            for a, b in bounds:
                c = np.sum([steps[i]["layers"][l]["counts"] for i in range(a, b)], axis=0)
                ratios.append(c.max() / c.sum())
            want = [h.mean(), np.percentile(h, 99), h.max(), min(means), max(means), min(ratios), max(ratios),
                    E * np.percentile(h, 99)]
            have = [got["hottest_share"]["mean"], got["hottest_share"]["p99"], got["hottest_share"]["max"],
                    got["window_mean_hottest_share"]["min"], got["window_mean_hottest_share"]["max"],
                    got["window_hottest_hit_ratio"]["min"], got["window_hottest_hit_ratio"]["max"],
                    got["p99_capacity_factor"]]
            ok &= all(abs(a - b) <= 2e-5 * max(abs(b), 1e-9) for a, b in zip(have, want))
            if l == 0:
                line = "layer 0: hottest share mean %.3f P99 %.3f max %.3f; windows %.3f-%.3f; hit ratio %.3f-%.3f; P99 cf %.2f" % tuple(want)
        report(ok, "%s: per layer summaries equal numpy's on the records (%s)" % (what, line))

    out = os.path.join(work, "gen.jsonl")
    r = subprocess.run([moe, "generate", "--ckpt", ck, "--prompt", "a long enough prompt for two chunks " * 2,
                        "-n", "50", "--prefill-chunk", "16", "--stats-out", out, "--stats-window", "8",
                        "--temperature", "0"], capture_output=True, text=True, errors="replace")
    report(r.returncode == 0 and "serving telemetry" in r.stderr and "P99 cf" in r.stderr,
           "generate --stats-out: exit 0, the summary on stderr")
    check(out, 8, what="generate")
    out = os.path.join(work, "eval.jsonl")
    r = subprocess.run([moe, "eval", "--ckpt", ck, "--data", os.path.join(work, "data", "val.bin"),
                        "--seq-len", "32", "--max-windows", "20", "--stats-out", out, "--stats-window", "6"],
                       capture_output=True, text=True)
    recs = [json.loads(l) for l in open(out)] if os.path.exists(out) else []
    report(r.returncode == 0 and r.stdout.startswith("loss ") and len(recs) == 21 and
           all(s["tokens"] == 32 and s["kind"] == "eval" for s in recs[:-1]),
           "eval --stats-out: the loss on stdout, one step per window of 32 tokens (20)")
    check(out, 6, what="eval")
    # past the first 256 steps the record arrays grow (they once stayed at 256 and step 257
    # wrote past them: ASan, scripts/bench_serve)
    out = os.path.join(work, "eval300.jsonl")
    r = subprocess.run([moe, "eval", "--ckpt", ck, "--data", os.path.join(work, "data", "val.bin"),
                        "--seq-len", "8", "--max-windows", "300", "--stats-out", out, "--stats-window", "64"],
                       capture_output=True, text=True)
    recs = [json.loads(l) for l in open(out)] if os.path.exists(out) else []
    report(r.returncode == 0 and len(recs) == 301, "eval --stats-out over 300 steps (> 256): %d records, exit %d"
           % (len(recs), r.returncode))
    if len(recs) == 301:
        check(out, 64, what="eval x 300")
    # batched generation: 4 prompts decoded together give each one's lone text (greedy, and
    # sampled with seed + b), and the decode steps route 4 tokens each
    prompts = ["To be or not", "the quick brown fox", "ROMEO:", "wherefore art thou, and why"]
    pf = os.path.join(work, "prompts.txt")
    with open(pf, "w") as f:
        f.write("\n".join(prompts) + "\n")
    for temp, seed in (("0", 1), ("0.8", 5)):
        out = os.path.join(work, "batch.jsonl")
        r = subprocess.run([moe, "generate", "--ckpt", ck, "--prompts", pf, "--batch", "4", "-n", "30",
                            "--temperature", temp, "--seed", str(seed), "--stats-out", out],
                           capture_output=True)
        texts = r.stdout.split(b"\n\n")[:4] if r.returncode == 0 else []
        lone = []
        for b, p in enumerate(prompts):
            q = subprocess.run([moe, "generate", "--ckpt", ck, "--prompt", p, "-n", "30", "--temperature",
                                temp, "--seed", str(seed + b)], capture_output=True)
            lone.append(q.stdout.rstrip(b"\n"))
        steps = [json.loads(l) for l in open(out)][:-1] if r.returncode == 0 else []
        decode = [x["tokens"] for x in steps if x["kind"] == "decode"]
        report(len(texts) == 4 and texts == lone and decode and set(decode) == {4},
               "generate --prompts --batch 4 (temperature %s): each sequence's text == its lone run with "
               "seed + b; %d decode steps of 4 tokens" % (temp, len(decode)))

    r = subprocess.run([moe, "eval", "--ckpt", ck, "--data", os.path.join(work, "data", "val.bin"),
                        "--stats-out", "/nonexistent/x.jsonl"], capture_output=True, text=True)
    report(r.returncode != 0 and "/nonexistent/x.jsonl" in r.stderr, "a --stats-out that cannot be created is named")
    report.exit()


main()
