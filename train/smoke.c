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
//             log.alert_after, step_log.c) fired: only reachable with --steps past
//             alert_after + alert_window;
// else exit 0 with a one-line verdict. A fresh model's load within the warm-up grace, however
// skewed below collapse, is reported (a note) and does not fail the smoke.
#define _POSIX_C_SOURCE 200809L // getline
#include "train/smoke.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layers/moe.h"
#include "config/config.h"
#include "train/log.h"
#include "train/run_header.h"
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

static const cli_option smoke_options[] = {
    {"CONFIG", CLI_POSITIONAL(moe_smoke_opts, config), .flags = CLI_REQUIRED,
     .expect = "a CONFIG file"},
    {"--steps", CLI_INT(moe_smoke_opts, steps), .value = "N", .lo = 1, .hi = 1000000, .def = "10",
     .help = "steps to run, in [1, 1000000]"},
    {"--set", CLI_LIST(moe_smoke_opts, sets), .value = "group.key=value",
     .help = "override a config key (as for moe train)"},
    {0}};

const cli_command moe_smoke_cli = {
    .name = "moe smoke",
    .about =
        "  Runs the first N steps of the config (its schedule unchanged; no checkpoint; logs in\n"
        "  log.dir/smoke) and prints the expert-load table per layer, the router-logit "
        "distribution\n"
        "  of the last step, tokens dropped, the exchange volume, the memory of the full config "
        "and\n"
        "  the median tokens/s; then the gate (README \"moe smoke\"): exit 1, each failed check\n"
        "  on a line saying why (a skipped step, router logits out of range, a collapsed or dead\n"
        "  expert, a sustained load alert), else 0.\n",
    .options = smoke_options};

// The config of the smoke: the first N steps of the configured run, its schedule kept (a
// warmup longer than the smoke simply does not finish; *full_steps: train.steps), logs in
// log.dir/smoke, and the training alert rule as "stop": a sustained alert ends the smoke, and
// fails it.
static moe_train_config *smoke_config(const moe_smoke_opts *o, int64_t *full_steps) {
    moe_train_config *cfg = malloc(sizeof *cfg);
    if (!cfg || moe_train_config_load(cfg, o->config, o->sets.n, (char *const *)o->sets.v))
        moe_fatal("%s", moe_last_error());
    *full_steps = cfg->steps;
    cfg->steps = o->steps;
    cfg->eval_interval = 0;
    if (cfg->eval_batches > 2) cfg->eval_batches = 2;
    size_t n = strlen(cfg->run_dir);
    if (n + 7 >= sizeof cfg->run_dir) moe_fatal("smoke: log.dir too long");
    memcpy(cfg->run_dir + n, "/smoke", 7);
    cfg->load_alert_action = MOE_ALERT_STOP;
    return cfg;
}

// The gate's failures: a bit per check (finite, logits, collapse, dead, load) and their lines.
typedef struct {
    int failed;
    char fails[4096];
    size_t used;
} smoke_gate;

__attribute__((format(printf, 3, 4))) static void gate_fail(smoke_gate *g, int bit, const char *fmt,
                                                            ...) {
    g->failed |= 1 << bit;
    if (g->used >= sizeof g->fails) return;
    va_list ap;
    va_start(ap, fmt);
    g->used += (size_t)vsnprintf(g->fails + g->used, sizeof g->fails - g->used, fmt, ap);
    va_end(ap);
}

// What the report found, for the verdict.
typedef struct {
    double worst_share;             // the hottest expert's share of a layer's tokens, worst layer
    long dropped, routed;           // assignments over every layer and step
    double max_logit;               // the largest finite |router logit| of the last step
    int max_logit_layer, nonfinite; // its layer; the first layer with a non-finite one (-1)
} smoke_found;

// Layer l's dead experts (dead of them, none of the layer's total assignments): a failure when
// the configured capacity dropped assignments (dropped) in the layer, else a note.
static void dead_experts(smoke_gate *g, const moe_train_config *cfg, const moe_trainer_result *r,
                         int l, int dead, long dropped, long total) {
    const int E = r->n_experts;
    const long *c = r->routed + (size_t)l * E;
    char list[256];
    size_t used = 0;
    for (int e = 0; e < E && used < sizeof list - 8; e++)
        if (!c[e]) used += (size_t)snprintf(list + used, sizeof list - used, " %d", e);
    if (dropped > 0)
        gate_fail(g, 3,
                  "smoke: FAIL dead experts: layer %d: %d dead expert%s (no token in any "
                  "of the %lld steps):%s while capacity_factor %g dropped %.2f%% of its "
                  "assignments\n",
                  l, dead, dead == 1 ? "" : "s", (long long)r->steps_done, list,
                  cfg->model.moe.capacity_factor, 100.0 * dropped / total);
    else
        printf("    note: %d dead expert%s (no token in any step):%s; nothing dropped, so "
               "not a failure here\n",
               dead, dead == 1 ? "" : "s", list);
}

// Layer l's line of the load table, and its collapse and dead-expert checks (min_share: the
// least per-step share of its hottest expert).
static void layer_load(smoke_gate *g, smoke_found *f, const moe_train_config *cfg,
                       const moe_trainer_result *r, int l, double min_share) {
    const int E = r->n_experts, k = cfg->model.moe.top_k;
    const long *c = r->routed + (size_t)l * E, *kept = r->kept + (size_t)l * E;
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
    if (share > f->worst_share) f->worst_share = share;
    if (k < E && total && share >= SMOKE_COLLAPSE_SHARE)
        gate_fail(g, 2,
                  "smoke: FAIL collapse: layer %d expert %d has %.2fx the mean load: %.1f%% "
                  "of the layer's tokens over the %lld steps (collapse: >= %.0f%%)\n",
                  l, hot, mom, 100 * share, (long long)r->steps_done, 100 * SMOKE_COLLAPSE_SHARE);
    else if (k < E && total && min_share >= SMOKE_COLLAPSE_SHARE)
        gate_fail(g, 2,
                  "smoke: FAIL collapse: layer %d: on every one of the %lld steps one expert "
                  "received >= %.1f%% of the tokens (%.2fx the mean load; collapse: >= %.0f%%), "
                  "though not always the same one\n",
                  l, (long long)r->steps_done, 100 * min_share, min_share * E / k,
                  100 * SMOKE_COLLAPSE_SHARE);
    else if (mom > cfg->load_alert)
        printf("    note: max/mean %.2f above log.load_alert = %.2f, within the warm-up grace "
               "(log.alert_after = %lld): not an alert\n",
               mom, cfg->load_alert, (long long)cfg->alert_after);
    if (dead && total) dead_experts(g, cfg, r, l, dead, dropped, total);
    f->dropped += dropped, f->routed += total;
}

// The router-logit distribution of the last step, per layer.
static void router_logits(smoke_found *f, const moe_trainer_result *r) {
    printf("\nrouter logits (last step): layer: mean std max|z| mean-logsumexp\n");
    f->nonfinite = -1;
    for (int l = 0; l < r->n_layers && r->steps_done > 0; l++) {
        const moe_stats *s = &r->last_stats[l];
        if (!s->routed) continue; // a dense layer: no router
        printf("  layer %2d: %8.4f %8.4f %8.4f %8.4f\n", l, s->logit_mean, s->logit_std,
               s->logit_max_abs, s->lse_mean);
        if (!isfinite(s->logit_mean) || !isfinite(s->logit_std) || !isfinite(s->logit_max_abs) ||
            !isfinite(s->lse_mean)) {
            if (f->nonfinite < 0) f->nonfinite = l;
        } else if (s->logit_max_abs > f->max_logit) {
            f->max_logit = s->logit_max_abs, f->max_logit_layer = l;
        }
    }
    if (r->steps_done == 0) printf("  (no step completed)\n");
}

// Drops, the exchange volume, memory and throughput.
static void resources(const smoke_found *f, const moe_train_config *cfg,
                      const moe_trainer_result *r, long steps) {
    const int L = r->n_layers, k = cfg->model.moe.top_k;
    printf("\ntokens dropped: %ld of %ld assignments (%.2f%%), capacity_factor %g\n", f->dropped,
           f->routed, f->routed ? 100.0 * f->dropped / f->routed : 0.0,
           cfg->model.moe.capacity_factor);
    const double row_bytes = (double)cfg->model.d_model * sizeof(float);
    const double per_step = (double)cfg->batch_size * cfg->seq_len * k * cfg->grad_accum;
    printf("exchange volume per step and rank: 0 B (1 rank; with expert parallelism over R ranks "
           "each rank would send up to %.0f rows of %d floats x 2 (dispatch, combine) x %d layers"
           " x 2 (forward, backward) = %.1f MiB per step)\n",
           per_step, cfg->model.d_model, L, per_step * row_bytes * 4 * L / (1 << 20));
    char pb[32], gb[32], ob[32], ab[32], tb[32];
    moe_run_header_bytes(pb, sizeof pb, (double)r->param_bytes);
    moe_run_header_bytes(gb, sizeof gb, (double)r->grad_bytes);
    moe_run_header_bytes(ob, sizeof ob, (double)r->optimizer_bytes);
    moe_run_header_bytes(ab, sizeof ab, (double)r->activation_bytes);
    moe_run_header_bytes(
        tb, sizeof tb,
        (double)(r->param_bytes + r->grad_bytes + r->optimizer_bytes + r->activation_bytes));
    printf("memory (fp32, as allocated): parameters %s, gradients %s, optimizer %s, activations "
           "and buffers %s: %s in all\n",
           pb, gb, ob, ab, tb);
    printf("estimated throughput: %.0f tokens/s (median over steps 2..%ld, %d x %d tokens x %d)\n",
           r->median_tokens_per_s, steps, cfg->batch_size, cfg->seq_len, cfg->grad_accum);
    printf("\n");
}

// The checks of the whole run: skipped steps or an early stop (stopped: why), non-finite or
// saturated router logits, a sustained load alert.
static void run_checks(smoke_gate *g, const smoke_found *f, const moe_trainer_result *r,
                       const char *stopped, int load_stop) {
    const int other_stop = stopped[0] && !load_stop;
    if (r->skipped || other_stop)
        gate_fail(g, 0,
                  "smoke: FAIL finite: %lld step%s skipped for a non-finite loss or gradient%s%s\n",
                  (long long)r->skipped, r->skipped == 1 ? "" : "s", other_stop ? "; " : "",
                  other_stop ? stopped : "");
    if (f->nonfinite >= 0)
        gate_fail(g, 0,
                  "smoke: FAIL finite: layer %d: a router-logit statistic of the last step is not "
                  "finite\n",
                  f->nonfinite);
    if (f->max_logit > SMOKE_MAX_LOGIT)
        gate_fail(g, 1,
                  "smoke: FAIL logits: layer %d: max |router logit| %.4g on the last step exceeds "
                  "%.0f (the softmax saturates: check model.init_std, the router's init)\n",
                  f->max_logit_layer, f->max_logit, SMOKE_MAX_LOGIT);
    if (load_stop) gate_fail(g, 4, "smoke: FAIL load alert: %s\n", stopped);
}

// The verdict: the failures and the checks that failed, or the one-line pass.
static void verdict(const smoke_gate *g, const smoke_found *f, const moe_train_config *cfg,
                    long steps) {
    const long long rule_from = (long long)(cfg->alert_after + cfg->alert_window);
    if (g->failed) {
        static const char *names[] = {"finite", "logits", "collapse", "dead experts", "load alert"};
        fputs(g->fails, stdout);
        printf("smoke: FAILED (exit 1):");
        for (int i = 0, first = 1; i < 5; i++)
            if (g->failed & (1 << i)) printf("%s %s", first ? "" : ",", names[i]), first = 0;
        printf("\n");
        return;
    }
    char rule[96];
    if (steps >= rule_from)
        snprintf(rule, sizeof rule, "silent (from step %lld)", rule_from);
    else
        snprintf(rule, sizeof rule, "not reached (from step %lld)", rule_from);
    printf("smoke: PASS: %ld steps finite; max |router logit| %.2f (<= %.0f); hottest expert "
           "%.0f%% of a layer's tokens (collapse: >= %.0f%%); no dead expert at capacity; load "
           "alert %s\n",
           steps, f->max_logit, SMOKE_MAX_LOGIT, 100 * f->worst_share, 100 * SMOKE_COLLAPSE_SHARE,
           rule);
}

int moe_smoke_run(const moe_smoke_opts *o) {
    int64_t full_steps;
    moe_train_config *cfg = smoke_config(o, &full_steps);
    const long steps = (long)o->steps;
    moe_trainer_hooks hooks = {
        .nan_from = -1, .nan_to = -1, .no_checkpoint = 1, .schedule_steps = full_steps};
    moe_trainer_result r;
    moe_status st = moe_trainer_run(cfg, NULL, &hooks, &r);
    char stopped[1024] = ""; // why the trainer stopped early: non-finite steps, or a load alert
    if (st == MOE_ENUMERIC)
        snprintf(stopped, sizeof stopped, "%s", moe_last_error());
    else if (st)
        moe_fatal("%s", moe_last_error());
    const int load_stop = stopped[0] && strstr(stopped, "train.load_alert_action") != NULL;
    const int L = r.n_layers;
    double *min_share = malloc((size_t)(L > 0 ? L : 1) * sizeof *min_share);
    if (!min_share) moe_fatal("smoke: out of memory");
    min_step_share(cfg->run_dir, L, r.n_experts, cfg->model.moe.top_k, min_share);
    smoke_gate g = {0};
    smoke_found f = {0};
    printf("\n== moe smoke: %s, %ld steps (logs: %s) ==\n", o->config, steps, cfg->run_dir);
    printf("\nexpert load over the %ld steps (token share per expert, %%):\n", steps);
    for (int l = 0; l < L; l++)
        if (moe_model_layer_is_moe(&cfg->model, l)) layer_load(&g, &f, cfg, &r, l, min_share[l]);
    router_logits(&f, &r);
    resources(&f, cfg, &r, steps);
    run_checks(&g, &f, &r, stopped, load_stop);
    verdict(&g, &f, cfg, steps);
    free(min_share);
    moe_trainer_result_free(&r);
    free(cfg);
    return g.failed ? 1 : 0;
}

int moe_smoke_main(int argc, char **argv) {
    moe_smoke_opts o = {0};
    int rc = cli_args(&moe_smoke_cli, argc, argv, &o, stdout, stderr);
    if (rc != CLI_RUN) return rc;
    rc = moe_smoke_run(&o);
    cli_free(&moe_smoke_cli, &o);
    return rc;
}
