// moe stats RUN_DIR --capacity (stats_internal.h): the capacity factor each layer needed to
// drop at most --max-drop of its assignments on the P99 step and on the worst step, and the
// expert buffers it needs at that factor.
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

#include "layers/moe.h"
#include "stats/quantile.h"
#include "stats/stats_internal.h"

// The shortest decimal capacity factor that gives capacity C (for a config file): the first
// of (C-1)*E/(T*k) rounded up to 2, 3, ... decimals that stats_capacity_of maps to C.
static double cf_short(long C, long T, int k, int E, int *decimals) {
    const double lo = (double)(C - 1) * E / ((double)T * k);
    for (int p = 2; p <= 15; p++) {
        const double scale = pow(10, p), d = (floor(lo * scale) + 1) / scale;
        if (stats_capacity_of(d, T, k, E) == C) {
            *decimals = p;
            return d;
        }
    }
    *decimals = 17;
    return stats_capacity_factor(C, T, k, E);
}

typedef struct {
    double cf; // the percentile or the exact factor of C
    long C;
    double cf_short; // the shortest decimal factor giving C
    int decimals;
    double rows, bytes_layer, bytes_all;
} need_t;

// Bytes per expert row as the MoE layer lays it out (layers/moe.h moe_row_bytes): each layer
// keeps its forward rows for the backward (fwd); the backward scratch is one for all layers
// (bwd: they run their backwards one at a time). The config's moe.d_model is the model's.
static void row_bytes_of(const run_t *rd, size_t *fwd, size_t *bwd) {
    moe_config mc = rd->cfg->model.moe;
    mc.d_model = rd->cfg->model.d_model;
    moe_row_bytes(&mc, fwd, bwd);
}

// The memory of E*C expert rows.
static need_t need_at(const run_t *rd, double cf, long C) {
    size_t fwd, bwd;
    row_bytes_of(rd, &fwd, &bwd);
    need_t n = {.cf = cf, .C = C};
    n.cf_short = C > 0 ? cf_short(C, rd->T_group, rd->top_k, rd->E, &n.decimals) : 0;
    n.rows = (double)rd->E * (double)C;
    n.bytes_layer = n.rows * (double)fwd;
    n.bytes_all = n.rows * ((double)fwd * moe_model_n_moe_layers(&rd->cfg->model) + (double)bwd);
    return n;
}

static cJSON *jneed(const need_t *n) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "capacity_factor", n->cf);
    cJSON_AddNumberToObject(o, "capacity", (double)n->C);
    cJSON_AddNumberToObject(o, "suggested_capacity_factor", n->cf_short);
    cJSON_AddNumberToObject(o, "rows", n->rows);
    cJSON_AddNumberToObject(o, "bytes_per_layer", n->bytes_layer);
    cJSON_AddNumberToObject(o, "bytes_all_layers", n->bytes_all);
    return o;
}

typedef struct {
    int layer;
    size_t n;
    need_t p99, worst;
    long worst_step;
    double drop;          // the run's drop fraction over all its steps
    long logged_capacity; // capacity field of the last record, -1 absent
} lcap_t;

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }

// What --capacity prints, computed once for the tables and the JSON.
typedef struct {
    size_t steps;
    long first, last;
    lcap_t *lc; // [nl] the layers reported
    int nl;
    need_t rp99, rworst; // the run: the largest P99 and worst-step factors over the layers
    int p99_layer, worst_layer;
    double cur_cf; // the factor in force (the latest step's under a schedule or auto)
    long cur_C;
    need_t cur;
    int approx; // records of a grad_accum > 1 run without micro_counts
    char note[256], tok_note[MOE_PATH_MAX + 256];
} cap_plan;

// The layers' needs (P99 and worst step) and the run's: the largest of the layers'.
static void plan_layers(const run_t *rd, double *scratch, cap_plan *P) {
    const int E = rd->E, k = rd->top_k;
    const long T = rd->T_group;
    double run_p99 = 0, run_worst = 0;
    int run_p99_layer = -1, run_worst_layer = -1, nl = 0;
    lcap_t *lc = P->lc;
    for (int l = 0; l < rd->n_layers; l++) {
        const layer_t *L = &rd->layers[l];
        if (!L->n || (rd->only_layer >= 0 && l != rd->only_layer)) continue;
        lcap_t *c = &lc[nl++];
        c->layer = l;
        c->n = L->n;
        size_t wi = 0;
        for (size_t i = 0; i < L->n; i++) {
            scratch[i] = L->r[i].need_cf;
            if (L->r[i].need_C > L->r[wi].need_C) wi = i;
        }
        qsort(scratch, L->n, sizeof *scratch, stats_cmp_double);
        const double p99 = stats_percentile_sorted(scratch, L->n, 99);
        c->p99 = need_at(rd, p99, stats_capacity_of(p99, T, k, E));
        c->worst = need_at(rd, L->r[wi].need_cf, L->r[wi].need_C);
        c->worst_step = L->r[wi].step;
        c->drop = stats_drop_fraction(L->r, 0, L->n);
        c->logged_capacity = L->r[L->n - 1].capacity;
        if (p99 > run_p99) run_p99 = p99, run_p99_layer = l;
        if (c->worst.cf > run_worst) run_worst = c->worst.cf, run_worst_layer = l;
    }
    P->nl = nl, P->p99_layer = run_p99_layer, P->worst_layer = run_worst_layer;
    P->rp99 = need_at(rd, run_p99, stats_capacity_of(run_p99, T, k, E));
    P->rworst = need_at(rd, run_worst, stats_capacity_of(run_worst, T, k, E));
}

// The factor in force and the notes on approximated or inconsistent records.
static void plan_current(const run_t *rd, cap_plan *P) {
    const int E = rd->E, k = rd->top_k;
    const long T = rd->T_group;
    // a schedule or auto: the factor of the latest step logged
    P->cur_cf = isnan(rd->last_cf) ? rd->cfg->model.moe.capacity_factor : rd->last_cf;
    P->cur_C = stats_capacity_of(P->cur_cf, T, k, E);
    P->cur = need_at(rd, P->cur_cf, P->cur_C);
    // Runs since micro_counts was logged are exact; older logs of grad_accum > 1 runs only
    // have the step's sum, and each micro-batch is then taken as an equal share of it.
    P->approx = rd->approx_records > 0;
    if (P->approx)
        snprintf(P->note, sizeof P->note,
                 "grad_accum = %d and %zu records without micro_counts: their micro-batch counts "
                 "are approximated as counts / %d",
                 rd->groups, rd->approx_records, rd->groups);
    if (rd->tokens_mismatch_line)
        snprintf(P->tok_note, sizeof P->tok_note,
                 "%s:%ld: tokens = %ld, but config.cfg gives batch_size*seq_len*grad_accum = %ld; "
                 "using the config",
                 rd->load_path, rd->tokens_mismatch_line, rd->tokens_seen, T * rd->groups);
}

// --capacity --json.
static void capacity_json(const run_t *rd, const cap_plan *P, FILE *out) {
    const long T = rd->T_group;
    cJSON *doc = cJSON_CreateObject();
    stats_add_run_fields(rd, doc, P->steps, P->first, P->last);
    cJSON_AddNumberToObject(doc, "max_drop", rd->max_drop);
    cJSON_AddNumberToObject(doc, "tokens_per_micro_batch", (double)T);
    cJSON_AddNumberToObject(doc, "grad_accum", rd->groups);
    cJSON_AddBoolToObject(doc, "groups_approximated", P->approx);
    if (P->approx) cJSON_AddStringToObject(doc, "note", P->note);
    if (P->tok_note[0]) cJSON_AddStringToObject(doc, "tokens_note", P->tok_note);
    cJSON_AddNumberToObject(doc, "d_model", rd->cfg->model.d_model);
    cJSON_AddNumberToObject(doc, "d_ff", rd->cfg->model.moe.d_ff);
    cJSON_AddNumberToObject(doc, "n_layers", moe_model_n_moe_layers(&rd->cfg->model));
    size_t fwd, bwd;
    row_bytes_of(rd, &fwd, &bwd);
    cJSON_AddNumberToObject(doc, "row_bytes", (double)fwd);          // per layer
    cJSON_AddNumberToObject(doc, "row_bytes_backward", (double)bwd); // once, shared
    cJSON *jc = cJSON_AddObjectToObject(doc, "current");
    cJSON_AddNumberToObject(jc, "capacity_factor", P->cur_cf);
    cJSON_AddNumberToObject(jc, "capacity", (double)P->cur_C);
    cJSON_AddNumberToObject(jc, "rows", P->cur.rows);
    cJSON_AddNumberToObject(jc, "bytes_per_layer", P->cur.bytes_layer);
    cJSON_AddNumberToObject(jc, "bytes_all_layers", P->cur.bytes_all);
    cJSON *layers = cJSON_AddArrayToObject(doc, "layers");
    for (int i = 0; i < P->nl; i++) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", P->lc[i].layer);
        cJSON_AddNumberToObject(o, "steps", (double)P->lc[i].n);
        cJSON_AddItemToObject(o, "p99", jneed(&P->lc[i].p99));
        cJSON *w = jneed(&P->lc[i].worst);
        cJSON_AddNumberToObject(w, "step", (double)P->lc[i].worst_step);
        cJSON_AddItemToObject(o, "worst", w);
        cJSON_AddItemToObject(o, "current_drop_fraction", stats_jnum(P->lc[i].drop));
        cJSON_AddItemToArray(layers, o);
    }
    cJSON *run = cJSON_AddObjectToObject(doc, "run");
    cJSON *jp = jneed(&P->rp99), *jw = jneed(&P->rworst);
    cJSON_AddNumberToObject(jp, "layer", P->p99_layer);
    cJSON_AddNumberToObject(jw, "layer", P->worst_layer);
    cJSON_AddItemToObject(run, "p99", jp);
    cJSON_AddItemToObject(run, "worst", jw);
    stats_print_json(out, doc);
}

// The text's header lines: the rule, the micro-batch, the buffers, the factor in force.
static void capacity_text_head(const run_t *rd, const cap_plan *P, FILE *out) {
    const long T = rd->T_group;
    stats_prose(rd, out,
                "  capacity needed per step: the smallest C with at most %g%% of the step's "
                "assignments beyond C (max_drop %g)\n",
                100 * rd->max_drop, rd->max_drop);
    stats_prose(rd, out,
                "  micro-batch: T = %ld tokens (batch_size %d x seq_len %d), grad_accum %d; "
                "cf = C*E/(T*k), C = ceil(T*k/E * cf)\n",
                T, rd->cfg->batch_size, rd->cfg->seq_len, rd->groups);
    if (P->approx) stats_prose(rd, out, "  note: %s\n", P->note);
    if (P->tok_note[0]) stats_prose(rd, out, "  note: %s\n", P->tok_note);
    size_t fwd, bwd;
    row_bytes_of(rd, &fwd, &bwd);
    stats_prose(rd, out,
                "  expert buffers: rows = E*C; per layer rows * (2*d_model + 3*d_ff) * 4 = rows * "
                "%zu (fp32 forward, kept for the backward), + rows * %zu once (the backward "
                "scratch the layers share)\n",
                fwd, bwd);
    stats_prose(rd, out,
                "  cf below: the shortest decimal capacity_factor that gives that C (P99: C of the "
                "99th percentile of the per-step factors; exact values in --json)\n");
    if (P->cur_cf > 0)
        stats_prose(
            rd, out,
            "  current: capacity_factor %g -> C = %ld per expert per micro-batch, %.0f rows, "
            "%.3f MiB per layer, %.3f MiB for %d layers\n\n",
            P->cur_cf, P->cur_C, P->cur.rows, mib(P->cur.bytes_layer), mib(P->cur.bytes_all),
            moe_model_n_moe_layers(&rd->cfg->model));
    else
        stats_prose(rd, out, "  current: capacity_factor 0 (dropless)\n\n");
}

// The table that fits STATS_COLUMNS.
static void capacity_table_narrow(const cap_plan *P, FILE *out) {
    fprintf(out, "%-5s %6s | %-25s | %-33s | %s\n", "", "", "needed on the P99 step",
            "needed on the worst step", "current");
    fprintf(out, "%5s %6s | %8s %6s %9s | %8s %6s %9s %7s | %s\n", "layer", "steps", "cf", "C",
            "MiB/layer", "cf", "C", "MiB/layer", "step", "drop fraction");
    for (int i = 0; i < P->nl; i++) {
        const lcap_t *c = &P->lc[i];
        char d[32];
        fprintf(out, "%5d %6zu | %8.*f %6ld %9.3f | %8.*f %6ld %9.3f %7ld | %s\n", c->layer, c->n,
                c->p99.decimals, c->p99.cf_short, c->p99.C, mib(c->p99.bytes_layer),
                c->worst.decimals, c->worst.cf_short, c->worst.C, mib(c->worst.bytes_layer),
                c->worst_step, stats_pct(d, sizeof d, c->drop, 2));
    }
}

// The full table (--wide): rows and the memory of all layers too.
static void capacity_table_wide(const run_t *rd, const cap_plan *P, FILE *out) {
    fprintf(out, "%-5s %6s | %-43s | %-51s | %s\n", "", "", "needed on the P99 step",
            "needed on the worst step", "current");
    char all[32]; // all layers' forward rows and the shared backward scratch
    snprintf(all, sizeof all, "MiB %dL", moe_model_n_moe_layers(&rd->cfg->model));
    fprintf(out, "%-5s %6s | %8s %6s %7s %9s %8s | %8s %6s %7s %9s %8s %7s | %s\n", "layer",
            "steps", "cf", "C", "rows", "MiB/layer", all, "cf", "C", "rows", "MiB/layer", all,
            "step", "drop fraction");
    for (int i = 0; i < P->nl; i++) {
        const lcap_t *c = &P->lc[i];
        char d[32];
        fprintf(out,
                "%5d %6zu | %8.*f %6ld %7.0f %9.3f %8.3f | %8.*f %6ld %7.0f %9.3f %8.3f "
                "%7ld | %s\n",
                c->layer, c->n, c->p99.decimals, c->p99.cf_short, c->p99.C, c->p99.rows,
                mib(c->p99.bytes_layer), mib(c->p99.bytes_all), c->worst.decimals,
                c->worst.cf_short, c->worst.C, c->worst.rows, mib(c->worst.bytes_layer),
                mib(c->worst.bytes_all), c->worst_step, stats_pct(d, sizeof d, c->drop, 2));
    }
}

// The run's lines: one capacity_factor for every layer.
static void capacity_run_lines(const run_t *rd, const cap_plan *P, FILE *out) {
    stats_prose(rd, out,
                "\nrun (one capacity_factor for every layer: the largest of the layers above):\n");
    stats_prose(rd, out,
                "  P99 step:   capacity_factor %.*f (layer %d) -> C = %ld, %.0f rows, %.3f MiB per "
                "layer, %.3f MiB for %d layers\n",
                P->rp99.decimals, P->rp99.cf_short, P->p99_layer, P->rp99.C, P->rp99.rows,
                mib(P->rp99.bytes_layer), mib(P->rp99.bytes_all),
                moe_model_n_moe_layers(&rd->cfg->model));
    stats_prose(rd, out,
                "  worst step: capacity_factor %.*f (layer %d) -> C = %ld, %.0f rows, %.3f MiB per "
                "layer, %.3f MiB for %d layers\n",
                P->rworst.decimals, P->rworst.cf_short, P->worst_layer, P->rworst.C, P->rworst.rows,
                mib(P->rworst.bytes_layer), mib(P->rworst.bytes_all),
                moe_model_n_moe_layers(&rd->cfg->model));
}

int stats_capacity_report(run_t *rd, FILE *out) {
    cap_plan *P = calloc(1, sizeof *P);
    double *scratch = NULL;
    if (P) stats_run_span(rd, rd->only_layer, &P->steps, &P->first, &P->last);
    if (P) scratch = malloc(P->steps * sizeof *scratch);
    if (P) P->lc = calloc(rd->n_layers > 0 ? (size_t)rd->n_layers : 1, sizeof *P->lc);
    if (!P || !scratch || !P->lc) {
        if (P) free(P->lc);
        free(scratch), free(P);
        moe_error(MOE_ENOMEM, "out of memory");
        return 1;
    }
    plan_layers(rd, scratch, P);
    plan_current(rd, P);
    if (rd->json) {
        capacity_json(rd, P, out);
    } else {
        stats_print_header(rd, out, P->steps, P->first, P->last);
        capacity_text_head(rd, P, out);
        if (rd->wide)
            capacity_table_wide(rd, P, out);
        else
            capacity_table_narrow(P, out);
        capacity_run_lines(rd, P, out);
    }
    free(scratch), free(P->lc), free(P);
    return 0;
}
