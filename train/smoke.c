// moe smoke: N training steps of a config (no checkpoint; logs in RUN_DIR/smoke), then
//   the expert-load table per layer (token share per expert, max/mean, CV, drops),
//   the router-logit distribution (mean, std, max |z|, mean logsumexp) of the last step,
//   tokens dropped, the exchange volume per step and rank,
//   parameter / gradient / optimizer / activation memory of the full config,
//   the estimated tokens/s,
// then the gate (README "moe smoke"): exit 1, each failed check on a line saying why, when
//   finite:   a step was skipped (non-finite loss or gradient) or a router-logit statistic
//             is not finite;
//   logits:   the largest |router logit| of the last step exceeds SMOKE_MAX_LOGIT;
//   collapse: one expert received at least SMOKE_COLLAPSE_SHARE of a layer's tokens over
//             the smoke's steps, or on every one of its steps (top_k < n_experts);
//   dead:     an expert received no token in any of the smoke's steps while the configured
//             capacity dropped assignments in that layer (dropless: a note, not a failure);
//   load:     the training alert rule (log.load_alert over log.alert_window after
//             log.alert_after, trainer.c) fired: only reachable with --steps past
//             alert_after + alert_window;
// else exit 0 with a one-line verdict. A fresh model's load within the warm-up grace, however
// skewed below collapse, is reported (a note) and does not fail the smoke.
#define _POSIX_C_SOURCE 200809L // getline
#include "train/smoke.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/moe.h"
#include "train/config/config.h"
#include "train/log.h"
#include "train/trainer.h"

// The gate's bounds. A healthy router's logits are O(1) (the z-loss keeps logsumexp small;
// 0.02 init gives |z| < 1.5 on the shipped configs); at |z| = 50 the softmax is saturated
// (e^-50 ~ 2e-22) and routing gradients vanish. Collapse: the hottest expert takes >= 95% of
// the tokens (each token sends it at most one of its top_k assignments), summed over the
// smoke's steps or on each of them. A fresh model's skew is transient: single steps of the
// shipped configs reach 99% (byte tokens route by identity before training), but the hottest
// expert moves, so the sum stays <= 83% and the least skewed step <= 73% (README).
#define SMOKE_MAX_LOGIT 50.0
#define SMOKE_COLLAPSE_SHARE 0.95

// The least per-step share of the hottest expert, per layer (min_share[L], from 1 down), read
// from the smoke's expert_load.jsonl: max/mean * top_k / n_experts of each record.
static void min_step_share(const char *run_dir, int L, int E, int k, double *min_share) {
    for (int l = 0; l < L; l++) min_share[l] = 1;
    char path[MOE_PATH_MAX + 32], *line = NULL;
    size_t cap = 0;
    snprintf(path, sizeof path, "%s/expert_load.jsonl", run_dir);
    FILE *f = fopen(path, "r");
    if (!f) moe_fatal("smoke: %s: cannot read the smoke's load log", path);
    while (getline(&line, &cap, f) > 0) {
        cJSON *o = cJSON_Parse(line);
        const cJSON *layer = cJSON_GetObjectItem(o, "layer"),
                    *mom = cJSON_GetObjectItem(o, "max_over_mean");
        if (cJSON_IsNumber(layer) && cJSON_IsNumber(mom) && layer->valuedouble >= 0 &&
            layer->valuedouble < L) {
            const double share = mom->valuedouble * k / E;
            if (share < min_share[layer->valueint]) min_share[layer->valueint] = share;
        }
        cJSON_Delete(o);
    }
    free(line);
    fclose(f);
}

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

    // the training alert rule as "stop": a sustained alert ends the smoke, and fails it
    cfg->load_alert_action = MOE_ALERT_STOP;

    trainer_hooks hooks = {
        .nan_from = -1, .nan_to = -1, .no_checkpoint = 1, .schedule_steps = full_steps};
    trainer_result r;
    moe_status st = trainer_run(cfg, NULL, &hooks, &r);
    char stopped[1024] = ""; // why the trainer stopped early: non-finite steps, or a load alert
    if (st == MOE_ENUMERIC)
        snprintf(stopped, sizeof stopped, "%s", moe_last_error());
    else if (st)
        moe_fatal("%s", moe_last_error());
    const int load_stop = stopped[0] && strstr(stopped, "train.load_alert_action") != NULL;

    const int L = r.n_layers, E = r.n_experts, k = cfg->model.moe.top_k;
    int failed = 0; // bit per check: finite, logits, collapse, dead, load
    char fails[4096] = "";
    size_t fl = 0;
#define SMOKE_FAIL(bit, ...)                                                                       \
    do {                                                                                           \
        failed |= 1 << (bit);                                                                      \
        if (fl < sizeof fails) fl += (size_t)snprintf(fails + fl, sizeof fails - fl, __VA_ARGS__); \
    } while (0)
    double worst_share = 0;
    double *min_share = malloc((size_t)(L > 0 ? L : 1) * sizeof *min_share);
    if (!min_share) moe_fatal("smoke: out of memory");
    min_step_share(cfg->run_dir, L, E, k, min_share);
    printf("\n== moe smoke: %s, %ld steps (logs: %s) ==\n", path, steps, cfg->run_dir);
    printf("\nexpert load over the %ld steps (token share per expert, %%):\n", steps);
    long dropped_all = 0, routed_all = 0;
    for (int l = 0; l < L; l++) {
        const long *c = r.routed + (size_t)l * E, *kept = r.kept + (size_t)l * E;
        long total = 0, dropped = 0;
        int dead = 0, hot;
        for (int e = 0; e < E; e++) total += c[e], dropped += c[e] - kept[e], dead += c[e] == 0;
        double mom, cv;
        moe_load_summary(c, E, &mom, &cv, &hot);
        const long mx = c[hot];
        printf("  layer %2d:", l);
        for (int e = 0; e < E; e++) printf(" %5.1f", total ? 100.0 * c[e] / total : 0.0);
        printf(" | max/mean %.2f (expert %d) cv %.2f dropped %.2f%%\n", mom, hot, cv,
               total ? 100.0 * dropped / total : 0.0);
        // the hottest expert's share of the tokens: c_e of the T*steps tokens (total / k)
        const double share = total ? mx / ((double)total / k) : 0;
        if (share > worst_share) worst_share = share;
        if (k < E && total && share >= SMOKE_COLLAPSE_SHARE)
            SMOKE_FAIL(2,
                       "smoke: FAIL collapse: layer %d expert %d has %.2fx the mean load: %.1f%% "
                       "of the layer's tokens over the %lld steps (collapse: >= %.0f%%)\n",
                       l, hot, mom, 100 * share, (long long)r.steps_done,
                       100 * SMOKE_COLLAPSE_SHARE);
        else if (k < E && total && min_share[l] >= SMOKE_COLLAPSE_SHARE)
            SMOKE_FAIL(
                2,
                "smoke: FAIL collapse: layer %d: on every one of the %lld steps one expert "
                "received >= %.1f%% of the tokens (%.2fx the mean load; collapse: >= %.0f%%), "
                "though not always the same one\n",
                l, (long long)r.steps_done, 100 * min_share[l], min_share[l] * E / k,
                100 * SMOKE_COLLAPSE_SHARE);
        else if (mom > cfg->load_alert)
            printf("    note: max/mean %.2f above log.load_alert = %.2f, within the warm-up grace "
                   "(log.alert_after = %lld): not an alert\n",
                   mom, cfg->load_alert, (long long)cfg->alert_after);
        if (dead && total) {
            char list[256];
            size_t used = 0;
            for (int e = 0; e < E && used < sizeof list - 8; e++)
                if (!c[e]) used += (size_t)snprintf(list + used, sizeof list - used, " %d", e);
            if (dropped > 0)
                SMOKE_FAIL(3,
                           "smoke: FAIL dead experts: layer %d: %d dead expert%s (no token in any "
                           "of the %lld steps):%s while capacity_factor %g dropped %.2f%% of its "
                           "assignments\n",
                           l, dead, dead == 1 ? "" : "s", (long long)r.steps_done, list,
                           cfg->model.moe.capacity_factor, 100.0 * dropped / total);
            else
                printf("    note: %d dead expert%s (no token in any step):%s; nothing dropped, so "
                       "not a failure here\n",
                       dead, dead == 1 ? "" : "s", list);
        }
        dropped_all += dropped, routed_all += total;
    }
    printf("\nrouter logits (last step): layer: mean std max|z| mean-logsumexp\n");
    double max_logit = 0;
    int max_logit_layer = 0, nonfinite_logit = -1;
    for (int l = 0; l < L && r.steps_done > 0; l++) {
        const moe_stats *s = &r.last_stats[l];
        printf("  layer %2d: %8.4f %8.4f %8.4f %8.4f\n", l, s->logit_mean, s->logit_std,
               s->logit_max_abs, s->lse_mean);
        if (!isfinite(s->logit_mean) || !isfinite(s->logit_std) || !isfinite(s->logit_max_abs) ||
            !isfinite(s->lse_mean)) {
            if (nonfinite_logit < 0) nonfinite_logit = l;
        } else if (s->logit_max_abs > max_logit) {
            max_logit = s->logit_max_abs, max_logit_layer = l;
        }
    }
    if (r.steps_done == 0) printf("  (no step completed)\n");
    printf("\ntokens dropped: %ld of %ld assignments (%.2f%%), capacity_factor %g\n", dropped_all,
           routed_all, routed_all ? 100.0 * dropped_all / routed_all : 0.0,
           cfg->model.moe.capacity_factor);
    const double row_bytes = (double)cfg->model.d_model * sizeof(float);
    const double per_step = (double)cfg->batch_size * cfg->seq_len * k * cfg->grad_accum;
    printf("exchange volume per step and rank: 0 B (1 rank; with expert parallelism over R ranks "
           "each rank would send up to %.0f rows of %d floats x 2 (dispatch, combine) x %d layers"
           " x 2 (forward, backward) = %.1f MiB per step)\n",
           per_step, cfg->model.d_model, L, per_step * row_bytes * 4 * L / (1 << 20));
    char pb[32], gb[32], ob[32], ab[32], tb[32];
    human_bytes(pb, sizeof pb, (double)r.param_bytes);
    human_bytes(gb, sizeof gb, (double)r.grad_bytes);
    human_bytes(ob, sizeof ob, (double)r.optimizer_bytes);
    human_bytes(ab, sizeof ab, (double)r.activation_bytes);
    human_bytes(tb, sizeof tb,
                (double)(r.param_bytes + r.grad_bytes + r.optimizer_bytes + r.activation_bytes));
    printf("memory (fp32, as allocated): parameters %s, gradients %s, optimizer %s, activations "
           "and buffers %s: %s in all\n",
           pb, gb, ob, ab, tb);
    printf("estimated throughput: %.0f tokens/s (median over steps 2..%ld, %d x %d tokens x %d)\n",
           r.median_tokens_per_s, steps, cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    printf("\n");
    if (r.skipped || (stopped[0] && !load_stop))
        SMOKE_FAIL(
            0, "smoke: FAIL finite: %lld step%s skipped for a non-finite loss or gradient%s%s\n",
            (long long)r.skipped, r.skipped == 1 ? "" : "s", stopped[0] && !load_stop ? "; " : "",
            stopped[0] && !load_stop ? stopped : "");
    if (nonfinite_logit >= 0)
        SMOKE_FAIL(0,
                   "smoke: FAIL finite: layer %d: a router-logit statistic of the last step is not "
                   "finite\n",
                   nonfinite_logit);
    if (max_logit > SMOKE_MAX_LOGIT)
        SMOKE_FAIL(1,
                   "smoke: FAIL logits: layer %d: max |router logit| %.4g on the last step exceeds "
                   "%.0f (the softmax saturates: check model.init_std, the router's init)\n",
                   max_logit_layer, max_logit, SMOKE_MAX_LOGIT);
    if (load_stop) SMOKE_FAIL(4, "smoke: FAIL load alert: %s\n", stopped);
    const long long rule_from = (long long)(cfg->alert_after + cfg->alert_window);
    if (failed) {
        static const char *names[] = {"finite", "logits", "collapse", "dead experts", "load alert"};
        fputs(fails, stdout);
        printf("smoke: FAILED (exit 1):");
        for (int i = 0, first = 1; i < 5; i++)
            if (failed & (1 << i)) printf("%s %s", first ? "" : ",", names[i]), first = 0;
        printf("\n");
    } else {
        char rule[96];
        if (steps >= rule_from)
            snprintf(rule, sizeof rule, "silent (from step %lld)", rule_from);
        else
            snprintf(rule, sizeof rule, "not reached (from step %lld)", rule_from);
        printf("smoke: PASS: %ld steps finite; max |router logit| %.2f (<= %.0f); hottest expert "
               "%.0f%% of a layer's tokens (collapse: >= %.0f%%); no dead expert at capacity; load "
               "alert %s\n",
               steps, max_logit, SMOKE_MAX_LOGIT, 100 * worst_share, 100 * SMOKE_COLLAPSE_SHARE,
               rule);
    }
#undef SMOKE_FAIL
    free(min_share);
    trainer_result_free(&r);
    free(cfg);
    return failed ? 1 : 0;
}
