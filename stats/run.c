// A run's logs read into memory for the report and --capacity (stats_internal.h): every
// validated record (records.h) becomes a few scalars, and each layer keeps the counts of its
// last `window` records in a ring. Memory is O(records + window * E).
#define _POSIX_C_SOURCE 200809L

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "layers/moe.h"
#include "stats/quantile.h"
#include "stats/stats_internal.h"

void stats_run_free(run_t *rd) {
    for (int l = 0; l < rd->n_layers; l++) {
        free(rd->layers[l].r);
        free(rd->layers[l].ring);
    }
    free(rd->layers);
    free(rd->m);
    free(rd->cfg);
}

// Record r of layer `layer` (its counts [E] into the ring of the last `window` rows).
static moe_status layer_add(run_t *rd, int layer, const rec_t *r, const long *counts) {
    const int E = rd->E;
    if (layer >= rd->n_layers) {
        layer_t *nl = realloc(rd->layers, (size_t)(layer + 1) * sizeof *nl);
        if (!nl) return moe_error(MOE_ENOMEM, "out of memory");
        memset(nl + rd->n_layers, 0, (size_t)(layer + 1 - rd->n_layers) * sizeof *nl);
        rd->layers = nl;
        rd->n_layers = (int)layer + 1;
    }
    layer_t *L = &rd->layers[layer];
    if (L->n == L->cap) {
        size_t nc = L->cap ? 2 * L->cap : 256;
        rec_t *nr = realloc(L->r, nc * sizeof *nr);
        if (!nr) return moe_error(MOE_ENOMEM, "out of memory");
        L->r = nr;
        L->cap = nc;
    }
    // ring of the last `window` count rows; grows until it holds `window` rows
    if (L->n < rd->window && L->n == L->ring_rows) {
        size_t rows = L->ring_rows ? 2 * L->ring_rows : 64;
        if (rows > rd->window) rows = rd->window;
        long *ring = realloc(L->ring, rows * (size_t)E * sizeof *ring);
        if (!ring) return moe_error(MOE_ENOMEM, "out of memory");
        L->ring = ring;
        L->ring_rows = rows;
    }
    memcpy(L->ring + (L->n % rd->window) * (size_t)E, counts, (size_t)E * sizeof *counts);
    L->r[L->n++] = *r;
    return MOE_OK;
}

// A validated expert_load.jsonl record into the run: its scalars, and its counts in the
// layer's ring of the last `window` rows.
static moe_status on_load_record(void *ctx, const stats_load_rec *in) {
    run_t *rd = ctx;
    const int E = rd->E = rd->lg->E; // (without config.cfg: the first record's)
    const long *counts = in->counts;
    rec_t r = {.step = in->step,
               .tokens = in->tokens,
               .capacity = in->capacity,
               .dropped = in->dropped,
               .entropy = in->entropy,
               .aux = in->aux,
               .z = in->z,
               .exch_s = in->exch_s};
    // max/mean and CV from the counts (the logged fields may be null)
    double sum = 0;
    for (int e = 0; e < E; e++) sum += (double)counts[e];
    int hot;
    r.routed = sum;
    moe_load_summary(counts, E, &r.mom, &r.cv, &hot);
    if (!isfinite(r.dropped) && in->kept) {
        double d = 0;
        for (int e = 0; e < E; e++) d += (double)(counts[e] - in->kept[e]);
        r.dropped = d;
    }
    if (in->ranks && !rd->ranks) rd->ranks = (int)in->ranks, rd->groups *= (int)in->ranks;
    if (rd->capacity) {
        if (in->micro) { // exact: each micro-batch's own counts
            r.need_C = stats_needed_capacity(in->micro, in->n_micro, E, 1, rd->max_drop);
        } else { // older logs: the step's sum, approximated as equal micro-batches
            if (rd->groups > 1) rd->approx_records++;
            r.need_C = stats_needed_capacity(counts, 1, E, rd->groups, rd->max_drop);
        }
        if (r.need_C > rd->T_group) r.need_C = rd->T_group; // counts beyond T: a config mismatch
        r.need_cf = stats_capacity_factor(r.need_C, rd->T_group, rd->top_k, E);
        if (r.tokens >= 0 && r.tokens != rd->T_group * rd->groups && !rd->tokens_mismatch_line) {
            rd->tokens_mismatch_line = in->line;
            rd->tokens_seen = r.tokens;
        }
    }
    return layer_add(rd, (int)in->layer, &r, counts);
}

static moe_status on_metrics_record(void *ctx, const stats_metrics_rec *in) {
    run_t *rd = ctx;
    metric_t m = {.step = in->step, .step_s = in->step_s, .has_time = in->has_time};
    memcpy(m.time, in->time, sizeof m.time);
    rd->m_skipped += in->skipped;
    if (isfinite(in->capacity_factor) && m.step > rd->last_cf_step)
        rd->last_cf = in->capacity_factor, rd->last_cf_step = m.step;
    if (rd->m_n == rd->m_cap) {
        size_t nc = rd->m_cap ? 2 * rd->m_cap : 256;
        metric_t *nm = realloc(rd->m, nc * sizeof *nm);
        if (!nm) return moe_error(MOE_ENOMEM, "out of memory");
        rd->m = nm;
        rd->m_cap = nc;
    }
    rd->m[rd->m_n++] = m;
    return MOE_OK;
}

const metric_t *stats_find_metric(const run_t *rd, long step) {
    size_t lo = 0, hi = rd->m_n;
    while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        if (rd->m[mid].step < step)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo < rd->m_n && rd->m[lo].step == step ? &rd->m[lo] : NULL;
}

moe_status stats_load_run(run_t *rd, FILE *err) {
    snprintf(rd->cfg_path, sizeof rd->cfg_path, "%s/config.cfg", rd->dir);
    snprintf(rd->load_path, sizeof rd->load_path, "%s/expert_load.jsonl", rd->dir);
    snprintf(rd->metrics_path, sizeof rd->metrics_path, "%s/metrics.jsonl", rd->dir);

    // config.cfg: required by --capacity (micro-batch, model sizes); else optional
    struct stat sb;
    if (stat(rd->cfg_path, &sb) == 0 || errno != ENOENT || rd->capacity) {
        if (!(rd->cfg = malloc(sizeof *rd->cfg))) return moe_error(MOE_ENOMEM, "out of memory");
        moe_status st = moe_train_config_load(rd->cfg, rd->cfg_path, 0, NULL);
        if (st) {
            free(rd->cfg);
            rd->cfg = NULL;
            return st;
        }
        rd->E = rd->cfg->model.moe.n_experts;
        rd->top_k = rd->cfg->model.moe.top_k;
        rd->groups = rd->cfg->grad_accum;
        rd->T_group = (long)rd->cfg->batch_size * rd->cfg->seq_len;
    }

    stats_log lg = {.path = rd->load_path,
                    .cfg_path = rd->cfg ? rd->cfg_path : NULL,
                    .E = rd->E,
                    .n_layers = rd->cfg ? rd->cfg->model.n_layers : 0,
                    .grad_accum = rd->cfg ? rd->cfg->grad_accum : 0,
                    .from = rd->from,
                    .required = 1};
    rd->lg = &lg;
    moe_status st = stats_read_load(&lg, on_load_record, rd);
    rd->lg = NULL;
    if (st) return st;
    if (lg.partial)
        fprintf(err, "moe stats: note: %s:%ld: partial last line ignored (run in progress?)\n",
                rd->load_path, lg.partial);
    size_t total = 0;
    for (int l = 0; l < rd->n_layers; l++) total += rd->layers[l].n;
    if (total == 0 && rd->from > 0)
        return moe_error(MOE_EIO, "%s: no expert-load records at or after step %ld (--from)",
                         rd->load_path, rd->from);
    if (total == 0) return moe_error(MOE_EIO, "%s: no expert-load records", rd->load_path);

    stats_log ml = {.path = rd->metrics_path, .from = rd->from};
    if ((st = stats_read_metrics(&ml, on_metrics_record, rd))) return st;
    rd->have_metrics = !ml.missing;
    if (ml.partial)
        fprintf(err, "moe stats: note: %s:%ld: partial last line ignored (run in progress?)\n",
                rd->metrics_path, ml.partial);
    return MOE_OK;
}

// sum dropped / sum counts over records [a, b) with a known drop count.
double stats_drop_fraction(const rec_t *r, size_t a, size_t b) {
    double d = 0, t = 0;
    size_t n = 0;
    for (size_t i = a; i < b; i++) {
        if (!isfinite(r[i].dropped)) continue;
        d += r[i].dropped, t += r[i].routed, n++;
    }
    return n == 0 ? NAN : t > 0 ? d / t : 0;
}

int stats_cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}
