#!/usr/bin/env python3
"""Expert-load plots of a moe.c run (RUN_DIR/expert_load.jsonl; docs/expert-load.md "Plots").

    scripts/plot_load.py RUN_DIR --out DIR [--alert 1.5] [--smooth N]

Writes into DIR (PNG, fixed sizes so that tests can check them):
    load_heatmap_layer{L}.png  1000x400  token share per expert over steps (counts before dropping),
                                         one colour scale for every layer (comparable)
    max_over_mean.png          1000x500  max/mean load per layer over steps, with the alert line
    drop_fraction.png          1000x500  dropped / routed assignments per layer over steps
    aux_z.png                  1000x800  aux and z loss per layer over steps
    entropy.png                1000x500  router entropy (nats) per layer, and log E
  when the log has them:
    coactivation_layer{L}.png   600x500  co-activation lift: P(i and j) / (P(i) P(j)) over the
                                         run (1 = independent; one scale for every layer)
    rank_load.png              1000x800  expert parallelism: rows each rank's experts received per
                                         step (all layers) and each rank's seconds in the exchanges
    capacity.png               1000x800  capacity runs (metrics.jsonl capacity_factor > 0): the
                                         factor used per step with "auto"'s decisions marked, and
                                         the step's dropped fraction (all layers)
--smooth N draws an N-step moving average over the raw curves (thin) of the line plots.

Works on a run in progress: a partial last line is ignored (a note). A damaged log (either)
is an error naming the file and the line, exit 1, before anything is drawn (what is refused:
--help, scripts/moe_logs.py). Exit 77 when matplotlib cannot be imported (Debian: apt-get
install python3-matplotlib; run with /usr/bin/python3).
"""
import argparse
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from moe_logs import HELP, LogError, dropped, read_log, run_config  # noqa: E402

DPI = 100
HEATMAP_SIZE = (10, 4)  # inches: 1000 x 400 px at DPI
LINE_SIZE = (10, 5)     # 1000 x 500 px
AUX_Z_SIZE = (10, 8)    # 1000 x 800 px
COACT_SIZE = (6, 5)     # 600 x 500 px
PROG = "plot_load.py"


def number(v):
    """A logged number; null (NaN/Inf in the run) and absent values become NaN."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return math.nan
    return float(v)


def load_layers(records):
    """{layer: dict of per-step arrays} from the (checked) expert_load.jsonl records."""
    import numpy as np

    layers = {}
    E = None
    for r in records:
        step, layer, counts = r["step"], int(r["layer"]), r["counts"]
        E = len(counts)
        d = layers.setdefault(layer, {k: [] for k in
                                      ("step", "counts", "dropped", "aux", "z", "entropy")})
        d.setdefault("coact", None)
        d.setdefault("ranks", {})
        co = r.get("coactivation")
        if isinstance(co, list) and len(co) == E * (E - 1) // 2:
            d["coact"] = [a + b for a, b in zip(d["coact"], co)] if d["coact"] else list(co)
        rows, wait = r.get("received_rows"), r.get("exchange_wait_s")
        if isinstance(rows, list) and isinstance(wait, list) and len(rows) == len(wait):
            d["ranks"][int(step)] = (rows, wait)
        d.setdefault("tokens", []).append(number(r.get("tokens")))
        d["step"].append(int(step))
        d["counts"].append(counts)
        d["dropped"].append(number(dropped(r)))
        for k in ("aux", "z", "entropy"):
            d[k].append(number(r.get(k)))
    out = {}
    for layer, d in sorted(layers.items()):
        extra = {"coact": d.pop("coact"), "ranks": d.pop("ranks")}
        a = {k: np.asarray(v, dtype=float) for k, v in d.items()}
        a.update(extra)
        routed = a["counts"].sum(axis=1)
        mean = routed / E
        with np.errstate(divide="ignore", invalid="ignore"):
            a["share"] = np.where(routed[:, None] > 0, a["counts"] / routed[:, None], 0.0)
            a["max_over_mean"] = np.where(mean > 0, a["counts"].max(axis=1) / mean, 0.0)
            a["drop_fraction"] = np.where(routed > 0, a["dropped"] / routed, 0.0)
        out[layer] = a
    return out, E


def TOPK(a, E):
    """top_k from the records: the assignments of a step over its tokens (every token k)."""
    return int(round(a["counts"][0].sum() / a["tokens"][0])) if a["tokens"][0] > 0 else 1


def main():
    ap = argparse.ArgumentParser(description="Expert-load plots of a moe.c run.", epilog=HELP)
    ap.add_argument("run_dir", help="the run directory (log.dir of the config)")
    ap.add_argument("--out", required=True, help="folder for the PNG files (created)")
    ap.add_argument("--alert", type=float, default=1.5,
                    help="max/mean load alert line (default 1.5)")
    ap.add_argument("--smooth", type=int, default=0,
                    help="draw an N-step moving average over the line plots (default 0: off)")
    args = ap.parse_args()

    # the logs first: a damaged one is an error with or without matplotlib
    try:
        cfg = run_config(args.run_dir)
        load = read_log(args.run_dir, "expert_load.jsonl", PROG, cfg, required=True)
        if not load:
            raise LogError(f"{os.path.join(args.run_dir, 'expert_load.jsonl')}: no expert-load records")
        metrics = read_log(args.run_dir, "metrics.jsonl", PROG, cfg, required=False)
    except LogError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator
        import numpy  # noqa: F401 (matplotlib needs it too)
    except ImportError as e:
        print(f"{PROG}: matplotlib is not available ({e}); "
              "install python3-matplotlib and run with /usr/bin/python3", file=sys.stderr)
        return 77

    layers, E = load_layers(load)
    try:
        os.makedirs(args.out, exist_ok=True)
    except OSError as e:
        print(f"{PROG}: error: {args.out}: {e.strerror}", file=sys.stderr)
        return 1

    def save(fig, name):
        fig.savefig(os.path.join(args.out, name), dpi=DPI)  # no bbox_inches: fixed size
        plt.close(fig)

    def legend(ax):
        if len(layers) <= 16:
            ax.legend(fontsize="small", ncol=max(1, (len(layers) + 7) // 8))

    title = os.path.basename(os.path.normpath(args.run_dir))

    # one colour scale for every layer: 0 .. the largest share any layer reached
    vmax = max(float(a["share"].max()) for a in layers.values()) or 1.0
    for layer, a in layers.items():
        fig, ax = plt.subplots(figsize=HEATMAP_SIZE, dpi=DPI, constrained_layout=True)
        s = a["step"]
        im = ax.imshow(a["share"].T, aspect="auto", origin="lower", interpolation="nearest",
                       cmap="viridis", vmin=0, vmax=vmax,
                       extent=(s[0] - 0.5, s[-1] + 0.5, -0.5, E - 0.5))
        fig.colorbar(im, ax=ax, label="token share")
        ax.set_xlabel("step")
        ax.set_ylabel("expert")
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(f"{title}: layer {layer}, share of the step's assignments per expert "
                     f"(before dropping; uniform = {1 / E:.3g})")
        save(fig, f"load_heatmap_layer{layer}.png")

    def curve(ax, x, y, label):
        """The raw curve; with --smooth, thin, under its moving average in the same colour."""
        n = args.smooth
        if n > 1 and len(y) >= n:
            line, = ax.plot(x, y, linewidth=0.6, alpha=0.35)
            k = numpy.ones(n) / n
            ax.plot(x[n - 1:], numpy.convolve(y, k, mode="valid"), linewidth=1.5,
                    color=line.get_color(), label=f"{label} ({n}-step mean)")
        else:
            ax.plot(x, y, linewidth=1, label=label)

    def per_layer(name, key, ylabel, what, extra=None):
        fig, ax = plt.subplots(figsize=LINE_SIZE, dpi=DPI, constrained_layout=True)
        for layer, a in layers.items():
            curve(ax, a["step"], a[key], f"layer {layer}")
        if extra:
            extra(ax)
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{title}: {what}")
        ax.grid(alpha=0.3)
        legend(ax)
        save(fig, name)

    per_layer("max_over_mean.png", "max_over_mean", "max / mean expert load",
              "max/mean expert load per step (counts before dropping)",
              lambda ax: ax.axhline(args.alert, color="red", linestyle="--", linewidth=1,
                                    label=f"alert {args.alert:g}"))
    per_layer("drop_fraction.png", "drop_fraction", "dropped / routed assignments",
              "fraction of the assignments dropped by the capacity limit")
    per_layer("entropy.png", "entropy", "router entropy (nats)", "router entropy",
              lambda ax: ax.axhline(math.log(E), color="gray", linestyle="--", linewidth=1,
                                    label=f"log E = {math.log(E):.3f} (uniform)"))

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=AUX_Z_SIZE, dpi=DPI, sharex=True,
                                   constrained_layout=True)
    for layer, a in layers.items():
        curve(ax1, a["step"], a["aux"], f"layer {layer}")
        curve(ax2, a["step"], a["z"], f"layer {layer}")
    ax1.set_ylabel("aux loss")
    ax1.set_title(f"{title}: load-balancing aux loss and router z-loss")
    ax2.set_ylabel("z loss")
    ax2.set_xlabel("step")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        legend(ax)
    save(fig, "aux_z.png")
    n_plots = len(layers) + 4

    # co-activation lift: P(i and j) / (P(i) P(j)), P from the run's counts (k of E per token)
    lifts = {}
    for layer, a in layers.items():
        if a["coact"] is None:
            continue
        tokens = a["counts"].sum() / max(1, TOPK(a, E))
        p = a["counts"].sum(axis=0) / tokens  # P(expert e in a token's top-k)
        m = numpy.full((E, E), numpy.nan)
        it = iter(a["coact"])
        for i in range(E):
            for j in range(i + 1, E):
                c = next(it)
                if p[i] > 0 and p[j] > 0:
                    m[i, j] = m[j, i] = (c / tokens) / (p[i] * p[j])
        lifts[layer] = m
    if lifts:
        top = max((float(numpy.nanmax(m)) for m in lifts.values() if numpy.isfinite(m).any()),
                  default=1.0)  # none finite: no expert had a token (or E = 1)
        for layer, m in lifts.items():
            fig, ax = plt.subplots(figsize=COACT_SIZE, dpi=DPI, constrained_layout=True)
            im = ax.imshow(m, origin="lower", interpolation="nearest", cmap="magma", vmin=0,
                           vmax=max(top, 1.0))
            fig.colorbar(im, ax=ax, label="P(i and j) / (P(i) P(j))")
            ax.set_xlabel("expert j")
            ax.set_ylabel("expert i")
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))
            ax.set_title(f"{title}: layer {layer}, co-activation lift (1 = independent)",
                         fontsize="medium")
            save(fig, f"coactivation_layer{layer}.png")
            n_plots += 1

    # expert parallelism: per rank, rows received and seconds in the exchanges, all layers
    steps = sorted(set().union(*[set(a["ranks"]) for a in layers.values()]))
    if steps:
        R = len(next(iter(next(a for a in layers.values() if a["ranks"])["ranks"].values()))[0])
        rows = numpy.zeros((len(steps), R))
        wait = numpy.zeros((len(steps), R))
        for a in layers.values():
            for i, st in enumerate(steps):
                if st in a["ranks"]:
                    rows[i] += a["ranks"][st][0]
                    wait[i] += a["ranks"][st][1]
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=AUX_Z_SIZE, dpi=DPI, sharex=True,
                                       constrained_layout=True)
        x = numpy.asarray(steps, dtype=float)
        for r in range(R):
            curve(ax1, x, rows[:, r], f"rank {r}")
            curve(ax2, x, wait[:, r], f"rank {r}")
        ax1.set_ylabel("rows its experts received")
        ax1.set_title(f"{title}: expert parallelism, per rank (all layers): the hot rank's rows "
                      "and the others' waiting")
        ax2.set_ylabel("seconds in the exchanges")
        ax2.set_xlabel("step")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            if R <= 16:
                ax.legend(fontsize="small", ncol=max(1, (R + 7) // 8))
        save(fig, "rank_load.png")
        n_plots += 1

    # capacity: the factor per step (a schedule's or auto's) and what it dropped
    cap = [(r["step"], number(r.get("capacity_factor"))) for r in metrics]
    if any(f > 0 for _, f in cap):
        drop = {}
        for a in layers.values():
            for st, dr, ro in zip(a["step"], a["dropped"], a["counts"].sum(axis=1)):
                d = drop.setdefault(int(st), [0.0, 0.0])
                d[0] += dr
                d[1] += ro
        fig, (ax1, ax2) = plt.subplots(2, 1, figsize=AUX_Z_SIZE, dpi=DPI, sharex=True,
                                       constrained_layout=True)
        ax1.plot([c[0] for c in cap], [c[1] for c in cap], linewidth=1.2, label="capacity factor")
        dec = [(r["step"], r["capacity_decision"]) for r in metrics
               if isinstance(r.get("capacity_decision"), dict)]
        if dec:
            ax1.scatter([d[0] for d in dec], [number(d[1].get("new")) for d in dec], s=18,
                        color="black", zorder=3, label="auto: decision (new factor)")
            ax1.scatter([d[0] for d in dec], [number(d[1].get("p99_need")) for d in dec],
                        s=14, marker="x", color="red", zorder=3,
                        label="auto: P99 need of the window (before clamping)")
        ax1.set_ylabel("capacity factor")
        ax1.set_title(f"{title}: capacity factor per step and the assignments it dropped")
        xs = sorted(drop)
        curve(ax2, numpy.asarray(xs, dtype=float),
              numpy.asarray([drop[x][0] / drop[x][1] if drop[x][1] else 0 for x in xs]),
              "dropped / routed, all layers")
        ax2.set_ylabel("dropped fraction")
        ax2.set_xlabel("step")
        for ax in (ax1, ax2):
            ax.grid(alpha=0.3)
            ax.legend(fontsize="small")
        save(fig, "capacity.png")
        n_plots += 1

    print(f"wrote {n_plots} plots to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
