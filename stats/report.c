// moe stats RUN_DIR: the per-layer report (stats_internal.h): max/mean load (mean, P95, P99),
// CV, hottest and dead experts of the last window, drops in the first and last window,
// entropy, aux and z trends, exchange share, where the time goes, and the alerts.
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

typedef struct {
    int layer;
    size_t n, w; // records, window (min(window, n))
    long first_step, last_step;
    double mom_mean, mom_p95, mom_p99, mom_med_last;
    double cv_mean;
    int hot;
    double hot_share;
    int n_dead;
    int *dead;
    double drop_first, drop_last;
    double ent_mean, ent_frac;
    double aux_first, aux_last, z_first, z_last;
    double exch_share; // NaN: n/a
    int alert_load, alert_dead, alert_drops;
} lstat_t;

static double field(const rec_t *r, size_t off) {
    double v;
    memcpy(&v, (const char *)r + off, sizeof v);
    return v;
}

// Mean of the finite values of a field over records [a, b); NaN when none.
static double mean_field(const rec_t *r, size_t a, size_t b, size_t off) {
    double s = 0;
    size_t n = 0;
    for (size_t i = a; i < b; i++) {
        const double v = field(&r[i], off);
        if (isfinite(v)) s += v, n++;
    }
    return n ? s / (double)n : NAN;
}

static moe_status layer_report(const run_t *rd, int l, double *scratch, lstat_t *s) {
    const layer_t *L = &rd->layers[l];
    const rec_t *r = L->r;
    const size_t n = L->n, w = n < rd->window ? n : rd->window;
    const int E = rd->E;
    memset(s, 0, sizeof *s);
    s->layer = l;
    s->n = n;
    s->w = w;
    s->first_step = r[0].step;
    s->last_step = r[n - 1].step;

    double sum = 0;
    for (size_t i = 0; i < n; i++) scratch[i] = r[i].mom, sum += r[i].mom;
    s->mom_mean = sum / (double)n;
    qsort(scratch, n, sizeof *scratch, stats_cmp_double);
    s->mom_p95 = stats_percentile_sorted(scratch, n, 95);
    s->mom_p99 = stats_percentile_sorted(scratch, n, 99);
    for (size_t i = 0; i < w; i++) scratch[i] = r[n - w + i].mom;
    qsort(scratch, w, sizeof *scratch, stats_cmp_double);
    s->mom_med_last = w % 2 ? scratch[w / 2] : (scratch[w / 2 - 1] + scratch[w / 2]) / 2;
    s->cv_mean = mean_field(r, 0, n, offsetof(rec_t, cv));

    // hottest and dead experts over the last window (the ring holds exactly its w rows)
    double *tot = calloc((size_t)E, sizeof *tot);
    s->dead = malloc((size_t)E * sizeof *s->dead);
    if (!tot || !s->dead) {
        free(tot);
        return moe_error(MOE_ENOMEM, "out of memory");
    }
    double all = 0;
    for (size_t i = 0; i < w; i++)
        for (int e = 0; e < E; e++) tot[e] += (double)L->ring[i * (size_t)E + e];
    for (int e = 0; e < E; e++) {
        all += tot[e];
        if (tot[e] > tot[s->hot]) s->hot = e;
        if (tot[e] == 0) s->dead[s->n_dead++] = e;
    }
    s->hot_share = all > 0 ? tot[s->hot] / all : 0;
    free(tot);

    s->drop_first = stats_drop_fraction(r, 0, w);
    s->drop_last = stats_drop_fraction(r, n - w, n);
    s->ent_mean = mean_field(r, 0, n, offsetof(rec_t, entropy));
    s->ent_frac = E > 1 ? s->ent_mean / log((double)E) : NAN;
    s->aux_first = mean_field(r, 0, w, offsetof(rec_t, aux));
    s->aux_last = mean_field(r, n - w, n, offsetof(rec_t, aux));
    s->z_first = mean_field(r, 0, w, offsetof(rec_t, z));
    s->z_last = mean_field(r, n - w, n, offsetof(rec_t, z));

    // exchange share: sum exchange_s / sum step_s over the steps found in metrics.jsonl
    int any = 0;
    double ex = 0, ts = 0;
    for (size_t i = 0; i < n; i++) {
        if (isfinite(r[i].exch_s) && r[i].exch_s != 0) any = 1;
        const metric_t *m = stats_find_metric(rd, r[i].step);
        if (!m || !isfinite(m->step_s)) continue;
        ts += m->step_s;
        if (isfinite(r[i].exch_s)) ex += r[i].exch_s;
    }
    s->exch_share = any && ts > 0 ? ex / ts : NAN;

    s->alert_load = s->mom_med_last > rd->alert;
    s->alert_dead = s->n_dead > 0;
    s->alert_drops = isfinite(s->drop_first) && isfinite(s->drop_last) &&
                     s->drop_last > s->drop_first + 0.01 && s->drop_last > 1.5 * s->drop_first;
    return MOE_OK;
}

static const char *num(char *buf, size_t size, double v, int prec) {
    if (!isfinite(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.*f", prec, v);
    return buf;
}

static const char *sci(char *buf, size_t size, double v) {
    if (!isfinite(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.3e", v);
    return buf;
}

static void dead_list(char *buf, size_t size, const lstat_t *s) {
    size_t at = 0;
    buf[0] = 0;
    if (!s->n_dead) snprintf(buf, size, "-");
    for (int i = 0; i < s->n_dead && at < size; i++) {
        int k = snprintf(buf + at, size - at, "%s%d", i ? "," : "", s->dead[i]);
        if (k < 0) break;
        at += (size_t)k;
    }
}

static void alert_messages(const run_t *rd, const lstat_t *s, int kind, char *buf, size_t size) {
    char a[32], b[32];
    if (kind == 0)
        snprintf(buf, size,
                 "layer %d: max/mean load %.3f (median over the last %zu steps) exceeds %.3g; "
                 "hottest expert %d has %.1f%% of the tokens",
                 s->layer, s->mom_med_last, s->w, rd->alert, s->hot, 100 * s->hot_share);
    else if (kind == 1) {
        char list[256];
        dead_list(list, sizeof list, s);
        snprintf(buf, size, "layer %d: dead expert%s %s: no tokens in the last %zu steps", s->layer,
                 s->n_dead > 1 ? "s" : "", list, s->w);
    } else
        snprintf(buf, size,
                 "layer %d: drops rising: %s of the assignments dropped in the first %zu steps, "
                 "%s in the last %zu",
                 s->layer, stats_pct(a, sizeof a, s->drop_first, 2), s->w,
                 stats_pct(b, sizeof b, s->drop_last, 2), s->w);
}

static cJSON *jpair(const char *ka, double a, const char *kb, double b) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, ka, stats_jnum(a));
    cJSON_AddItemToObject(o, kb, stats_jnum(b));
    return o;
}

// Where the time goes: the mean over the logged steps with a "time" breakdown of each phase,
// as a share of the mean step. To out (the tables) or into doc (--json: "time").
static void time_report(const run_t *rd, FILE *out, cJSON *doc) {
    double sum[STATS_TIME_N] = {0}, step = 0;
    size_t n = 0;
    for (size_t i = 0; i < rd->m_n; i++) {
        const metric_t *m = &rd->m[i];
        if (!m->has_time || !isfinite(m->step_s)) continue;
        for (int k = 0; k < STATS_TIME_N; k++) sum[k] += m->time[k];
        step += m->step_s, n++;
    }
    if (!n) return;
    double parts = 0; // the step's phases (step_s: forward, backward and the update)
    for (int k = 0; k <= STATS_TIME_OPTIMIZER; k++) parts += sum[k];
    if (doc) {
        cJSON *t = cJSON_AddObjectToObject(doc, "time");
        cJSON_AddNumberToObject(t, "steps", (double)n);
        cJSON_AddNumberToObject(t, "step_s", step / n);
        cJSON *mean = cJSON_AddObjectToObject(t, "mean_s"),
              *share = cJSON_AddObjectToObject(t, "share");
        for (int k = 0; k < STATS_TIME_N; k++) {
            const char *name = stats_time_name(k);
            cJSON_AddNumberToObject(mean, name, sum[k] / n);
            if (k <= STATS_TIME_EXCHANGE) cJSON_AddNumberToObject(share, name, sum[k] / step);
        }
        cJSON_AddNumberToObject(share, "other", (step - parts) / step);
        return;
    }
    fprintf(out, "\n");
    stats_prose(rd, out,
                "time per step: %.1f ms (mean of %zu steps; rank 0's, metrics.jsonl \"time\")\n",
                1e3 * step / n, n);
    for (int k = 0; k < MOE_T_PHASES; k++) // one line of at most 6 x 16 columns
        fprintf(out, "  %s %.1f%%", moe_phase_names[k], 100 * sum[k] / step);
    fprintf(out, "\n  optimizer %.1f%%  other %.1f%%\n", 100 * sum[STATS_TIME_OPTIMIZER] / step,
            100 * (step - parts) / step);
    stats_prose(
        rd, out,
        "  the exchanges (in dispatch and combine, waiting included): %.1f%%; validation %.3g s "
        "and checkpoints %.3g s in all, outside the steps\n",
        100 * sum[STATS_TIME_EXCHANGE] / step, sum[STATS_TIME_VALIDATION],
        sum[STATS_TIME_CHECKPOINT]);
    if (sum[MOE_T_ROUTER] > 0.10 * step)
        stats_prose(
            rd, out,
            "  note: the router takes %.1f%% of the step (its GEMM has only n_experts outputs and "
            "runs at a fraction of the BLAS's rate; a known trap at small d_model)\n",
            100 * sum[MOE_T_ROUTER] / step);
}

// Layer s of the report as a JSON object.
static cJSON *json_layer(const lstat_t *s) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "layer", s->layer);
    cJSON_AddNumberToObject(o, "steps", (double)s->n);
    cJSON_AddNumberToObject(o, "first_step", (double)s->first_step);
    cJSON_AddNumberToObject(o, "last_step", (double)s->last_step);
    cJSON_AddNumberToObject(o, "window", (double)s->w);
    cJSON *mm = cJSON_AddObjectToObject(o, "max_over_mean");
    cJSON_AddItemToObject(mm, "mean", stats_jnum(s->mom_mean));
    cJSON_AddItemToObject(mm, "p95", stats_jnum(s->mom_p95));
    cJSON_AddItemToObject(mm, "p99", stats_jnum(s->mom_p99));
    cJSON_AddItemToObject(mm, "median_last_window", stats_jnum(s->mom_med_last));
    cJSON_AddItemToObject(o, "cv_mean", stats_jnum(s->cv_mean));
    cJSON *hot = cJSON_AddObjectToObject(o, "hottest_expert");
    cJSON_AddNumberToObject(hot, "expert", s->hot);
    cJSON_AddItemToObject(hot, "share", stats_jnum(s->hot_share));
    cJSON_AddItemToObject(o, "dead_experts", cJSON_CreateIntArray(s->dead, s->n_dead));
    cJSON_AddItemToObject(o, "drop_fraction",
                          jpair("first_window", s->drop_first, "last_window", s->drop_last));
    cJSON_AddItemToObject(o, "entropy",
                          jpair("mean", s->ent_mean, "fraction_of_log_e", s->ent_frac));
    cJSON_AddItemToObject(o, "aux",
                          jpair("first_window", s->aux_first, "last_window", s->aux_last));
    cJSON_AddItemToObject(o, "z", jpair("first_window", s->z_first, "last_window", s->z_last));
    cJSON_AddItemToObject(o, "exchange_share", stats_jnum(s->exch_share));
    return o;
}

// The alerts of layer s into the array `alerts`.
static void json_alerts(const run_t *rd, const lstat_t *s, cJSON *alerts) {
    const int on[3] = {s->alert_load, s->alert_dead, s->alert_drops};
    static const char *kinds[3] = {"load_imbalance", "dead_experts", "rising_drops"};
    for (int k = 0; k < 3; k++) {
        if (!on[k]) continue;
        char msg[512];
        alert_messages(rd, s, k, msg, sizeof msg);
        cJSON *a = cJSON_CreateObject();
        cJSON_AddNumberToObject(a, "layer", s->layer);
        cJSON_AddStringToObject(a, "kind", kinds[k]);
        if (k == 0) {
            cJSON_AddItemToObject(a, "value", stats_jnum(s->mom_med_last));
            cJSON_AddNumberToObject(a, "threshold", rd->alert);
            cJSON_AddNumberToObject(a, "expert", s->hot);
        } else if (k == 1) {
            cJSON_AddItemToObject(a, "experts", cJSON_CreateIntArray(s->dead, s->n_dead));
        } else {
            cJSON_AddItemToObject(a, "first_window", stats_jnum(s->drop_first));
            cJSON_AddItemToObject(a, "last_window", stats_jnum(s->drop_last));
        }
        cJSON_AddStringToObject(a, "message", msg);
        cJSON_AddItemToArray(alerts, a);
    }
}

// --json: the run, its layers, their alerts and where the time goes as one document.
static void report_json(const run_t *rd, const lstat_t *ls, int nl, size_t steps, long first,
                        long last, FILE *out) {
    cJSON *doc = cJSON_CreateObject();
    stats_add_run_fields(rd, doc, steps, first, last);
    cJSON_AddNumberToObject(doc, "window", (double)rd->window);
    cJSON_AddNumberToObject(doc, "alert_threshold", rd->alert);
    cJSON *layers = cJSON_AddArrayToObject(doc, "layers");
    cJSON *alerts = cJSON_CreateArray();
    for (int i = 0; i < nl; i++) {
        cJSON_AddItemToArray(layers, json_layer(&ls[i]));
        json_alerts(rd, &ls[i], alerts);
    }
    cJSON_AddItemToObject(doc, "alerts", alerts);
    time_report(rd, NULL, doc);
    stats_print_json(out, doc);
}

// The table that fits STATS_COLUMNS (the rest with --wide).
static void table_narrow(const run_t *rd, const lstat_t *ls, int nl, FILE *out) {
    fprintf(out, "%-5s %6s | %-29s | %-5s | %-10s | %-15s | %-7s | %s\n", "", "", "max/mean load",
            "cv", "hottest", "drop fraction", "entropy", "dead");
    fprintf(out, "%5s %6s | %6s %6s %6s %8s | %5s | %3s %6s | %7s %7s | %7s | %4s\n", "layer",
            "steps", "mean", "p95", "p99", "med-last", "mean", "exp", "share", "first", "last",
            "/log E", "last");
    for (int i = 0; i < nl; i++) {
        const lstat_t *s = &ls[i];
        char b[9][40];
        fprintf(out, "%5d %6zu | %6s %6s %6s %8s | %5s | %3d %6s | %7s %7s | %7s | %4d\n", s->layer,
                s->n, num(b[0], 40, s->mom_mean, 3), num(b[1], 40, s->mom_p95, 3),
                num(b[2], 40, s->mom_p99, 3), num(b[3], 40, s->mom_med_last, 3),
                num(b[4], 40, s->cv_mean, 3), s->hot, stats_pct(b[5], 40, s->hot_share, 1),
                stats_pct(b[6], 40, s->drop_first, 2), stats_pct(b[7], 40, s->drop_last, 2),
                num(b[8], 40, s->ent_frac, 3), s->n_dead);
    }
    stats_prose(rd, out,
                "  dead last: experts without a token in the last window (the alerts name "
                "them); --wide adds the aux and z loss trends, the entropy in nats and the "
                "exchange share\n");
}

// The full table (--wide).
static void table_wide(const lstat_t *ls, int nl, FILE *out) {
    fprintf(out, "%-5s %6s | %-30s | %-5s | %-13s | %-15s | %-13s | %-19s | %-19s | %-8s | %s\n",
            "", "", "max/mean load", "cv", "hottest expert", "drop fraction", "router entropy",
            "aux loss", "z loss", "exchange", "dead experts");
    fprintf(out,
            "%-5s %6s | %6s %6s %6s %8s | %5s | %6s %6s | %7s %7s | %5s %7s | %9s %9s | %9s "
            "%9s | %8s | %s\n",
            "layer", "steps", "mean", "p95", "p99", "med-last", "mean", "expert", "share", "first",
            "last", "nats", "/log E", "first", "last", "first", "last", "share", "(last window)");
    for (int i = 0; i < nl; i++) {
        const lstat_t *s = &ls[i];
        char b[16][40], dead[256];
        dead_list(dead, sizeof dead, s);
        fprintf(out,
                "%5d %6zu | %6s %6s %6s %8s | %5s | %6d %6s | %7s %7s | %5s %7s | %9s %9s | "
                "%9s %9s | %8s | %s\n",
                s->layer, s->n, num(b[0], 40, s->mom_mean, 3), num(b[1], 40, s->mom_p95, 3),
                num(b[2], 40, s->mom_p99, 3), num(b[3], 40, s->mom_med_last, 3),
                num(b[4], 40, s->cv_mean, 3), s->hot, stats_pct(b[5], 40, s->hot_share, 1),
                stats_pct(b[6], 40, s->drop_first, 2), stats_pct(b[7], 40, s->drop_last, 2),
                num(b[8], 40, s->ent_mean, 3), num(b[9], 40, s->ent_frac, 3),
                sci(b[10], 40, s->aux_first), sci(b[11], 40, s->aux_last),
                sci(b[12], 40, s->z_first), sci(b[13], 40, s->z_last),
                isfinite(s->exch_share) ? stats_pct(b[14], 40, s->exch_share, 1) : "n/a", dead);
    }
}

// The alerts, or that there are none.
static void print_alerts(const run_t *rd, const lstat_t *ls, int nl, FILE *out) {
    int n_alerts = 0;
    for (int i = 0; i < nl; i++)
        n_alerts += ls[i].alert_load + ls[i].alert_dead + ls[i].alert_drops;
    fprintf(out, "\n");
    if (!n_alerts)
        stats_prose(rd, out, "no alerts (max/mean threshold %.3g over the last %zu steps)\n",
                    rd->alert, rd->window);
    else
        stats_prose(rd, out, "%d alert%s (max/mean threshold %.3g; window %zu steps):\n", n_alerts,
                    n_alerts > 1 ? "s" : "", rd->alert, rd->window);
    for (int i = 0; i < nl; i++) {
        const int on[3] = {ls[i].alert_load, ls[i].alert_dead, ls[i].alert_drops};
        for (int k = 0; k < 3; k++) {
            if (!on[k]) continue;
            char msg[512];
            alert_messages(rd, &ls[i], k, msg, sizeof msg);
            stats_prose(rd, out, "  ALERT %s\n", msg);
        }
    }
}

int stats_report(run_t *rd, FILE *out) {
    size_t steps;
    long first, last;
    stats_run_span(rd, rd->only_layer, &steps, &first, &last);
    double *scratch = malloc(steps * sizeof *scratch);
    lstat_t *ls = calloc(rd->n_layers > 0 ? (size_t)rd->n_layers : 1, sizeof *ls);
    int nl = 0, rc = 0;
    if (!scratch || !ls) {
        moe_error(MOE_ENOMEM, "out of memory");
        rc = 1;
    }
    for (int l = 0; !rc && l < rd->n_layers; l++) {
        if (!rd->layers[l].n || (rd->only_layer >= 0 && l != rd->only_layer)) continue;
        if (layer_report(rd, l, scratch, &ls[nl++])) rc = 1;
    }
    if (!rc && rd->json) {
        report_json(rd, ls, nl, steps, first, last, out);
    } else if (!rc) {
        stats_print_header(rd, out, steps, first, last);
        stats_prose(rd, out,
                    "  window: the first and the last %zu logged steps of each layer (hottest and "
                    "dead experts: the last); max/mean and CV from the counts\n\n",
                    rd->window);
        if (rd->wide)
            table_wide(ls, nl, out);
        else
            table_narrow(rd, ls, nl, out);
        time_report(rd, out, NULL);
        print_alerts(rd, ls, nl, out);
    }
    if (ls)
        for (int i = 0; i < nl; i++) free(ls[i].dead);
    free(ls);
    free(scratch);
    return rc;
}
