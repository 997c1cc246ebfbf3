#!/usr/bin/env python3
"""scripts/tensorboard.py against the run it converts: trains a tiny run, converts it (once, and
with --follow on a live run), then reads the event files back (TFRecord framing, the Event
protos of tensorboardX) and checks: train/loss at every step equals metrics.jsonl's (float32),
val/loss is there, every layer's expert_share histogram at a step holds the step's counts /
their sum, the heatmap images exist, time/* shares are in [0, 1]; --follow ends by itself.
Exits 77 without numpy or tensorboardX (the writer library).

  tensorboard_check.py MOE SCRIPT WORKDIR
"""
import glob
import json
import os
import struct
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "train"))
from runlib import Report, fresh_work  # noqa: E402

try:
    import numpy as np
    from tensorboardX.proto import event_pb2
except ImportError:
    print("tensorboard_check: numpy or tensorboardX missing: skipped")
    sys.exit(77)


def events(folder):
    out = []
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        data = open(path, "rb").read()
        i = 0
        while i < len(data):
            n = struct.unpack("<Q", data[i:i + 8])[0]
            e = event_pb2.Event()
            e.ParseFromString(data[i + 12:i + 12 + n])
            out.append(e)
            i += 12 + n + 4
    return out


def main():
    moe, script, work = sys.argv[1:4]
    fresh_work(work, 8, 40000)
    cfg = os.path.join(work, "t.cfg")
    with open(cfg, "w") as f:
        f.write("""model = { vocab_size = 256; d_model = 32; n_layers = 2; n_heads = 4; d_ff = 32; n_experts = 8;
          top_k = 2; max_seq_len = 32; capacity_factor = 1.0; };
train = { steps = 120; batch_size = 2; seq_len = 32; warmup_steps = 0; eval_interval = 60; threads = 1; };
data = { dir = "%s/data"; text = ["%s/text.txt"]; };
log = { dir = "%s/run"; interval = 1000; };
""" % (work, work, work))
    py = sys.executable
    report = Report()


    # --follow on a live run: started first, it ends by itself once the run logged step 120
    follow = subprocess.Popen([py, script, os.path.join(work, "run"), "--out", os.path.join(work, "tb_follow"),
                               "--follow", "--interval", "0.2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True)
    subprocess.run([moe, "train", cfg], check=True, capture_output=True)
    try:
        fout, _ = follow.communicate(timeout=60)
        frc = follow.returncode
    except subprocess.TimeoutExpired:
        follow.kill()
        fout, frc = "timed out", None
    r = subprocess.run([py, script, os.path.join(work, "run"), "--out", os.path.join(work, "tb")],
                       capture_output=True, text=True)
    report(r.returncode == 0, "converted: %s" % (r.stdout.strip() or r.stderr[-500:]))
    metrics = [json.loads(l) for l in open(os.path.join(work, "run", "metrics.jsonl"))]
    loads = [json.loads(l) for l in open(os.path.join(work, "run", "expert_load.jsonl"))]
    for tag, folder in (("once", "tb"), ("--follow", "tb_follow")):
        ev = events(os.path.join(work, folder))
        scal, hist, imgs = {}, {}, set()
        for e in ev:
            for v in e.summary.value:
                if v.HasField("histo"):
                    hist[(v.tag, e.step)] = list(v.histo.bucket)
                elif v.HasField("image"):
                    imgs.add((v.tag, e.step))
                else:
                    scal[(v.tag, e.step)] = v.simple_value
        ok = all(scal.get(("train/loss", m["step"])) == float(np.float32(m["loss"])) for m in metrics)
        ok &= ("val/loss", 60) in scal and ("val/loss", 120) in scal
        ok &= all(0 <= v <= 1 for (t, s), v in scal.items() if t.startswith("time/"))
        ok &= any(t.startswith("time/") for t, s in scal)
        for rec in loads:
            c = np.array(rec["counts"], dtype=float)
            got = hist.get(("layer%d/expert_share" % rec["layer"], rec["step"]))
            ok &= got is not None and np.allclose(got, c / c.sum(), rtol=1e-6)
        ok &= {("layer0/share_heatmap", 50), ("layer1/share_heatmap", 100)} <= imgs
        report(ok, "%s: train/loss at all %d steps == metrics.jsonl, val/loss, time/* shares, %d expert_share "
               "histograms == counts / sum, heatmaps at steps 50, 100" % (tag, len(metrics), len(loads)))
    report(frc == 0, "--follow on the live run ended by itself (exit %s): %s" % (frc, fout.strip()[-200:]))
    report.exit()


main()
