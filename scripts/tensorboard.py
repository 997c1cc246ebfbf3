#!/usr/bin/env python3
"""A run's logs as TensorBoard event files (tensorboardX, the maintained standalone writer):

  scripts/tensorboard.py RUN_DIR [--out DIR] [--follow] [--interval 2]
  tensorboard --logdir DIR          # (default DIR: RUN_DIR/tensorboard)

From metrics.jsonl, per step: train/{loss, ce, aux, z, lr, grad_norm, tokens_per_s, step_s,
max_over_mean, drop_frac, capacity_factor}, val/loss, time/<phase> (the "time" breakdown as
a share of step_s) and time_s/{validation, checkpoint} (seconds). From expert_load.jsonl, per MoE layer: layer<L>/{max_over_mean, cv,
drop_frac, entropy, aux, z, exchange_bytes, exchange_s}, the per-expert token share as a
histogram (layer<L>/expert_share: bucket e holds expert e's share) and, every 50 steps, an
image of the share per expert over the last 50 steps (layer<L>/share_heatmap, one colour
scale for every layer: 0 .. 2/E). --follow keeps reading while the run writes (a partial last
line waits for its end) and stops once the run has logged train.steps (from its config.cfg),
or on Ctrl-C. Needs `pip install tensorboardX` (scripts/install_hf5.sh puts it in
/opt/moe-hf5); exits 77 when it is missing.
"""
import argparse
import json
import os
import re
import sys
import time

try:
    import numpy as np
    from tensorboardX import SummaryWriter
except ImportError:
    print("tensorboard.py: needs numpy and tensorboardX (pip install tensorboardX)", file=sys.stderr)
    sys.exit(77)

try:
    import PIL  # noqa: F401 (tensorboardX's images need it)
    HAVE_PIL = True
except ImportError:
    HAVE_PIL = False
    print("tensorboard.py: no pillow: the share heatmaps are left out (pip install pillow)", file=sys.stderr)

SCALARS = ["loss", "ce", "aux", "z", "lr", "grad_norm", "tokens_per_s", "step_s", "max_over_mean",
           "drop_frac", "capacity_factor"]
LAYER_SCALARS = ["max_over_mean", "cv", "entropy", "aux", "z", "exchange_bytes", "exchange_s"]
HEATMAP_EVERY = 50


class Follower:
    """The complete lines appended to a file since the last call."""

    def __init__(self, path):
        self.path, self.pos, self.rest = path, 0, ""

    def lines(self):
        if not os.path.exists(self.path):
            return []
        with open(self.path) as f:
            f.seek(self.pos)
            data = f.read()
            self.pos = f.tell()
        data = self.rest + data
        parts = data.split("\n")
        self.rest = parts.pop()  # a partial last line: kept for the next call
        return [json.loads(p) for p in parts if p.strip()]


def run_steps(run):
    """train.steps of the run's config.cfg (None when unreadable)."""
    try:
        text = open(os.path.join(run, "config.cfg")).read()
        m = re.search(r"train = \{[^}]*?\bsteps = (\d+)", text, re.S)
        return int(m.group(1)) if m else None
    except OSError:
        return None


def write_metrics(w, rec):
    step = rec["step"]
    if rec.get("skipped"):
        w.add_scalar("train/skipped_total", rec.get("skipped_total", 0), step)
        return
    for k in SCALARS:
        if isinstance(rec.get(k), (int, float)):
            w.add_scalar("train/" + k, rec[k], step)
    if isinstance(rec.get("val_loss"), (int, float)):
        w.add_scalar("val/loss", rec["val_loss"], step)
    t = rec.get("time")
    if isinstance(t, dict) and rec.get("step_s"):
        for k, v in t.items():  # the step's phases as shares; validation and saves in seconds
            if k in ("validation", "checkpoint"):
                w.add_scalar("time_s/" + k, v, step)
            else:
                w.add_scalar("time/" + k, v / rec["step_s"], step)


def write_load(w, rec, windows):
    step, l, counts = rec["step"], rec["layer"], rec["counts"]
    E, total = len(counts), sum(counts)
    for k in LAYER_SCALARS:
        if isinstance(rec.get(k), (int, float)):
            w.add_scalar("layer%d/%s" % (l, k), rec[k], step)
    if total:
        w.add_scalar("layer%d/drop_frac" % l, rec.get("dropped", 0) / total, step)
        share = [c / total for c in counts]
        # bucket e = expert e: the histogram is the load profile of the step
        w.add_histogram_raw("layer%d/expert_share" % l, min=0, max=E, num=E, sum=float(sum(
            e * s for e, s in enumerate(share))), sum_squares=float(sum(e * e * s for e, s in enumerate(share))),
            bucket_limits=[e + 1.0 for e in range(E)], bucket_counts=share, global_step=step)
        win = windows.setdefault(l, [])
        win.append(share)
        if len(win) == HEATMAP_EVERY:
            if HAVE_PIL:
                img = np.clip(np.array(win).T * (E / 2.0), 0, 1)  # [E, steps], one scale: 0 .. 2/E
                # (grey 0.5 = a balanced 1/E; white = twice that or more) pixels enlarged to
                # at least 8 x 4 per (expert, step), so TensorBoard shows more than a smudge
                img = np.repeat(np.repeat(img, max(1, 64 // E), axis=0), 4, axis=1)
                w.add_image("layer%d/share_heatmap" % l, img[None, :, :], step, dataformats="CHW")
            windows[l] = []


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("run")
    ap.add_argument("--out")
    ap.add_argument("--follow", action="store_true")
    ap.add_argument("--interval", type=float, default=2.0)
    a = ap.parse_args()
    metrics = Follower(os.path.join(a.run, "metrics.jsonl"))
    load = Follower(os.path.join(a.run, "expert_load.jsonl"))
    if not os.path.exists(metrics.path) and not a.follow:
        sys.exit("tensorboard.py: %s: no such file (a run directory?)" % metrics.path)
    out = a.out or os.path.join(a.run, "tensorboard")
    w = SummaryWriter(logdir=out)
    windows, last, steps = {}, 0, run_steps(a.run)
    try:
        while True:
            for rec in metrics.lines():
                write_metrics(w, rec)
                last = max(last, rec["step"])
            for rec in load.lines():
                write_load(w, rec, windows)
            w.flush()
            steps = steps or run_steps(a.run)
            if not a.follow or (steps and last >= steps):
                break
            time.sleep(a.interval)
    except KeyboardInterrupt:
        pass
    w.close()
    print("tensorboard.py: %s -> %s (%d steps)" % (a.run, out, last))


main()
