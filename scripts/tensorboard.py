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

The logs are checked before anything is written (each poll's records with --follow): a damaged
log is refused with one message naming the file and the line, exit 1 (what is refused:
--help, scripts/moe_logs.py).
"""
import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_logs import HELP, Log, LoadChecker, LogError, dropped, run_config  # noqa: E402

PROG = "tensorboard.py"
np = SummaryWriter = None  # imported once the logs passed their checks (writer())
HAVE_PIL = False

SCALARS = ["loss", "ce", "aux", "z", "lr", "grad_norm", "tokens_per_s", "step_s", "max_over_mean",
           "drop_frac", "capacity_factor"]
LAYER_SCALARS = ["max_over_mean", "cv", "entropy", "aux", "z", "exchange_bytes", "exchange_s"]
HEATMAP_EVERY = 50


def writer(out):
    """A SummaryWriter on out; exits 77 without numpy or tensorboardX."""
    global np, SummaryWriter, HAVE_PIL
    try:
        import numpy as np
        from tensorboardX import SummaryWriter
    except ImportError:
        print(f"{PROG}: needs numpy and tensorboardX (pip install tensorboardX)", file=sys.stderr)
        sys.exit(77)
    try:
        import PIL  # noqa: F401 (tensorboardX's images need it)
        HAVE_PIL = True
    except ImportError:
        print(f"{PROG}: no pillow: the share heatmaps are left out (pip install pillow)", file=sys.stderr)
    try:
        return SummaryWriter(logdir=out)
    except OSError as e:
        raise LogError(f"{out}: cannot write: {e.strerror or e}")


def write_metrics(w, rec):
    step = rec["step"]
    if rec.get("skipped"):
        w.add_scalar("train/skipped_total", rec.get("skipped_total") or 0, step)
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
        d = dropped(rec)
        if d is not None:
            w.add_scalar("layer%d/drop_frac" % l, d / total, step)
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
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], epilog=HELP)
    ap.add_argument("run")
    ap.add_argument("--out")
    ap.add_argument("--follow", action="store_true")
    ap.add_argument("--interval", type=float, default=2.0)
    a = ap.parse_args()
    try:
        return convert(a)
    except LogError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1


def convert(a):
    cfg = run_config(a.run)
    metrics, load = Log(a.run, "metrics.jsonl", PROG, cfg), Log(a.run, "expert_load.jsonl", PROG, cfg)
    out = a.out or os.path.join(a.run, "tensorboard")
    w, windows, last, steps, final = None, {}, 0, cfg.get("steps"), not a.follow
    try:
        while True:
            # each poll's records are checked before any of them is written
            recs = metrics.read(final), load.read(final)
            if not metrics.exists and not a.follow:
                raise LogError(f"{metrics.path}: no such file (a run directory?)")
            if w is None:
                w = writer(out)
            for rec in recs[0]:
                write_metrics(w, rec)
                last = max(last, rec["step"])
            for rec in recs[1]:
                write_load(w, rec, windows)
            w.flush()
            if final:
                break
            if not steps:  # a run starting: its config.cfg may come later
                cfg = run_config(a.run)
                steps = cfg.get("steps")
                if not load.check.last:  # no record checked yet: the checks take the config
                    load.check = LoadChecker(load.path, cfg)
            # the run's last step is logged: once more to the end of the files (a last line
            # without its newline included), then done
            final = bool(steps and last >= steps)
            if not final:
                time.sleep(a.interval)
    except KeyboardInterrupt:
        pass
    finally:
        if w is not None:
            w.close()
    print("%s: %s -> %s (%d steps)" % (PROG, a.run, out, last))
    return 0


sys.exit(main())
