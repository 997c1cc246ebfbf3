#!/usr/bin/env python3
"""Where the time goes (layers/timing.h): metrics.jsonl's "time" per step, expert_load.jsonl's
"expert_s" per layer, log.timing = false turning both off, and moe stats' breakdown.

Checks on a tiny run of 40 steps: every phase is there and >= 0; the phases and the optimizer
add up to at least 70% and at most 101% of step_s (median over steps: the laps cover the step);
the experts' lap per layer is at most the step's experts phase, and its hottest expert's share
at least its coldest's; the checkpoint after step 20 is logged with step 21; `moe stats` prints
the breakdown and its --json shares sum to 1; with log.timing = false no record has them.
MOE_PROFILE's window (layers/profile.h): with MOE_PROFILE_FROM=31 the kernel table counts
steps 31..40 only (AdamW's calls a step as in the whole run's table, the cross-entropy's
forward 10 calls: the final evaluation's left out); a bad value is an error naming the
variable, and a window past the run's end says so instead of printing an empty table; in a
run resumed at step 21 the window of MOE_PROFILE_FROM=11 opens at step 21.

  timing.py MOE WORKDIR
"""
import json
import os
import re
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from runlib import Report, fresh_work  # noqa: E402

PHASES = ["attention", "router", "dispatch", "experts", "combine", "dense"]


def kernel_calls(table):
    return {m.group(1): int(m.group(2)) for m in re.finditer(r"^(cpu_\w+)\s+(\d+)\s", table, re.M)}


def profile_window(run, report, moe, work):
    whole = kernel_calls(run("prof", True, {"MOE_PROFILE": "1"}))
    err = run("prof", True, {"MOE_PROFILE": "1", "MOE_PROFILE_FROM": "31"})
    window = kernel_calls(err)
    report("MOE_PROFILE: CPU kernels of steps 31..40 (10 steps)," in err,
           "MOE_PROFILE_FROM=31: the table's header names steps 31..40")
    adam_w, adam = window.get("cpu_adamw_update", 0), whole.get("cpu_adamw_update", 0)
    report(adam_w > 0 and adam_w * 40 == adam * 10,
           "AdamW: %d calls in steps 31..40, %d in all 40 steps" % (adam_w, adam))
    ce_w, ce = window.get("cpu_cross_entropy_forward", 0), whole.get("cpu_cross_entropy_forward", 0)
    report(ce_w == 10 and ce > 40, "cross-entropy forward: %d calls in the window (the final "
           "evaluation's left out), %d in the whole run" % (ce_w, ce))
    r = run("prof", True, {"MOE_PROFILE": "1", "MOE_PROFILE_FROM": "3x"}, fail_ok=True)
    report(r.returncode != 0 and "MOE_PROFILE_FROM=3x" in r.stderr,
           "MOE_PROFILE_FROM=3x: exit %d, %s" % (r.returncode, r.stderr.strip()[-90:]))
    err = run("prof", True, {"MOE_PROFILE": "1", "MOE_PROFILE_FROM": "41"})
    report("the run ended before step 41" in err and "cpu_adamw_update" not in err,
           "MOE_PROFILE_FROM=41 in a 40-step run: no table, and it says why")
    # a run resumed past N: the window opens at its first step
    ckpt = os.path.join(work, "run_prof", "ckpt", "step_00000020")
    r = subprocess.run([moe, "train", os.path.join(work, "prof.cfg"), "--resume", ckpt],
                       capture_output=True, text=True,
                       env=dict(os.environ, MOE_PROFILE="1", MOE_PROFILE_FROM="11"))
    report(r.returncode == 0 and "MOE_PROFILE: CPU kernels of steps 21..40 (20 steps)," in r.stderr
           and kernel_calls(r.stderr).get("cpu_adamw_update", 0) * 40 == adam * 20,
           "MOE_PROFILE_FROM=11, resumed at step 21: the table of steps 21..40 (exit %d)"
           % r.returncode)


def main():
    moe, work = sys.argv[1], sys.argv[2]
    fresh_work(work, 2, 40000)
    report = Report()

    def run(name, timing, env=None, fail_ok=False):
        cfg = os.path.join(work, name + ".cfg")
        with open(cfg, "w") as f:
            f.write("""model = { vocab_size = 256; d_model = 64; n_layers = 2; n_heads = 4; d_ff = 64;
          n_experts = 8; top_k = 2; max_seq_len = 64; capacity_factor = 1.25; };
train = { steps = 40; batch_size = 4; seq_len = 64; warmup_steps = 0; eval_interval = 0; threads = 1; };
data = { dir = "%s/data"; text = ["%s/text.txt"]; };
log = { dir = "%s/run_%s"; interval = 100; timing = %s; };
checkpoint = { interval = 20; };
""" % (work, work, work, name, "true" if timing else "false"))
        r = subprocess.run([moe, "train", cfg, "--overwrite"], capture_output=True, text=True,
                           env=dict(os.environ, **(env or {})))
        if fail_ok:
            return r
        if r.returncode:
            sys.exit("timing: FAIL: moe train %s\n%s" % (cfg, r.stderr[-2000:]))
        if env:
            return r.stderr
        d = os.path.join(work, "run_" + name)
        return d, [json.loads(l) for l in open(os.path.join(d, "metrics.jsonl"))], \
            [json.loads(l) for l in open(os.path.join(d, "expert_load.jsonl"))]


    d, metrics, loads = run("on", True)
    keys = PHASES + ["optimizer", "exchange_wait", "validation", "checkpoint"]
    ok = all("time" in r and all(r["time"].get(k, -1) >= 0 for k in keys) for r in metrics)
    report(ok, "every metrics record has time.{%s}" % ", ".join(keys))
    cover = [sum(r["time"][k] for k in PHASES + ["optimizer"]) / r["step_s"] for r in metrics]
    med = statistics.median(cover)
    report(0.7 <= med <= 1.01 and max(cover) <= 1.01, "the phases cover %.1f%% of step_s (median; min %.1f%%, max %.1f%%)" %
           (100 * med, 100 * min(cover), 100 * max(cover)))
    by_step = {r["step"]: r for r in metrics}
    ok = all(0 <= l["expert_s"]["min"] <= l["expert_s"]["max"] <= l["expert_s"]["all"] + 1e-12 and
             l["expert_s"]["all"] <= by_step[l["step"]]["time"]["experts"] + 1e-9 for l in loads)
    report(ok, "expert_s per layer: min <= max <= the layer's experts time <= the step's experts phase")
    report(by_step[21]["time"]["checkpoint"] > 0 and by_step[20]["time"]["checkpoint"] == 0,
           "the save after step 20 is logged with step 21 (%.4f s)" % by_step[21]["time"]["checkpoint"])
    r = subprocess.run([moe, "stats", d], capture_output=True, text=True)
    report(r.returncode == 0 and "time per step:" in r.stdout and "experts " in r.stdout,
           "moe stats prints the breakdown")
    r = subprocess.run([moe, "stats", d, "--json"], capture_output=True, text=True)
    share = json.loads(r.stdout)["time"]["share"]
    total = sum(v for k, v in share.items() if k != "exchange_wait")
    report(abs(total - 1) < 1e-9, "moe stats --json: the shares (phases, optimizer, other) sum to %.12f" % total)
    profile_window(run, report, moe, work)
    d, metrics, loads = run("off", False)
    report(not any("time" in r for r in metrics) and not any("expert_s" in l for l in loads),
           "log.timing = false: no time, no expert_s")
    report.exit()


main()
