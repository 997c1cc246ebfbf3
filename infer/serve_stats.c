// Serving-side load telemetry (serve_stats.h).
#include "infer/serve_stats.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "stats/stats.h" // stats_percentile_sorted: numpy's percentiles

static const char *const kind_names[3] = {"prefill", "decode", "eval"};

moe_status moe_serve_stats_init(moe_serve_stats *s, const moe_model *m, int window,
                                const char *jsonl_path) {
    memset(s, 0, sizeof *s);
    s->L = m->cfg.n_layers, s->E = m->cfg.moe.n_experts, s->k = m->cfg.moe.top_k;
    s->window = window > 0 ? window : 32;
    if (s->L > 1024) return moe_error(MOE_EINVAL, "stats: more than 1024 layers");
    s->win_hits = calloc((size_t)s->L * s->E, sizeof *s->win_hits);
    if (!s->win_hits) return moe_error(MOE_ENOMEM, "stats: out of memory");
    if (jsonl_path && !(s->jsonl = fopen(jsonl_path, "w")))
        return moe_error(MOE_EIO, "--stats-out %s: cannot create", jsonl_path);
    return MOE_OK;
}

void moe_serve_stats_free(moe_serve_stats *s) {
    if (s->jsonl) fclose(s->jsonl);
    free(s->latency), free(s->tokens), free(s->kind), free(s->hot), free(s->win_hits);
    free(s->win_ratio), free(s->win_expert), free(s->win_mean_hot);
    memset(s, 0, sizeof *s);
}

// The capacity for n + 1 entries: cap while n fits, else doubled (256 at first). Every array
// of a set grows to the same new capacity (grow), and only then is the set's cap updated: an
// earlier version updated nothing, so the arrays stayed at 256 entries and the 257th step
// wrote past them (found by scripts/bench_serve under ASan).
static size_t next_cap(size_t cap, size_t n) { return n < cap ? cap : cap ? 2 * cap : 256; }

static int grow(void **p, size_t cap, size_t new_cap, size_t elem) {
    if (new_cap == cap) return 1;
    void *q = realloc(*p, new_cap * elem);
    if (!q) return 0;
    *p = q;
    return 1;
}

// The window that just filled: each layer's hottest expert's hit ratio and mean hottest share.
static moe_status close_window(moe_serve_stats *s) {
    const int L = s->L, E = s->E;
    const size_t c = s->win_cap, nc = next_cap(c, s->n_win);
    if (!grow((void **)&s->win_ratio, c, nc, L * sizeof(double)) ||
        !grow((void **)&s->win_expert, c, nc, L * sizeof(int)) ||
        !grow((void **)&s->win_mean_hot, c, nc, L * sizeof(double)))
        return moe_error(MOE_ENOMEM, "stats: out of memory");
    s->win_cap = nc;
    for (int l = 0; l < L; l++) {
        const long *h = s->win_hits + (size_t)l * E;
        long all = 0;
        int hot = 0;
        for (int e = 0; e < E; e++) all += h[e], hot = h[e] > h[hot] ? e : hot;
        s->win_ratio[s->n_win * L + l] = all ? (double)h[hot] / all : 0;
        s->win_expert[s->n_win * L + l] = hot;
        s->win_mean_hot[s->n_win * L + l] = s->step_hot_sum[l] / s->in_window;
        s->step_hot_sum[l] = 0;
    }
    memset(s->win_hits, 0, (size_t)L * E * sizeof *s->win_hits);
    s->n_win++, s->in_window = 0;
    return MOE_OK;
}

moe_status moe_serve_stats_step(moe_serve_stats *s, const moe_model *m, moe_serve_kind kind,
                                int tokens, double latency_s) {
    const int L = s->L, E = s->E;
    long *counts = malloc((size_t)L * E * sizeof *counts);
    if (!counts) return moe_error(MOE_ENOMEM, "stats: out of memory");
    memcpy(counts, m->step_hits, (size_t)L * E * sizeof *counts);       // the call's, per layer
    if (m->ep) m->ep->allreduce_sum_long(m->ep, counts, (size_t)L * E); // every rank's tokens
    const size_t c = s->cap, nc = next_cap(c, s->n);
    if (!grow((void **)&s->latency, c, nc, sizeof(double)) ||
        !grow((void **)&s->tokens, c, nc, sizeof(int)) || !grow((void **)&s->kind, c, nc, 1) ||
        !grow((void **)&s->hot, c, nc, L * sizeof(double))) {
        free(counts);
        return moe_error(MOE_ENOMEM, "stats: out of memory");
    }
    s->cap = nc;
    s->latency[s->n] = latency_s, s->tokens[s->n] = tokens, s->kind[s->n] = (unsigned char)kind;
    if (s->jsonl)
        fprintf(s->jsonl,
                "{\"step\":%zu,\"kind\":\"%s\",\"tokens\":%d,\"latency_s\":%.9g,\"layers\":[",
                s->n + 1, kind_names[kind], tokens, latency_s);
    for (int l = 0; l < L; l++) {
        const long *cl = counts + (size_t)l * E;
        long all = 0;
        int hot = 0;
        for (int e = 0; e < E; e++) {
            all += cl[e], hot = cl[e] > cl[hot] ? e : hot;
            s->win_hits[(size_t)l * E + e] += cl[e];
        }
        const double h = all ? (double)cl[hot] / all : 0;
        s->hot[s->n * L + l] = h;
        s->step_hot_sum[l] += h;
        if (s->jsonl) {
            fprintf(s->jsonl, "%s{\"hottest_expert\":%d,\"hottest_share\":%.6g,\"counts\":[",
                    l ? "," : "", hot, h);
            for (int e = 0; e < E; e++) fprintf(s->jsonl, "%s%ld", e ? "," : "", cl[e]);
            fputs("]}", s->jsonl);
        }
    }
    if (s->jsonl) fputs("]}\n", s->jsonl);
    free(counts);
    s->n++;
    if (++s->in_window == s->window) return close_window(s);
    return MOE_OK;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// P50/P95/P99/max of v[0..n) (sorted in place) into q[4].
static void quantiles(double *v, size_t n, double q[4]) {
    qsort(v, n, sizeof *v, cmp_double);
    q[0] = stats_percentile_sorted(v, n, 50), q[1] = stats_percentile_sorted(v, n, 95);
    q[2] = stats_percentile_sorted(v, n, 99), q[3] = v[n - 1];
}

moe_status moe_serve_stats_finish(moe_serve_stats *s, FILE *out) {
    if (s->in_window > 0) { // the last, partial window counts if it is at least half full
        moe_status st = s->in_window * 2 >= s->window || !s->n_win ? close_window(s) : MOE_OK;
        if (st) return st;
    }
    const int L = s->L, E = s->E;
    if (!s->n) return moe_error(MOE_EINVAL, "stats: no forward step was observed");
    double *v = malloc(((s->n + s->n_win) * (size_t)L + 1) * sizeof *v); // (per step and layer)
    if (!v) return moe_error(MOE_ENOMEM, "stats: out of memory");
    FILE *j = s->jsonl;
    if (j) fputs("{\"summary\":{\"latency\":{", j);
    fprintf(out, "serving telemetry: %zu forward steps, windows of %d steps (%zu)\n", s->n,
            s->window, s->n_win);
    int first_kind = 1;
    for (int kind = 0; kind < 3; kind++) {
        size_t n = 0;
        long toks = 0;
        for (size_t i = 0; i < s->n; i++)
            if (s->kind[i] == kind) v[n++] = s->latency[i], toks += s->tokens[i];
        if (!n) continue;
        double q[4];
        quantiles(v, n, q);
        fprintf(out,
                "  %-7s latency per step: P50 %.3f ms  P95 %.3f ms  P99 %.3f ms  max %.3f ms  "
                "(%zu steps, %.1f tokens/step)\n",
                kind_names[kind], 1e3 * q[0], 1e3 * q[1], 1e3 * q[2], 1e3 * q[3], n,
                (double)toks / n);
        if (j)
            fprintf(j,
                    "%s\"%s\":{\"steps\":%zu,\"p50_s\":%.9g,\"p95_s\":%.9g,\"p99_s\":%.9g,\"max_"
                    "s\":%.9g}",
                    first_kind ? "" : ",", kind_names[kind], n, q[0], q[1], q[2], q[3]);
        first_kind = 0;
    }
    // the experts' per-step batch: what batching changes (decode steps; eval windows)
    for (int kind = MOE_SERVE_DECODE; kind <= MOE_SERVE_EVAL; kind++) {
        size_t n = 0;
        double toks = 0;
        for (size_t i = 0; i < s->n; i++)
            if (s->kind[i] == kind)
                for (int l = 0; l < L; l++)
                    v[n++] = s->hot[i * L + l] * s->tokens[i] * s->k, toks += s->tokens[i];
        if (!n) continue;
        double q[4];
        quantiles(v, n, q);
        double mean = 0;
        for (size_t i = 0; i < n; i++) mean += v[i] / n;
        fprintf(out,
                "  %-7s rows per expert per step: %.2f on average; the hottest expert's: mean "
                "%.2f, P99 %.2f, max %.0f\n",
                kind_names[kind], toks / n * s->k / E, mean, q[2], q[3]);
    }
    if (j) fputs("},\"layers\":[", j);
    fprintf(out,
            "        | hottest share per step | its window means | hottest hit ratio/window |\n"
            "  layer |   mean    p99     max  |    min     max   |    min     max  expert   | P99 "
            "cf\n");
    for (int l = 0; l < L; l++) {
        double mean = 0, q[4], wq[4] = {0}, rmin = 1, rmax = 0;
        int rexp = 0;
        for (size_t i = 0; i < s->n; i++) v[i] = s->hot[i * L + l], mean += v[i];
        mean /= s->n ? (double)s->n : 1;
        quantiles(v, s->n, q);
        for (size_t w = 0; w < s->n_win; w++) {
            v[w] = s->win_mean_hot[w * L + l];
            const double r = s->win_ratio[w * L + l];
            if (r < rmin) rmin = r;
            if (r > rmax) rmax = r, rexp = s->win_expert[w * L + l];
        }
        if (s->n_win) quantiles(v, s->n_win, wq);
        const double cf = E * q[2]; // the P99 step's hottest expert, dropless
        fprintf(out, "  %5d | %6.3f %6.3f %7.3f  | %6.3f %7.3f   | %6.3f %7.3f  %6d   | %6.2f\n", l,
                mean, q[2], q[3], s->n_win ? v[0] : 0, s->n_win ? wq[3] : 0, rmin, rmax, rexp, cf);
        if (j)
            fprintf(j,
                    "%s{\"layer\":%d,\"hottest_share\":{\"mean\":%.6g,\"p99\":%.6g,\"max\":%.6g},"
                    "\"window_mean_hottest_share\":{\"min\":%.6g,\"max\":%.6g},"
                    "\"window_hottest_hit_ratio\":{\"min\":%.6g,\"max\":%.6g,\"expert\":%d},"
                    "\"p99_capacity_factor\":%.6g}",
                    l ? "," : "", l, mean, q[2], q[3], s->n_win ? v[0] : 0, s->n_win ? wq[3] : 0,
                    rmin, rmax, rexp, cf);
    }
    fprintf(out,
            "  hottest share: the hottest expert's part of a step's assignments (1/%d when\n"
            "  balanced); P99 cf = n_experts x its P99: the capacity factor a server needs to\n"
            "  drop nothing on the P99 step\n",
            E);
    if (j) fputs("]}}\n", j);
    free(v);
    if (j && (fflush(j) || ferror(j))) return moe_error(MOE_EIO, "--stats-out: write failed");
    return MOE_OK;
}
