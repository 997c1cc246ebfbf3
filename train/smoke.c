// moe smoke: N training steps of a config (no checkpoint; logs in RUN_DIR/smoke), then
//   the expert-load table per layer (token share per expert, max/mean, CV, drops),
//   the router-logit distribution (mean, std, max |z|, mean logsumexp) of the last step,
//   tokens dropped, the exchange volume per step and rank,
//   parameter / gradient / optimizer / activation memory of the full config,
//   the estimated tokens/s,
// and exits 1 when an alert fires: a layer's max/mean load (over the smoke's steps) above
// log.load_alert, a dead expert, or a skipped (non-finite) step.
#include "train/smoke.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "train/config.h"
#include "train/trainer.h"

static void human_bytes(char *buf, size_t n, double b) {
    const char *unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) b /= 1024, u++;
    snprintf(buf, n, "%.1f %s", b, unit[u]);
}

static const char *usage =
    "usage: moe smoke CONFIG [--steps N] [--set group.key=value]...\n"
    "\n"
    "  Runs the first N steps of the config (its schedule unchanged; no checkpoint; logs in\n"
    "  log.dir/smoke) and prints the expert-load table per layer, the router-logit distribution\n"
    "  of the last step, tokens dropped, the exchange volume, the memory of the full config and\n"
    "  the median tokens/s; then the gate (README \"moe smoke\"): exit 1, each failed check\n"
    "  on a line saying why (a skipped step, router logits out of range, a collapsed or dead\n"
    "  expert, a sustained load alert), else 0.\n"
    "  --steps N              steps to run, in [1, 1000000] (default 10)\n"
    "  --set group.key=value  override a config key (as for moe train)\n";

// A usage error: the message and the usage on stderr, exit status 2.
static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "moe smoke: error: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n\n%s", usage);
    return 2;
}

int smoke_main(int argc, char **argv) {
    const char *path = NULL;
    long steps = 10;
    char **sets = calloc((size_t)argc + 1, sizeof(char *));
    int n_set = 0;
    if (!sets) moe_fatal("out of memory");
    for (int i = 0; i < argc; i++) { // options and CONFIG in any order
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            fputs(usage, stdout);
            free(sets);
            return 0;
        }
        if ((!strcmp(a, "--steps") || !strcmp(a, "--set")) && i + 1 >= argc) {
            free(sets);
            return usage_error("'%s' needs a value", a);
        }
        if (!strcmp(a, "--steps")) {
            char *end;
            steps = strtol(argv[++i], &end, 10);
            if (*end || end == argv[i] || steps < 1 || steps > 1000000) {
                free(sets);
                return usage_error("--steps '%s': expected an integer in [1, 1000000]", argv[i]);
            }
        } else if (!strcmp(a, "--set")) {
            sets[n_set++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            sets[n_set++] = argv[i] + 6;
        } else if (a[0] == '-' && a[1]) {
            free(sets);
            return usage_error("unknown option '%s'", a);
        } else if (path) {
            free(sets);
            return usage_error("more than one CONFIG (and '%s')", a);
        } else {
            path = a;
        }
    }
    if (!path) {
        free(sets);
        return usage_error("a CONFIG file is required%s", "");
    }
    moe_train_config *cfg = malloc(sizeof *cfg);
    if (!cfg || moe_train_config_load(cfg, path, n_set, sets)) moe_fatal("%s", moe_last_error());
    free(sets);
    // the first N steps of the configured run: its schedule is kept (a warmup longer than
    // the smoke simply does not finish)
    const int64_t full_steps = cfg->steps;
    cfg->steps = steps;
    cfg->eval_interval = 0;
    if (cfg->eval_batches > 2) cfg->eval_batches = 2;
    size_t n = strlen(cfg->run_dir);
    if (n + 7 >= sizeof cfg->run_dir) moe_fatal("smoke: log.dir too long");
    memcpy(cfg->run_dir + n, "/smoke", 7);

    trainer_hooks hooks = {.nan_from = -1, .nan_to = -1, .no_checkpoint = 1,
                           .schedule_steps = full_steps};
    trainer_result r;
    moe_status st = trainer_run(cfg, NULL, &hooks, &r);
    if (st) moe_fatal("%s", moe_last_error());

    const int L = r.n_layers, E = r.n_experts, k = cfg->top_k;
    int alerts = 0;
    printf("\n== moe smoke: %s, %ld steps (logs: %s) ==\n", path, steps, cfg->run_dir);
    printf("\nexpert load over the %ld steps (token share per expert, %%):\n", steps);
    long dropped_all = 0, routed_all = 0;
    for (int l = 0; l < L; l++) {
        const long *c = r.routed + (size_t)l * E, *kept = r.kept + (size_t)l * E;
        long total = 0, dropped = 0, mx = 0;
        int dead = 0, hot = 0;
        for (int e = 0; e < E; e++) {
            total += c[e], dropped += c[e] - kept[e];
            if (c[e] > mx) mx = c[e], hot = e;
            dead += c[e] == 0;
        }
        double mean = (double)total / E, var = 0;
        for (int e = 0; e < E; e++) var += (c[e] - mean) * (c[e] - mean) / E;
        double mom = mean > 0 ? mx / mean : 0;
        printf("  layer %2d:", l);
        for (int e = 0; e < E; e++) printf(" %5.1f", total ? 100.0 * c[e] / total : 0.0);
        printf(" | max/mean %.2f (expert %d) cv %.2f dropped %.2f%%\n", mom, hot,
               mean > 0 ? sqrt(var) / mean : 0, total ? 100.0 * dropped / total : 0.0);
        if (mom > cfg->load_alert) {
            printf("    ALERT: layer %d expert %d has %.2fx the mean load (log.load_alert = %.2f)\n",
                   l, hot, mom, cfg->load_alert);
            alerts++;
        }
        if (dead) {
            printf("    ALERT: layer %d has %d dead expert(s):", l, dead);
            for (int e = 0; e < E; e++)
                if (!c[e]) printf(" %d", e);
            printf("\n");
            alerts++;
        }
        dropped_all += dropped, routed_all += total;
    }
    printf("\nrouter logits (last step): layer: mean std max|z| mean-logsumexp\n");
    for (int l = 0; l < L; l++) {
        const moe_stats *s = &r.last_stats[l];
        printf("  layer %2d: %8.4f %8.4f %8.4f %8.4f\n", l, s->logit_mean, s->logit_std,
               s->logit_max_abs, s->lse_mean);
    }
    printf("\ntokens dropped: %ld of %ld assignments (%.2f%%), capacity_factor %g\n", dropped_all,
           routed_all, routed_all ? 100.0 * dropped_all / routed_all : 0.0, cfg->capacity_factor);
    const double row_bytes = (double)cfg->d_model * sizeof(float);
    const double per_step = (double)cfg->batch_size * cfg->seq_len * k * cfg->grad_accum;
    printf("exchange volume per step and rank: 0 B (1 rank; with expert parallelism over R ranks "
           "each rank would send up to %.0f rows of %d floats x 2 (dispatch, combine) x %d layers"
           " x 2 (forward, backward) = %.1f MiB per step)\n",
           per_step, cfg->d_model, L, per_step * row_bytes * 4 * L / (1 << 20));
    char pb[32], gb[32], ob[32], ab[32], tb[32];
    human_bytes(pb, sizeof pb, (double)r.param_bytes);
    human_bytes(gb, sizeof gb, (double)r.grad_bytes);
    human_bytes(ob, sizeof ob, (double)r.optimizer_bytes);
    human_bytes(ab, sizeof ab, (double)r.activation_bytes);
    human_bytes(tb, sizeof tb, (double)(r.param_bytes + r.grad_bytes + r.optimizer_bytes + r.activation_bytes));
    printf("memory (fp32, as allocated): parameters %s, gradients %s, optimizer %s, activations "
           "and buffers %s: %s in all\n", pb, gb, ob, ab, tb);
    printf("estimated throughput: %.0f tokens/s (median over steps 2..%ld, %d x %d tokens x %d)\n",
           r.median_tokens_per_s, steps, cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    if (r.skipped) {
        printf("ALERT: %lld step(s) skipped for a non-finite loss or gradient\n", (long long)r.skipped);
        alerts++;
    }
    printf("\n%s\n", alerts ? "smoke: ALERTS fired (exit 1)" : "smoke: no alert");
    trainer_result_free(&r);
    free(cfg);
    return alerts ? 1 : 0;
}
