// `moe stats RUN_DIR --placement R [--json]`: an expert-to-rank mapping for expert parallelism
// over R ranks, planned from a run's logs (expert_load.jsonl: the per-step counts and the
// co-activations), beside the contiguous default and two baselines.
//
// What a mapping p (expert e -> rank p[e], E/R experts per rank, the same for every layer)
// costs, per layer l and logged step s with counts c_e:
//   - the hottest rank's load: max_r sum_{p[e]=r} c_e / (sum_e c_e / R), its P99 over steps;
//     the hottest link carries (tokens / R) of that rank's share: bytes = P99 max_r load_r / R
//     x the row bytes, per layer forward;
//   - rows per token the "rows" exchange sends: one per assignment to another rank,
//     k (R-1)/R, whatever the mapping (a token's rank is uniform);
//   - rows per token the "dedup" exchange (the default, parallel.exchange) sends, one copy per
//     token and destination rank as DeepEP sends: (R-1)/R x D, D the token's distinct ranks
//     = k - (its pairs of experts on one rank) (exact for k = 2 and whenever no rank holds
//     three of a token's experts), from the co-activations.
// The proposal: LPT greedy on the experts' loads summed over layers (the classic 4/3
// approximation for balancing), then Kernighan-Lin-style pairwise swaps while they lower
//   P99 hottest-rank load / its greedy value + dedup rows per token / k (R-1)/R,
// i.e. balance the hot peaks and co-locate co-activated experts, with equal weight; the same
// swap search from the contiguous mapping too, the better of the two kept (the mean load
// LPT balances is not the P99 that counts). Baselines: the mean of 32 random
// mappings, and the greedy one alone.
#define _POSIX_C_SOURCE 200809L // getline
#include <cjson/cJSON.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats/records.h"
#include "stats/stats.h"

#define MAX_E 4096

typedef struct {
    int L, E, k, R;
    size_t *n, *cap; // [L] logged steps per layer
    long **counts;   // [L] -> [steps][E]
    double **coact;  // [L] -> [E][E] summed (both halves)
    double *tokens;  // [L] tokens over the steps with co-activations
    int have_coact;
    double row_bytes; // d_model x 4 (from the records: "exchange" not needed)
} plan_in;

static void plan_free(plan_in *p) {
    for (int l = 0; l < p->L; l++) free(p->counts[l]), free(p->coact[l]);
    free(p->counts), free(p->coact), free(p->n), free(p->cap), free(p->tokens);
}

static int add_layer(plan_in *p, int l) {
    if (l < p->L) return 1;
    const int L = l + 1;
    long **c = realloc(p->counts, L * sizeof *c);
    double **q = realloc(p->coact, L * sizeof *q), *t = realloc(p->tokens, L * sizeof *t);
    size_t *n = realloc(p->n, L * sizeof *n), *cap = realloc(p->cap, L * sizeof *cap);
    if (c) p->counts = c;
    if (q) p->coact = q;
    if (t) p->tokens = t;
    if (n) p->n = n;
    if (cap) p->cap = cap;
    if (!c || !q || !t || !n || !cap) return 0;
    for (int i = p->L; i < L; i++) {
        p->counts[i] = NULL, p->n[i] = p->cap[i] = 0, p->tokens[i] = 0;
        if (!(p->coact[i] = calloc((size_t)p->E * p->E, sizeof(double)))) return 0;
    }
    p->L = L;
    return 1;
}

// One validated record (records.h) into the plan's inputs.
static moe_status on_record(void *ctx, const stats_load_rec *r) {
    plan_in *p = ctx;
    const int E = p->E, l = (int)r->layer;
    if (!add_layer(p, l)) return moe_error(MOE_ENOMEM, "out of memory");
    if (p->n[l] == p->cap[l]) {
        size_t nc = p->cap[l] ? 2 * p->cap[l] : 256;
        long *nb = realloc(p->counts[l], nc * E * sizeof(long));
        if (!nb) return moe_error(MOE_ENOMEM, "out of memory");
        p->counts[l] = nb, p->cap[l] = nc;
    }
    memcpy(p->counts[l] + p->n[l]++ * E, r->counts, (size_t)E * sizeof(long));
    if (r->tokens > 0) p->tokens[l] += (double)r->tokens;
    if (r->coact) {
        p->have_coact = 1;
        const long *v = r->coact;
        for (int i = 0; i < E; i++)
            for (int j = i + 1; j < E; j++, v++)
                p->coact[l][i * E + j] += (double)*v, p->coact[l][j * E + i] += (double)*v;
    }
    return MOE_OK;
}

// Reads RUN_DIR/expert_load.jsonl with the validated reader (a partial last line is ignored).
static int read_load(plan_in *p, const char *dir, const moe_train_config *cfg, FILE *err) {
    char path[MOE_PATH_MAX + 32], cfg_path[MOE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/expert_load.jsonl", dir);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.cfg", dir);
    p->E = cfg->model.moe.n_experts;
    if (p->E > MAX_E) {
        fprintf(err, "moe stats: error: --placement plans at most %d experts (%s: %d)\n", MAX_E,
                cfg_path, p->E);
        return 1;
    }
    stats_log lg = {.path = path,
                    .cfg_path = cfg_path,
                    .E = p->E,
                    .n_layers = cfg->model.n_layers,
                    .grad_accum = cfg->grad_accum,
                    .required = 1};
    if (stats_read_load(&lg, on_record, p)) {
        fprintf(err, "moe stats: error: %s\n", moe_last_error());
        return 1;
    }
    if (!p->L) {
        fprintf(err, "moe stats: error: %s: no expert-load records\n", path);
        return 1;
    }
    return 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

typedef struct {
    double p99_load;   // P99 over steps of the hottest rank's load / mean, the worst layer
    double rows_ours;  // rows per token per layer the "rows" exchange sends
    double rows_dedup; // with one copy per destination rank (co-activations needed)
    double link_bytes; // hottest link, P99 step, per layer forward, bytes
} plan_cost;

// Steps are sampled with a stride that keeps one evaluation near 2e5 counts (the swap search
// evaluates O(E^2) mappings per pass); small runs use every step.
static plan_cost cost_of(const plan_in *p, const int *rank_of, double *scratch) {
    plan_cost c = {0};
    const int E = p->E, R = p->R;
    double same = 0, tokens = 0, worst_link = 0;
    size_t all_steps = 0;
    for (int l = 0; l < p->L; l++) all_steps += p->n[l];
    const size_t stride = all_steps * E > 200000 ? all_steps * E / 200000 : 1;
    for (int l = 0; l < p->L; l++) {
        const size_t n = (p->n[l] + stride - 1) / stride;
        if (!n) continue;
        double rl[64];
        for (size_t s = 0; s < n; s++) {
            const long *cnt = p->counts[l] + s * stride * E;
            double all = 0;
            for (int r = 0; r < R; r++) rl[r] = 0;
            for (int e = 0; e < E; e++) rl[rank_of[e]] += (double)cnt[e], all += (double)cnt[e];
            double hot = 0;
            for (int r = 0; r < R; r++) hot = rl[r] > hot ? rl[r] : hot;
            scratch[s] = all > 0 ? hot / (all / R) : 1;
            scratch[n + s] = hot; // rows into the hottest rank
        }
        qsort(scratch, n, sizeof *scratch, cmp_double);
        const double q = stats_percentile_sorted(scratch, n, 99);
        if (q > c.p99_load) c.p99_load = q;
        qsort(scratch + n, n, sizeof *scratch, cmp_double);
        const double link = stats_percentile_sorted(scratch + n, n, 99) / R * p->row_bytes;
        if (link > worst_link) worst_link = link;
        for (int i = 0; i < E; i++)
            for (int j = i + 1; j < E; j++)
                if (rank_of[i] == rank_of[j]) same += p->coact[l][i * E + j];
        tokens += p->tokens[l];
    }
    const double remote = (double)(R - 1) / R;
    c.rows_ours = p->k * remote;
    c.rows_dedup = tokens > 0 ? remote * (p->k - same / tokens) : NAN;
    c.link_bytes = worst_link;
    return c;
}

static double objective(const plan_cost *c, const plan_cost *ref, const plan_in *p) {
    const double rows = p->have_coact ? c->rows_dedup / (p->k * (double)(p->R - 1) / p->R) : 0;
    return c->p99_load / ref->p99_load + rows;
}

// LPT: experts by load (summed over layers and steps), heaviest first, each to the least
// loaded rank that has room.
static void greedy(const plan_in *p, int *rank_of) {
    const int E = p->E, R = p->R, per = E / R;
    double *load = calloc(E, sizeof *load), rl[64] = {0};
    int *order = malloc(E * sizeof *order), fill[64] = {0};
    for (int l = 0; l < p->L; l++)
        for (size_t s = 0; s < p->n[l]; s++)
            for (int e = 0; e < E; e++) load[e] += (double)p->counts[l][s * E + e];
    for (int e = 0; e < E; e++) order[e] = e;
    for (int a = 1; a < E; a++) // insertion sort, heaviest first (ties: lower index)
        for (int b = a; b > 0 && load[order[b]] > load[order[b - 1]]; b--) {
            const int t = order[b];
            order[b] = order[b - 1], order[b - 1] = t;
        }
    for (int i = 0; i < E; i++) {
        int best = -1;
        for (int r = 0; r < R; r++)
            if (fill[r] < per && (best < 0 || rl[r] < rl[best])) best = r;
        rank_of[order[i]] = best, rl[best] += load[order[i]], fill[best]++;
    }
    free(load), free(order);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

// The mean cost of 32 random mappings (seeded: the same every run), each a Fisher-Yates
// shuffle of the contiguous one.
static plan_cost random_baseline(const plan_in *p, const int *contiguous, double *scratch) {
    const int E = p->E;
    int mapping[MAX_E];
    plan_cost mean = {0};
    uint64_t seed = 7;
    for (int t = 0; t < 32; t++) {
        for (int e = 0; e < E; e++) mapping[e] = contiguous[e];
        for (int e = E - 1; e > 0; e--) {
            const int j = (int)(splitmix(&seed) % (uint64_t)(e + 1)), tmp = mapping[e];
            mapping[e] = mapping[j], mapping[j] = tmp;
        }
        const plan_cost c = cost_of(p, mapping, scratch);
        mean.p99_load += c.p99_load / 32, mean.rows_ours = c.rows_ours;
        mean.rows_dedup += c.rows_dedup / 32, mean.link_bytes += c.link_bytes / 32;
    }
    return mean;
}

// Pairwise swaps from the mapping cur (changed in place) while they lower the objective
// (relative to ref), at most 50 passes; the cost reached, its objective in *obj.
static plan_cost swap_search(const plan_in *p, int *cur, const plan_cost *ref, double *scratch,
                             double *obj) {
    const int E = p->E;
    plan_cost c_cur = cost_of(p, cur, scratch);
    double o_cur = objective(&c_cur, ref, p);
    for (int pass = 0, improved = 1; improved && pass < 50; pass++) {
        improved = 0;
        for (int a = 0; a < E; a++)
            for (int b = a + 1; b < E; b++) {
                if (cur[a] == cur[b]) continue;
                int t = cur[a];
                cur[a] = cur[b], cur[b] = t;
                const plan_cost c = cost_of(p, cur, scratch);
                const double o = objective(&c, ref, p);
                if (o < o_cur - 1e-12) {
                    o_cur = o, c_cur = c, improved = 1;
                } else {
                    t = cur[a], cur[a] = cur[b], cur[b] = t; // undo
                }
            }
    }
    *obj = o_cur;
    return c_cur;
}

static void print_row(FILE *out, const char *name, const plan_cost *c, int have_coact) {
    char dedup[32];
    if (have_coact)
        snprintf(dedup, sizeof dedup, "%.3f", c->rows_dedup);
    else
        snprintf(dedup, sizeof dedup, "n/a");
    fprintf(out, "  %-22s %9.3f %11.3f %12s %14.1f\n", name, c->p99_load, c->rows_ours, dedup,
            c->link_bytes / 1024.0);
}

static cJSON *jcost(const char *name, const plan_cost *c, const int *rank_of, int E) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "mapping", name);
    cJSON_AddNumberToObject(o, "p99_hottest_rank_load", c->p99_load);
    cJSON_AddNumberToObject(o, "rows_per_token", c->rows_ours);
    if (isfinite(c->rows_dedup)) cJSON_AddNumberToObject(o, "rows_per_token_dedup", c->rows_dedup);
    cJSON_AddNumberToObject(o, "hottest_link_bytes", c->link_bytes);
    if (rank_of) cJSON_AddItemToObject(o, "rank_of_expert", cJSON_CreateIntArray(rank_of, E));
    return o;
}

int stats_placement(const char *dir, const moe_train_config *cfg, int R, int json, FILE *out,
                    FILE *err) {
    const int d_model = cfg->model.d_model;
    plan_in p = {.R = R, .k = cfg->model.moe.top_k, .row_bytes = 4.0 * d_model};
    if (read_load(&p, dir, cfg, err)) {
        plan_free(&p);
        return 1;
    }
    const int E = p.E;
    if (R < 2 || R > 64 || E % R) {
        fprintf(err,
                "moe stats: --placement %d: the ranks must be 2..64 and divide the %d experts\n", R,
                E);
        plan_free(&p);
        return 2;
    }
    size_t most = 1;
    for (int l = 0; l < p.L; l++) most = p.n[l] > most ? p.n[l] : most;
    double *scratch = malloc(2 * most * sizeof *scratch);
    int contiguous[MAX_E], mapping[MAX_E], best[MAX_E];
    for (int e = 0; e < E; e++) contiguous[e] = e / (E / R);
    const plan_cost c_cont = cost_of(&p, contiguous, scratch);
    const plan_cost c_rand = random_baseline(&p, contiguous, scratch); // the mean of 32
    greedy(&p, mapping);
    const plan_cost c_greedy = cost_of(&p, mapping, scratch);
    // the swap search from the greedy mapping and from the contiguous one: the better result
    plan_cost c_best = c_greedy;
    double obj = INFINITY;
    for (int start = 0; start < 2; start++) {
        int cur[MAX_E];
        memcpy(cur, start ? contiguous : mapping, E * sizeof *cur);
        double o_cur;
        const plan_cost c_cur = swap_search(&p, cur, &c_greedy, scratch, &o_cur);
        if (o_cur < obj) obj = o_cur, c_best = c_cur, memcpy(best, cur, E * sizeof *best);
    }
    if (json) {
        cJSON *doc = cJSON_CreateObject(), *m = cJSON_AddArrayToObject(doc, "mappings");
        cJSON_AddNumberToObject(doc, "ranks", R);
        cJSON_AddNumberToObject(doc, "experts", E);
        cJSON_AddNumberToObject(doc, "layers", p.L);
        cJSON_AddBoolToObject(doc, "coactivations", p.have_coact);
        cJSON_AddItemToArray(m, jcost("contiguous", &c_cont, contiguous, E));
        cJSON_AddItemToArray(m, jcost("random (mean of 32)", &c_rand, NULL, E));
        cJSON_AddItemToArray(m, jcost("greedy", &c_greedy, mapping, E));
        cJSON_AddItemToArray(m, jcost("proposal", &c_best, best, E));
        cJSON *key = cJSON_AddArrayToObject(doc, "expert_placement"); // the config key's value
        for (int r = 0; r < R; r++)
            for (int e = 0; e < E; e++)
                if (best[e] == r) cJSON_AddItemToArray(key, cJSON_CreateNumber(e));
        char *text = cJSON_Print(doc);
        fprintf(out, "%s\n", text);
        free(text);
        cJSON_Delete(doc);
    } else {
        size_t steps = 0; // (a dense layer logs none)
        int moe_layers = 0;
        for (int l = 0; l < p.L; l++)
            steps = p.n[l] > steps ? p.n[l] : steps, moe_layers += p.n[l] > 0;
        fprintf(out,
                "moe stats %s --placement %d: %d experts over %d ranks, %d MoE layers, %zu "
                "steps\n",
                dir, R, E, R, moe_layers, steps);
        fprintf(out, "  %-22s %9s %11s %12s %14s\n", "mapping", "P99 load", "rows/token",
                "rows, dedup", "hot link KiB");
        print_row(out, "contiguous (default)", &c_cont, p.have_coact);
        print_row(out, "random (mean of 32)", &c_rand, p.have_coact);
        print_row(out, "greedy (LPT)", &c_greedy, p.have_coact);
        print_row(out, "proposal", &c_best, p.have_coact);
        fprintf(out, "  proposal, experts per rank:");
        for (int r = 0; r < R; r++) {
            fprintf(out, "%s rank %d:", r ? ";" : "", r);
            for (int e = 0; e < E; e++)
                if (best[e] == r) fprintf(out, " %d", e);
        }
        fprintf(out, "\n  to train with it: --set 'parallel.expert_placement=[");
        for (int r = 0, n = 0; r < R; r++)
            for (int e = 0; e < E; e++)
                if (best[e] == r) fprintf(out, "%s%d", n++ ? ", " : "", e);
        fprintf(out, "]'");
        fprintf(
            out,
            "\n"
            "  P99 load: the hottest rank's tokens over the mean on the P99 step (worst layer);\n"
            "  rows/token: rows one layer sends per token with parallel.exchange \"rows\" (one "
            "per\n"
            "  assignment to another rank, the same for every mapping); dedup: with the default\n"
            "  \"dedup\" (one per token and destination rank), from the co-activations%s; hot "
            "link: the busiest rank pair's bytes on the\n"
            "  P99 step, per layer forward (d_model %d). Proposal: pairwise swaps from LPT\n"
            "  greedy and from contiguous lowering P99 load + dedup rows (both relative).\n"
            "  Train with it: parallel.expert_placement (the line above).\n",
            p.have_coact ? "" : " (none logged: log.coactivation)", d_model);
    }
    free(scratch);
    plan_free(&p);
    return 0;
}
