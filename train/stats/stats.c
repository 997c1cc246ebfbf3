// `moe stats`: the expert-load report and capacity planning from a run's logs (stats.h).
//
// The logs are streamed once: every record becomes a few scalars (its max/mean load, CV,
// drops, entropy, aux, z, exchange time and, for --capacity, the capacity it needed), and
// each layer keeps the per-expert counts of its last `window` records in a ring, which is
// all that the hottest/dead experts need. Memory is O(records + window * E).
#define _POSIX_C_SOURCE 200809L

#include "train/stats/stats.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "layers/moe.h"
#include "layers/status.h"
#include "layers/timing.h"
#include "cli/options.h"
#include "train/config/config.h"
#include "train/stats/records.h"

#define STATS_DEFAULT_WINDOW 100
#define STATS_DEFAULT_ALERT 1.5
#define STATS_DEFAULT_MAX_DROP 0.01
#define STATS_COLUMNS 100 // the default tables and prose fit this; --wide: the full tables

// ---- numbers ------------------------------------------------------------------------

double stats_percentile_sorted(const double *a, size_t n, double p) {
    if (n == 0) return NAN;
    // numpy: q = p / 100; virtual index (n-1)*q; _lerp(previous, next, gamma).
    const double q = p / 100.0;
    const double vi = (double)(n - 1) * q;
    if (!(vi > 0)) return a[0];
    if (vi >= (double)(n - 1)) return a[n - 1];
    const double lo = floor(vi);
    const size_t i = (size_t)lo;
    const double g = vi - lo, prev = a[i], next = a[i + 1], diff = next - prev;
    return g >= 0.5 ? next - diff * (1 - g) : prev + diff * g;
}

long stats_needed_capacity(const long *counts, int rows, int E, int groups_per_row,
                           double max_drop) {
    // Row r stands for n = groups_per_row equal groups with c_e = counts[r][e] / n each; the
    // dropped assignments at capacity C are sum_r sum_e n * max(0, c_e - C)
    // = sum_r sum_e max(0, counts[r][e] - n*C), an exact integer sum compared with
    // max_drop * sum of all counts. The smallest C that passes is found by bisection.
    if (E <= 0 || rows <= 0 || groups_per_row <= 0) return 1;
    const long n = groups_per_row;
    const size_t cells = (size_t)rows * (size_t)E;
    long max = 0;
    double total = 0;
    for (size_t i = 0; i < cells; i++) {
        if (counts[i] > max) max = counts[i];
        total += (double)counts[i];
    }
    const double allowed = max_drop * total;
    long lo = 0, hi = (max + n - 1) / n; // at hi nothing overflows
    while (lo < hi) {
        const long mid = lo + (hi - lo) / 2;
        double over = 0;
        for (size_t i = 0; i < cells; i++)
            if (counts[i] > n * mid) over += (double)(counts[i] - n * mid);
        if (over <= allowed)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo < 1 ? 1 : lo; // capacity 0 means dropless in the config
}

long stats_capacity_of(double cf, long T, int k, int E) {
    if (!(cf > 0)) return 0; // (a NaN too)
    const moe_config c = {.n_experts = E, .top_k = k, .capacity_factor = cf};
    return moe_capacity(&c, (int)T); // T <= MOE_CONFIG_MAX_TOKENS (stats.h)
}

double stats_capacity_factor(long C, long T, int k, int E) {
    double cf = (double)C * E / ((double)T * k);
    for (int i = 0; i < 64; i++) {
        const long got = stats_capacity_of(cf, T, k, E);
        if (got == C || (C >= T && got >= T)) break;
        cf = nextafter(cf, got > C ? 0.0 : INFINITY);
    }
    return cf;
}

// ---- the run ------------------------------------------------------------------------

typedef struct {
    long step;
    long tokens;                             // -1 when absent
    long capacity;                           // -1 when absent
    double routed;                           // sum of counts
    double dropped;                          // NaN when unknown
    double mom, cv, entropy, aux, z, exch_s; // NaN when null or absent
    long need_C;                             // --capacity: per-group capacity needed for max_drop
    double need_cf;                          // its capacity factor
} rec_t;

typedef struct {
    rec_t *r;
    size_t n, cap;
    long *ring; // counts of the last `window` records, row i % window of ring_rows
    size_t ring_rows;
} layer_t;


typedef struct {
    long step;
    double step_s; // NaN when skipped, null or absent
    int has_time;
    double time[TIME_N];
} metric_t;

typedef struct {
    // options
    const char *dir;
    int only_layer; // -1: all
    size_t window;
    double alert;
    int json, capacity, wide;
    double max_drop;
    long from; // --from: records of earlier steps are ignored (0: none)
    // inputs
    char load_path[MOE_PATH_MAX + 32], metrics_path[MOE_PATH_MAX + 32], cfg_path[MOE_PATH_MAX + 32];
    moe_train_config *cfg; // NULL without config.cfg
    int E;
    long T_group;
    int groups, top_k; // groups: capacity groups per step, grad_accum x the run's ranks
    int ranks;         // the ranks of an expert-parallel run ("ranks" in its records), 0: one
    layer_t *layers;
    int n_layers; // slots: 1 + the largest layer index seen
    metric_t *m;
    size_t m_n, m_cap;
    long m_skipped;
    double last_cf; // capacity_factor of the latest metrics record (schedule/auto), NAN: none
    long last_cf_step;
    int have_metrics;
    stats_log *lg; // the expert_load.jsonl reader while it reads (its E: the records')
    long tokens_mismatch_line, tokens_seen;
    size_t approx_records; // records of a grad_accum > 1 run without micro_counts
} run_t;

static void run_free(run_t *rd) {
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


// ---- reading (records.h checks every field) ----------------------------------------

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

static const metric_t *find_metric(const run_t *rd, long step) {
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

static moe_status load_run(run_t *rd, FILE *err) {
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

// ---- per-layer report ---------------------------------------------------------------

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

// sum dropped / sum counts over records [a, b) with a known drop count.
static double drop_fraction(const rec_t *r, size_t a, size_t b) {
    double d = 0, t = 0;
    size_t n = 0;
    for (size_t i = a; i < b; i++) {
        if (!isfinite(r[i].dropped)) continue;
        d += r[i].dropped, t += r[i].routed, n++;
    }
    return n == 0 ? NAN : t > 0 ? d / t : 0;
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
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
    qsort(scratch, n, sizeof *scratch, cmp_double);
    s->mom_p95 = stats_percentile_sorted(scratch, n, 95);
    s->mom_p99 = stats_percentile_sorted(scratch, n, 99);
    for (size_t i = 0; i < w; i++) scratch[i] = r[n - w + i].mom;
    qsort(scratch, w, sizeof *scratch, cmp_double);
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

    s->drop_first = drop_fraction(r, 0, w);
    s->drop_last = drop_fraction(r, n - w, n);
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
        const metric_t *m = find_metric(rd, r[i].step);
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

static const char *pct(char *buf, size_t size, double v, int prec) {
    if (!isfinite(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.*f%%", prec, 100 * v);
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
                 s->layer, pct(a, sizeof a, s->drop_first, 2), s->w,
                 pct(b, sizeof b, s->drop_last, 2), s->w);
}

static cJSON *jnum(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

static cJSON *jpair(const char *ka, double a, const char *kb, double b) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddItemToObject(o, ka, jnum(a));
    cJSON_AddItemToObject(o, kb, jnum(b));
    return o;
}

// One line of s[0, len) wrapped at STATS_COLUMNS at spaces; continuation lines are indented
// two more than the line (a word longer than a line is not cut).
static void wrap_line(FILE *out, const char *s, size_t len) {
    const size_t indent = strspn(s, " "), cont = indent + 2;
    int first = 1;
    for (;;) {
        const size_t avail = STATS_COLUMNS - (first ? 0 : cont);
        if (len <= avail) break;
        size_t cut = avail;
        while (cut > indent && s[cut] != ' ') cut--;
        if (cut <= indent) { // one long word: break after it
            cut = avail;
            while (cut < len && s[cut] != ' ') cut++;
            if (cut >= len) break;
        }
        fprintf(out, "%*s%.*s\n", first ? 0 : (int)cont, "", (int)cut, s);
        while (cut < len && s[cut] == ' ') cut++;
        s += cut, len -= cut;
        first = 0;
    }
    fprintf(out, "%*s%.*s", first ? 0 : (int)cont, "", (int)len, s);
}

// Prose (headers, notes, alerts): as formatted with --wide, else every line wrapped to fit
// STATS_COLUMNS.
__attribute__((format(printf, 3, 4))) static void prose(const run_t *rd, FILE *out, const char *fmt,
                                                        ...) {
    char buf[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (rd->wide) {
        fputs(buf, out);
        return;
    }
    for (const char *p = buf; *p;) {
        const size_t n = strcspn(p, "\n");
        wrap_line(out, p, n);
        if (!p[n]) break;
        fputc('\n', out);
        p += n + 1;
    }
}

static void print_json(FILE *out, cJSON *doc) {
    char *s = cJSON_Print(doc);
    if (s) {
        fputs(s, out);
        fputc('\n', out);
        free(s);
    }
    cJSON_Delete(doc);
}

static void add_run_fields(const run_t *rd, cJSON *doc, size_t steps, long first, long last) {
    cJSON_AddStringToObject(doc, "run_dir", rd->dir);
    cJSON_AddNumberToObject(doc, "n_experts", rd->E);
    cJSON_AddItemToObject(doc, "top_k",
                          rd->cfg ? cJSON_CreateNumber(rd->top_k) : cJSON_CreateNull());
    cJSON_AddNumberToObject(doc, "steps_logged", (double)steps);
    cJSON_AddNumberToObject(doc, "first_step", (double)first);
    cJSON_AddNumberToObject(doc, "last_step", (double)last);
    if (rd->from > 0)
        cJSON_AddNumberToObject(doc, "from_step", (double)rd->from);
    else
        cJSON_AddNullToObject(doc, "from_step");
    if (rd->have_metrics) {
        cJSON_AddNumberToObject(doc, "metrics_steps", (double)rd->m_n);
        cJSON_AddNumberToObject(doc, "skipped_steps", (double)rd->m_skipped);
    } else {
        cJSON_AddNullToObject(doc, "metrics_steps");
        cJSON_AddNullToObject(doc, "skipped_steps");
    }
}

// Steps logged by the layer with the most records, and the overall first/last step.
static void run_span(const run_t *rd, int only, size_t *steps, long *first, long *last) {
    *steps = 0, *first = LONG_MAX, *last = 0;
    for (int l = 0; l < rd->n_layers; l++) {
        const layer_t *L = &rd->layers[l];
        if (!L->n || (only >= 0 && l != only)) continue;
        if (L->n > *steps) *steps = L->n;
        if (L->r[0].step < *first) *first = L->r[0].step;
        if (L->r[L->n - 1].step > *last) *last = L->r[L->n - 1].step;
    }
}

static void print_header(const run_t *rd, FILE *out, size_t steps, long first, long last) {
    fprintf(out, "moe stats: %s\n", rd->dir);
    char from[64] = "";
    if (rd->from > 0) snprintf(from, sizeof from, " (--from %ld: earlier steps ignored)", rd->from);
    if (rd->have_metrics)
        prose(rd, out,
              "  expert_load.jsonl: %zu steps logged (steps %ld..%ld)%s; metrics.jsonl: %zu "
              "steps, %ld skipped\n",
              steps, first, last, from, rd->m_n, rd->m_skipped);
    else
        prose(rd, out,
              "  expert_load.jsonl: %zu steps logged (steps %ld..%ld)%s; no metrics.jsonl\n", steps,
              first, last, from);
    if (rd->cfg && rd->cfg->capacity.mode != CAPACITY_FIXED)
        fprintf(out,
                "  model: %d layers, %d experts, top-%d, capacity_factor %s: %.4g at step %ld\n",
                rd->cfg->model.n_layers, rd->E, rd->top_k,
                rd->cfg->capacity.mode == CAPACITY_AUTO ? "auto" : "scheduled",
                isnan(rd->last_cf) ? rd->cfg->model.moe.capacity_factor : rd->last_cf,
                rd->last_cf_step);
    else if (rd->cfg)
        fprintf(out, "  model: %d layers, %d experts, top-%d, capacity_factor %g%s\n",
                rd->cfg->model.n_layers, rd->E, rd->top_k, rd->cfg->model.moe.capacity_factor,
                rd->cfg->model.moe.capacity_factor > 0 ? "" : " (dropless)");
    else
        fprintf(out, "  model: %d experts (no config.cfg)\n", rd->E);
}

// Where the time goes: the mean over the logged steps with a "time" breakdown of each phase,
// as a share of the mean step. To out (the tables) or into doc (--json: "time").
static void time_report(const run_t *rd, FILE *out, cJSON *doc) {
    double sum[TIME_N] = {0}, step = 0;
    size_t n = 0;
    for (size_t i = 0; i < rd->m_n; i++) {
        const metric_t *m = &rd->m[i];
        if (!m->has_time || !isfinite(m->step_s)) continue;
        for (int k = 0; k < TIME_N; k++) sum[k] += m->time[k];
        step += m->step_s, n++;
    }
    if (!n) return;
    double parts = 0; // the step's phases (step_s: forward, backward and the update)
    for (int k = 0; k <= TIME_OPTIMIZER; k++) parts += sum[k];
    if (doc) {
        cJSON *t = cJSON_AddObjectToObject(doc, "time");
        cJSON_AddNumberToObject(t, "steps", (double)n);
        cJSON_AddNumberToObject(t, "step_s", step / n);
        cJSON *mean = cJSON_AddObjectToObject(t, "mean_s"),
              *share = cJSON_AddObjectToObject(t, "share");
        for (int k = 0; k < TIME_N; k++) {
            const char *name = stats_time_name(k);
            cJSON_AddNumberToObject(mean, name, sum[k] / n);
            if (k <= TIME_EXCHANGE) cJSON_AddNumberToObject(share, name, sum[k] / step);
        }
        cJSON_AddNumberToObject(share, "other", (step - parts) / step);
        return;
    }
    fprintf(out, "\n");
    prose(rd, out, "time per step: %.1f ms (mean of %zu steps; rank 0's, metrics.jsonl \"time\")\n",
          1e3 * step / n, n);
    for (int k = 0; k < MOE_T_PHASES; k++) // one line of at most 6 x 16 columns
        fprintf(out, "  %s %.1f%%", moe_phase_names[k], 100 * sum[k] / step);
    fprintf(out, "\n  optimizer %.1f%%  other %.1f%%\n", 100 * sum[TIME_OPTIMIZER] / step,
            100 * (step - parts) / step);
    prose(rd, out,
          "  the exchanges (in dispatch and combine, waiting included): %.1f%%; validation %.3g s "
          "and checkpoints %.3g s in all, outside the steps\n",
          100 * sum[TIME_EXCHANGE] / step, sum[TIME_VALIDATION], sum[TIME_CHECKPOINT]);
    if (sum[MOE_T_ROUTER] > 0.10 * step)
        prose(
            rd, out,
            "  note: the router takes %.1f%% of the step (its GEMM has only n_experts outputs and "
            "runs at a fraction of the BLAS's rate; a known trap at small d_model)\n",
            100 * sum[MOE_T_ROUTER] / step);
}

static int report(run_t *rd, FILE *out) {
    size_t steps;
    long first, last;
    run_span(rd, rd->only_layer, &steps, &first, &last);
    double *scratch = malloc(steps * sizeof *scratch);
    lstat_t *ls = calloc(rd->n_layers > 0 ? (size_t)rd->n_layers : 1, sizeof *ls);
    int nl = 0, rc = 0;
    if (!scratch || !ls) {
        moe_error(MOE_ENOMEM, "out of memory");
        rc = 1;
        goto done;
    }
    for (int l = 0; l < rd->n_layers; l++) {
        if (!rd->layers[l].n || (rd->only_layer >= 0 && l != rd->only_layer)) continue;
        if (layer_report(rd, l, scratch, &ls[nl++])) {
            rc = 1;
            goto done;
        }
    }

    if (rd->json) {
        cJSON *doc = cJSON_CreateObject();
        add_run_fields(rd, doc, steps, first, last);
        cJSON_AddNumberToObject(doc, "window", (double)rd->window);
        cJSON_AddNumberToObject(doc, "alert_threshold", rd->alert);
        cJSON *layers = cJSON_AddArrayToObject(doc, "layers");
        cJSON *alerts = cJSON_CreateArray();
        for (int i = 0; i < nl; i++) {
            const lstat_t *s = &ls[i];
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", s->layer);
            cJSON_AddNumberToObject(o, "steps", (double)s->n);
            cJSON_AddNumberToObject(o, "first_step", (double)s->first_step);
            cJSON_AddNumberToObject(o, "last_step", (double)s->last_step);
            cJSON_AddNumberToObject(o, "window", (double)s->w);
            cJSON *mm = cJSON_AddObjectToObject(o, "max_over_mean");
            cJSON_AddItemToObject(mm, "mean", jnum(s->mom_mean));
            cJSON_AddItemToObject(mm, "p95", jnum(s->mom_p95));
            cJSON_AddItemToObject(mm, "p99", jnum(s->mom_p99));
            cJSON_AddItemToObject(mm, "median_last_window", jnum(s->mom_med_last));
            cJSON_AddItemToObject(o, "cv_mean", jnum(s->cv_mean));
            cJSON *hot = cJSON_AddObjectToObject(o, "hottest_expert");
            cJSON_AddNumberToObject(hot, "expert", s->hot);
            cJSON_AddItemToObject(hot, "share", jnum(s->hot_share));
            cJSON_AddItemToObject(o, "dead_experts", cJSON_CreateIntArray(s->dead, s->n_dead));
            cJSON_AddItemToObject(
                o, "drop_fraction",
                jpair("first_window", s->drop_first, "last_window", s->drop_last));
            cJSON_AddItemToObject(o, "entropy",
                                  jpair("mean", s->ent_mean, "fraction_of_log_e", s->ent_frac));
            cJSON_AddItemToObject(o, "aux",
                                  jpair("first_window", s->aux_first, "last_window", s->aux_last));
            cJSON_AddItemToObject(o, "z",
                                  jpair("first_window", s->z_first, "last_window", s->z_last));
            cJSON_AddItemToObject(o, "exchange_share", jnum(s->exch_share));
            cJSON_AddItemToArray(layers, o);
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
                    cJSON_AddItemToObject(a, "value", jnum(s->mom_med_last));
                    cJSON_AddNumberToObject(a, "threshold", rd->alert);
                    cJSON_AddNumberToObject(a, "expert", s->hot);
                } else if (k == 1) {
                    cJSON_AddItemToObject(a, "experts", cJSON_CreateIntArray(s->dead, s->n_dead));
                } else {
                    cJSON_AddItemToObject(a, "first_window", jnum(s->drop_first));
                    cJSON_AddItemToObject(a, "last_window", jnum(s->drop_last));
                }
                cJSON_AddStringToObject(a, "message", msg);
                cJSON_AddItemToArray(alerts, a);
            }
        }
        cJSON_AddItemToObject(doc, "alerts", alerts);
        time_report(rd, NULL, doc);
        print_json(out, doc);
        goto done;
    }

    print_header(rd, out, steps, first, last);
    prose(rd, out,
          "  window: the first and the last %zu logged steps of each layer (hottest and dead "
          "experts: the last); max/mean and CV from the counts\n\n",
          rd->window);
    if (!rd->wide) { // STATS_COLUMNS: the rest with --wide
        fprintf(out, "%-5s %6s | %-29s | %-5s | %-10s | %-15s | %-7s | %s\n", "", "",
                "max/mean load", "cv", "hottest", "drop fraction", "entropy", "dead");
        fprintf(out, "%5s %6s | %6s %6s %6s %8s | %5s | %3s %6s | %7s %7s | %7s | %4s\n", "layer",
                "steps", "mean", "p95", "p99", "med-last", "mean", "exp", "share", "first", "last",
                "/log E", "last");
        for (int i = 0; i < nl; i++) {
            const lstat_t *s = &ls[i];
            char b[9][40];
            fprintf(out, "%5d %6zu | %6s %6s %6s %8s | %5s | %3d %6s | %7s %7s | %7s | %4d\n",
                    s->layer, s->n, num(b[0], 40, s->mom_mean, 3), num(b[1], 40, s->mom_p95, 3),
                    num(b[2], 40, s->mom_p99, 3), num(b[3], 40, s->mom_med_last, 3),
                    num(b[4], 40, s->cv_mean, 3), s->hot, pct(b[5], 40, s->hot_share, 1),
                    pct(b[6], 40, s->drop_first, 2), pct(b[7], 40, s->drop_last, 2),
                    num(b[8], 40, s->ent_frac, 3), s->n_dead);
        }
        prose(rd, out,
              "  dead last: experts without a token in the last window (the alerts name "
              "them); --wide adds the aux and z loss trends, the entropy in nats and the "
              "exchange share\n");
    } else {
        fprintf(out,
                "%-5s %6s | %-30s | %-5s | %-13s | %-15s | %-13s | %-19s | %-19s | %-8s | %s\n", "",
                "", "max/mean load", "cv", "hottest expert", "drop fraction", "router entropy",
                "aux loss", "z loss", "exchange", "dead experts");
        fprintf(out,
                "%-5s %6s | %6s %6s %6s %8s | %5s | %6s %6s | %7s %7s | %5s %7s | %9s %9s | %9s "
                "%9s | %8s | %s\n",
                "layer", "steps", "mean", "p95", "p99", "med-last", "mean", "expert", "share",
                "first", "last", "nats", "/log E", "first", "last", "first", "last", "share",
                "(last window)");
        for (int i = 0; i < nl; i++) {
            const lstat_t *s = &ls[i];
            char b[16][40], dead[256];
            dead_list(dead, sizeof dead, s);
            fprintf(out,
                    "%5d %6zu | %6s %6s %6s %8s | %5s | %6d %6s | %7s %7s | %5s %7s | %9s %9s | "
                    "%9s %9s | %8s | %s\n",
                    s->layer, s->n, num(b[0], 40, s->mom_mean, 3), num(b[1], 40, s->mom_p95, 3),
                    num(b[2], 40, s->mom_p99, 3), num(b[3], 40, s->mom_med_last, 3),
                    num(b[4], 40, s->cv_mean, 3), s->hot, pct(b[5], 40, s->hot_share, 1),
                    pct(b[6], 40, s->drop_first, 2), pct(b[7], 40, s->drop_last, 2),
                    num(b[8], 40, s->ent_mean, 3), num(b[9], 40, s->ent_frac, 3),
                    sci(b[10], 40, s->aux_first), sci(b[11], 40, s->aux_last),
                    sci(b[12], 40, s->z_first), sci(b[13], 40, s->z_last),
                    isfinite(s->exch_share) ? pct(b[14], 40, s->exch_share, 1) : "n/a", dead);
        }
    }
    time_report(rd, out, NULL);
    int n_alerts = 0;
    for (int i = 0; i < nl; i++)
        n_alerts += ls[i].alert_load + ls[i].alert_dead + ls[i].alert_drops;
    fprintf(out, "\n");
    if (!n_alerts)
        prose(rd, out, "no alerts (max/mean threshold %.3g over the last %zu steps)\n", rd->alert,
              rd->window);
    else
        prose(rd, out, "%d alert%s (max/mean threshold %.3g; window %zu steps):\n", n_alerts,
              n_alerts > 1 ? "s" : "", rd->alert, rd->window);
    for (int i = 0; i < nl; i++) {
        const int on[3] = {ls[i].alert_load, ls[i].alert_dead, ls[i].alert_drops};
        for (int k = 0; k < 3; k++) {
            if (!on[k]) continue;
            char msg[512];
            alert_messages(rd, &ls[i], k, msg, sizeof msg);
            prose(rd, out, "  ALERT %s\n", msg);
        }
    }
done:
    if (ls)
        for (int i = 0; i < nl; i++) free(ls[i].dead);
    free(ls);
    free(scratch);
    return rc;
}

// ---- --capacity ---------------------------------------------------------------------

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
    n.bytes_all = n.rows * ((double)fwd * rd->cfg->model.n_layers + (double)bwd);
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


static int capacity_report(run_t *rd, FILE *out) {
    size_t steps;
    long first, last;
    run_span(rd, rd->only_layer, &steps, &first, &last);
    double *scratch = malloc(steps * sizeof *scratch);
    lcap_t *lc = calloc(rd->n_layers > 0 ? (size_t)rd->n_layers : 1, sizeof *lc);
    if (!scratch || !lc) {
        free(scratch);
        free(lc);
        moe_error(MOE_ENOMEM, "out of memory");
        return 1;
    }
    const int E = rd->E, k = rd->top_k;
    const long T = rd->T_group;
    int nl = 0;
    double run_p99 = 0, run_worst = 0;
    int run_p99_layer = -1, run_worst_layer = -1;
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
        qsort(scratch, L->n, sizeof *scratch, cmp_double);
        const double p99 = stats_percentile_sorted(scratch, L->n, 99);
        c->p99 = need_at(rd, p99, stats_capacity_of(p99, T, k, E));
        c->worst = need_at(rd, L->r[wi].need_cf, L->r[wi].need_C);
        c->worst_step = L->r[wi].step;
        c->drop = drop_fraction(L->r, 0, L->n);
        c->logged_capacity = L->r[L->n - 1].capacity;
        if (p99 > run_p99) run_p99 = p99, run_p99_layer = l;
        if (c->worst.cf > run_worst) run_worst = c->worst.cf, run_worst_layer = l;
    }
    const need_t rp99 = need_at(rd, run_p99, stats_capacity_of(run_p99, T, k, E));
    const need_t rworst = need_at(rd, run_worst, stats_capacity_of(run_worst, T, k, E));
    // a schedule or auto: the factor of the latest step logged
    const double cur_cf = isnan(rd->last_cf) ? rd->cfg->model.moe.capacity_factor : rd->last_cf;
    const long cur_C = stats_capacity_of(cur_cf, T, k, E);
    const need_t cur = need_at(rd, cur_cf, cur_C);
    // Runs since micro_counts was logged are exact; older logs of grad_accum > 1 runs only
    // have the step's sum, and each micro-batch is then taken as an equal share of it.
    const int approx = rd->approx_records > 0;
    char note[256] = "";
    if (approx)
        snprintf(note, sizeof note,
                 "grad_accum = %d and %zu records without micro_counts: their micro-batch counts "
                 "are approximated as counts / %d",
                 rd->groups, rd->approx_records, rd->groups);
    char tok_note[MOE_PATH_MAX + 256] = "";
    if (rd->tokens_mismatch_line)
        snprintf(tok_note, sizeof tok_note,
                 "%s:%ld: tokens = %ld, but config.cfg gives batch_size*seq_len*grad_accum = %ld; "
                 "using the config",
                 rd->load_path, rd->tokens_mismatch_line, rd->tokens_seen, T * rd->groups);

    if (rd->json) {
        cJSON *doc = cJSON_CreateObject();
        add_run_fields(rd, doc, steps, first, last);
        cJSON_AddNumberToObject(doc, "max_drop", rd->max_drop);
        cJSON_AddNumberToObject(doc, "tokens_per_micro_batch", (double)T);
        cJSON_AddNumberToObject(doc, "grad_accum", rd->groups);
        cJSON_AddBoolToObject(doc, "groups_approximated", approx);
        if (approx) cJSON_AddStringToObject(doc, "note", note);
        if (tok_note[0]) cJSON_AddStringToObject(doc, "tokens_note", tok_note);
        cJSON_AddNumberToObject(doc, "d_model", rd->cfg->model.d_model);
        cJSON_AddNumberToObject(doc, "d_ff", rd->cfg->model.moe.d_ff);
        cJSON_AddNumberToObject(doc, "n_layers", rd->cfg->model.n_layers);
        size_t fwd, bwd;
        row_bytes_of(rd, &fwd, &bwd);
        cJSON_AddNumberToObject(doc, "row_bytes", (double)fwd);          // per layer
        cJSON_AddNumberToObject(doc, "row_bytes_backward", (double)bwd); // once, shared
        cJSON *jc = cJSON_AddObjectToObject(doc, "current");
        cJSON_AddNumberToObject(jc, "capacity_factor", cur_cf);
        cJSON_AddNumberToObject(jc, "capacity", (double)cur_C);
        cJSON_AddNumberToObject(jc, "rows", cur.rows);
        cJSON_AddNumberToObject(jc, "bytes_per_layer", cur.bytes_layer);
        cJSON_AddNumberToObject(jc, "bytes_all_layers", cur.bytes_all);
        cJSON *layers = cJSON_AddArrayToObject(doc, "layers");
        for (int i = 0; i < nl; i++) {
            cJSON *o = cJSON_CreateObject();
            cJSON_AddNumberToObject(o, "layer", lc[i].layer);
            cJSON_AddNumberToObject(o, "steps", (double)lc[i].n);
            cJSON_AddItemToObject(o, "p99", jneed(&lc[i].p99));
            cJSON *w = jneed(&lc[i].worst);
            cJSON_AddNumberToObject(w, "step", (double)lc[i].worst_step);
            cJSON_AddItemToObject(o, "worst", w);
            cJSON_AddItemToObject(o, "current_drop_fraction", jnum(lc[i].drop));
            cJSON_AddItemToArray(layers, o);
        }
        cJSON *run = cJSON_AddObjectToObject(doc, "run");
        cJSON *jp = jneed(&rp99), *jw = jneed(&rworst);
        cJSON_AddNumberToObject(jp, "layer", run_p99_layer);
        cJSON_AddNumberToObject(jw, "layer", run_worst_layer);
        cJSON_AddItemToObject(run, "p99", jp);
        cJSON_AddItemToObject(run, "worst", jw);
        print_json(out, doc);
    } else {
        print_header(rd, out, steps, first, last);
        prose(rd, out,
              "  capacity needed per step: the smallest C with at most %g%% of the step's "
              "assignments beyond C (max_drop %g)\n",
              100 * rd->max_drop, rd->max_drop);
        prose(rd, out,
              "  micro-batch: T = %ld tokens (batch_size %d x seq_len %d), grad_accum %d; "
              "cf = C*E/(T*k), C = ceil(T*k/E * cf)\n",
              T, rd->cfg->batch_size, rd->cfg->seq_len, rd->groups);
        if (approx) prose(rd, out, "  note: %s\n", note);
        if (tok_note[0]) prose(rd, out, "  note: %s\n", tok_note);
        size_t fwd, bwd;
        row_bytes_of(rd, &fwd, &bwd);
        prose(rd, out,
              "  expert buffers: rows = E*C; per layer rows * (2*d_model + 3*d_ff) * 4 = rows * "
              "%zu (fp32 forward, kept for the backward), + rows * %zu once (the backward "
              "scratch the layers share)\n",
              fwd, bwd);
        prose(rd, out,
              "  cf below: the shortest decimal capacity_factor that gives that C (P99: C of the "
              "99th percentile of the per-step factors; exact values in --json)\n");
        if (cur_cf > 0)
            prose(rd, out,
                  "  current: capacity_factor %g -> C = %ld per expert per micro-batch, %.0f rows, "
                  "%.3f MiB per layer, %.3f MiB for %d layers\n\n",
                  cur_cf, cur_C, cur.rows, mib(cur.bytes_layer), mib(cur.bytes_all),
                  rd->cfg->model.n_layers);
        else
            prose(rd, out, "  current: capacity_factor 0 (dropless)\n\n");
        if (!rd->wide) { // STATS_COLUMNS: rows and the memory of all layers with --wide
            fprintf(out, "%-5s %6s | %-25s | %-33s | %s\n", "", "", "needed on the P99 step",
                    "needed on the worst step", "current");
            fprintf(out, "%5s %6s | %8s %6s %9s | %8s %6s %9s %7s | %s\n", "layer", "steps", "cf",
                    "C", "MiB/layer", "cf", "C", "MiB/layer", "step", "drop fraction");
            for (int i = 0; i < nl; i++) {
                const lcap_t *c = &lc[i];
                char d[32];
                fprintf(out, "%5d %6zu | %8.*f %6ld %9.3f | %8.*f %6ld %9.3f %7ld | %s\n", c->layer,
                        c->n, c->p99.decimals, c->p99.cf_short, c->p99.C, mib(c->p99.bytes_layer),
                        c->worst.decimals, c->worst.cf_short, c->worst.C, mib(c->worst.bytes_layer),
                        c->worst_step, pct(d, sizeof d, c->drop, 2));
            }
        } else {
            fprintf(out, "%-5s %6s | %-43s | %-51s | %s\n", "", "", "needed on the P99 step",
                    "needed on the worst step", "current");
            char all[32]; // all layers' forward rows and the shared backward scratch
            snprintf(all, sizeof all, "MiB %dL", rd->cfg->model.n_layers);
            fprintf(out, "%-5s %6s | %8s %6s %7s %9s %8s | %8s %6s %7s %9s %8s %7s | %s\n", "layer",
                    "steps", "cf", "C", "rows", "MiB/layer", all, "cf", "C", "rows", "MiB/layer",
                    all, "step", "drop fraction");
            for (int i = 0; i < nl; i++) {
                const lcap_t *c = &lc[i];
                char d[32];
                fprintf(out,
                        "%5d %6zu | %8.*f %6ld %7.0f %9.3f %8.3f | %8.*f %6ld %7.0f %9.3f %8.3f "
                        "%7ld | %s\n",
                        c->layer, c->n, c->p99.decimals, c->p99.cf_short, c->p99.C, c->p99.rows,
                        mib(c->p99.bytes_layer), mib(c->p99.bytes_all), c->worst.decimals,
                        c->worst.cf_short, c->worst.C, c->worst.rows, mib(c->worst.bytes_layer),
                        mib(c->worst.bytes_all), c->worst_step, pct(d, sizeof d, c->drop, 2));
            }
        }
        prose(rd, out,
              "\nrun (one capacity_factor for every layer: the largest of the layers above):\n");
        prose(rd, out,
              "  P99 step:   capacity_factor %.*f (layer %d) -> C = %ld, %.0f rows, %.3f MiB per "
              "layer, %.3f MiB for %d layers\n",
              rp99.decimals, rp99.cf_short, run_p99_layer, rp99.C, rp99.rows, mib(rp99.bytes_layer),
              mib(rp99.bytes_all), rd->cfg->model.n_layers);
        prose(rd, out,
              "  worst step: capacity_factor %.*f (layer %d) -> C = %ld, %.0f rows, %.3f MiB per "
              "layer, %.3f MiB for %d layers\n",
              rworst.decimals, rworst.cf_short, run_worst_layer, rworst.C, rworst.rows,
              mib(rworst.bytes_layer), mib(rworst.bytes_all), rd->cfg->model.n_layers);
    }
    free(scratch);
    free(lc);
    return 0;
}

// ---- the command line ---------------------------------------------------------------

// The forms of moe stats (its synopsis lines): bits of cli_option.forms.
enum { FORM_REPORT, FORM_CAPACITY, FORM_WATCH, FORM_WATCH_CAPACITY, FORM_PLACEMENT, N_FORMS };
#define FORM(f) (1u << FORM_##f)
#define WATCHES (FORM(WATCH) | FORM(WATCH_CAPACITY))
#define TABLES (FORM(REPORT) | FORM(CAPACITY) | WATCHES) // the forms that print the tables
#define STATS_STR_(x) #x
#define STATS_STR(x) STATS_STR_(x)

// What the command line asks for.
typedef struct {
    const char *dir;
    int watch, capacity, wide, json;
    int64_t placement, layer, window, from, count; // placement 0: none; layer -1: all
    double alert, max_drop, interval;
} stats_args;

static const cli_option stats_options[] = {
    {"RUN_DIR", CLI_POSITIONAL(stats_args, dir), .flags = CLI_REQUIRED, .expect = "a RUN_DIR"},
    {"--watch", CLI_FLAG(stats_args, watch), .flags = CLI_SELECTOR, .forms = WATCHES,
     .help = "redraw the report (or --capacity) every --interval S seconds while the run writes "
             "its logs, until its last step (or --count N times)"},
    {"--capacity", CLI_FLAG(stats_args, capacity), .flags = CLI_SELECTOR,
     .forms = FORM(CAPACITY) | FORM(WATCH_CAPACITY),
     .help = "the capacity factor each layer needed to drop at most --max-drop of its "
             "assignments on the P99 step and on the worst step, and the expert activation "
             "memory at that factor"},
    {"--placement", CLI_INT(stats_args, placement), .value = "R", .lo = 2, .hi = 64,
     .expect = "a number of ranks in [2, 64]", .flags = CLI_SELECTOR, .forms = FORM(PLACEMENT),
     .help = "an expert-to-rank mapping for R ranks from the load and co-activation logs: the "
             "hottest rank's P99 load, rows per token, the hottest link, for the contiguous "
             "default, random, greedy (LPT) and the proposal (greedy + swaps)"},
    {"--interval", CLI_NUMBER(stats_args, interval), .value = "S", .lo = 0, .hi = 86400,
     .flags = CLI_LO_OPEN, .expect = "seconds in (0, 86400]", .def = "2", .forms = WATCHES,
     .help = "seconds between two refreshes of --watch"},
    {"--count", CLI_INT(stats_args, count), .value = "N", .lo = 1, .hi = 9e18,
     .expect = "an integer >= 1", .forms = WATCHES, .help = "at most N refreshes of --watch"},
    {"--max-drop", CLI_NUMBER(stats_args, max_drop), .value = "F", .lo = 0, .hi = 1,
     .flags = CLI_HI_OPEN, .def = STATS_STR(STATS_DEFAULT_MAX_DROP),
     .forms = FORM(CAPACITY) | FORM(WATCH_CAPACITY),
     .help = "the share of its assignments a layer may drop, for --capacity"},
    {"--layer", CLI_INT(stats_args, layer), .value = "L", .lo = 0, .hi = STATS_MAX_LAYERS - 1,
     .expect = "a layer index >= 0", .forms = TABLES, .help = "only MoE layer L"},
    {"--window", CLI_INT(stats_args, window), .value = "N", .lo = 1, .hi = 1e9,
     .expect = "an integer in [1, 1e9]", .def = STATS_STR(STATS_DEFAULT_WINDOW),
     .forms = FORM(REPORT) | FORM(WATCH), .help = "steps in the first and the last window"},
    {"--alert", CLI_NUMBER(stats_args, alert), .value = "A", .lo = 0, .hi = 1e300,
     .flags = CLI_LO_OPEN, .expect = "a number > 0", .def = STATS_STR(STATS_DEFAULT_ALERT),
     .forms = FORM(REPORT) | FORM(WATCH),
     .help = "max/mean load alert threshold: alert when the median over the last window "
             "exceeds it"},
    {"--from", CLI_INT(stats_args, from), .value = "STEP", .lo = 1, .hi = LONG_MAX / 2,
     .expect = "a step >= 1", .forms = TABLES,
     .help = "ignore the records of the steps before STEP (e.g. the warm-up's)"},
    {"--wide", CLI_FLAG(stats_args, wide), .forms = TABLES,
     .help = "the full tables (more than 100 columns): with the report, the aux and z loss "
             "trends, the entropy in nats, the exchange share and the dead experts' indexes; "
             "with --capacity, rows and the memory of all layers"},
    {"--json", CLI_FLAG(stats_args, json), .forms = FORM(REPORT) | FORM(CAPACITY) | FORM(PLACEMENT),
     .help = "one JSON document instead of the tables"},
    {0}};

static const cli_command stats_command = {
    .name = "moe stats",
    .about =
        "  Reads RUN_DIR/expert_load.jsonl, metrics.jsonl and config.cfg. The report: per MoE\n"
        "  layer, max/mean load (mean, P95, P99 over steps), CV, hottest and dead experts of\n"
        "  the last window, drop fraction in the first and last window, router entropy, aux\n"
        "  and z loss trend, exchange share of step time; alerts.\n",
    .options = stats_options,
    .n_forms = N_FORMS};

// moe stats RUN_DIR --placement R [--json]: the run's config gives top_k and d_model.
static int placement_cli(const stats_args *a, FILE *out, FILE *err) {
    char path[MOE_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/config.cfg", a->dir);
    static moe_train_config cfg;
    if (moe_train_config_load(&cfg, path, 0, NULL)) {
        fprintf(err, "moe stats: error: %s\n", moe_last_error());
        return 1;
    }
    return stats_placement(a->dir, &cfg, (int)a->placement, a->json, out, err);
}

// The report (or --capacity) of the run, once: 0 printed, 1 a bad or missing log, 2 a layer
// without records. ctx: the stats_args (so that --watch can redraw it).
static int report_once(void *ctx, FILE *out, FILE *err) {
    const stats_args *a = ctx;
    run_t rd = {.dir = a->dir,
                .only_layer = (int)a->layer,
                .last_cf = NAN,
                .window = (size_t)a->window,
                .alert = a->alert,
                .max_drop = a->max_drop,
                .from = (long)a->from,
                .capacity = a->capacity,
                .wide = a->wide,
                .json = a->json,
                .groups = 1,
                .top_k = 1};
    int rc;
    if (load_run(&rd, err)) {
        fprintf(err, "moe stats: error: %s\n", moe_last_error());
        rc = 1;
    } else if (rd.only_layer >= 0 &&
               (rd.only_layer >= rd.n_layers || !rd.layers[rd.only_layer].n)) {
        fprintf(err, "moe stats: --layer %d: no records of that layer in %s (layers 0..%d)\n",
                rd.only_layer, rd.load_path, rd.n_layers - 1);
        rc = 2;
    } else {
        rc = rd.capacity ? capacity_report(&rd, out) : report(&rd, out);
        if (rc) fprintf(err, "moe stats: error: %s\n", moe_last_error());
    }
    fflush(out);
    run_free(&rd);
    return rc;
}

// --watch (watch.c): report(ctx, ...) redrawn every interval seconds while dir's run writes its
// logs, at most count times. Declared here and in watch.c, not in stats.h: a part of moe
// stats, not of its interface.
int stats_watch_loop(const char *dir, double interval, long count,
                     int (*report)(void *ctx, FILE *out, FILE *err), void *ctx, FILE *out,
                     FILE *err);

int stats_cli(int argc, char **argv, FILE *out, FILE *err) {
    stats_args a = {.layer = -1, .count = LONG_MAX};
    const int rc = cli_args(&stats_command, argc, argv, &a, out, err);
    if (rc != CLI_RUN) return rc;
    if (a.placement) return placement_cli(&a, out, err);
    if (a.watch)
        return stats_watch_loop(a.dir, a.interval, (long)a.count, report_once, &a, out, err);
    return report_once(&a, out, err);
}

int stats_main(int argc, char **argv) { return stats_cli(argc, argv, stdout, stderr); }
