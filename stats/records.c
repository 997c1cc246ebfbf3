// The validated log reader of `moe stats` (records.h): a line reader over data/files.h, then
// one function per record kind that checks every field it passes on.
#define _POSIX_C_SOURCE 200809L

#include "stats/records.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/files.h"
#include "data/json_check.h"

#define LOG_MAX_BYTES ((uint64_t)64 << 30) // 64 GiB: far more than a long run writes
#define LOG_MAX_LINE ((size_t)256 << 20)   // a coactivation record of 4096 experts fits
#define MAX_COUNT 9007199254740992.0       // 2^53: counts are exact in a double up to here

const char *stats_time_name(int i) {
    static const char *const extra[] = {"optimizer", "exchange_wait", "validation", "checkpoint"};
    return i < MOE_T_PHASES ? moe_phase_names[i] : extra[i - MOE_T_PHASES];
}

// ---- fields -------------------------------------------------------------------------

typedef struct {
    const char *path;
    long line;
} where_t;

static moe_status bad(where_t w, const char *key, const char *what) {
    return moe_error(MOE_EIO, "%s:%ld: \"%s\" %s", w.path, w.line, key, what);
}

// A finite number in [lo, hi], or NaN for null or a missing key; an error for anything else.
static moe_status get_num(where_t w, const cJSON *o, const char *key, double lo, double hi,
                          double *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = NAN;
    if (!it || cJSON_IsNull(it)) return MOE_OK;
    if (!cJSON_IsNumber(it)) return bad(w, key, "is not a number");
    const double d = it->valuedouble;
    if (!(isfinite(d) && d >= lo && d <= hi)) {
        char what[96];
        snprintf(what, sizeof what, "= %.6g is not a finite number in [%g, %g]", d, lo, hi);
        return bad(w, key, what);
    }
    *v = d;
    return MOE_OK;
}

// An integer in [lo, hi]; *v = dflt when the key is missing (required: an error) or null.
static moe_status get_int(where_t w, const cJSON *o, const char *key, int required, double lo,
                          double hi, long dflt, long *v) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(o, key);
    *v = dflt;
    if (!it || (cJSON_IsNull(it) && !required)) return required ? bad(w, key, "is missing") : 0;
    if (!cJSON_IsNumber(it)) return bad(w, key, "is not a number");
    const double d = it->valuedouble;
    if (!(d == floor(d) && d >= lo && d <= hi)) {
        char what[128];
        snprintf(what, sizeof what, "= %.17g is not an integer in [%.0f, %.0f]", d, lo, hi);
        return bad(w, key, what);
    }
    *v = (long)d;
    return MOE_OK;
}

static int is_count(const cJSON *it) {
    const double v = cJSON_IsNumber(it) ? it->valuedouble : -1;
    return v >= 0 && v <= MAX_COUNT && v == floor(v);
}

// An array of n counts (non-negative integers <= 2^53) into out; `key` names it in errors,
// `per` says what an entry is.
static moe_status get_count_array(where_t w, const char *key, const cJSON *a, int n, long *out,
                                  const char *per) {
    if (!cJSON_IsArray(a)) return bad(w, key, a ? "is not an array" : "is missing");
    char what[112];
    if (cJSON_GetArraySize(a) != n) {
        snprintf(what, sizeof what, "has %d entries, expected %d (%s)", cJSON_GetArraySize(a), n,
                 per);
        return bad(w, key, what);
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, a) {
        if (!is_count(it)) {
            snprintf(what, sizeof what, "entry %d is not a non-negative integer", i);
            return bad(w, key, what);
        }
        out[i++] = (long)it->valuedouble;
    }
    return MOE_OK;
}

// ---- lines --------------------------------------------------------------------------

typedef moe_status (*object_fn)(void *state, where_t w, const cJSON *obj);

// Calls fn for every JSON object line of lg->path (records.h: blank lines skipped, a partial
// last line noted in lg->partial).
static moe_status read_lines(stats_log *lg, object_fn fn, void *state) {
    lg->missing = 0, lg->partial = 0;
    moe_file_lines r;
    moe_status st = moe_file_lines_open(&r, lg->path, "a log", LOG_MAX_BYTES, LOG_MAX_LINE);
    if (st) {
        if (errno != ENOENT) return st;
        if (!lg->required) return (lg->missing = 1), MOE_OK;
        return moe_error(MOE_EIO, "%s: cannot open: %s", lg->path, strerror(ENOENT));
    }
    int got;
    while (!st && (got = moe_file_lines_next(&r, &st)) == 1) {
        char *p = r.line, *e = r.line + r.len;
        while (p < e && isspace((unsigned char)*p)) p++;
        while (e > p && isspace((unsigned char)e[-1])) e--;
        if (p == e) continue; // a blank line
        const char *end = NULL;
        cJSON *obj = cJSON_ParseWithLengthOpts(p, (size_t)(e - p), &end, 0);
        if (obj && (!cJSON_IsObject(obj) || end != e)) cJSON_Delete(obj), obj = NULL;
        if (!obj && !r.has_newline) { // the last line, cut short by a writer in progress
            lg->partial = r.lineno;
            break;
        }
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", lg->path, r.lineno);
        if (!obj)
            st = moe_error(MOE_EIO, "%s: not a JSON object: %.60s%s", where, p,
                           e - p > 60 ? "..." : "");
        else if (!(st = moe_json_refuse_duplicates(obj,
                                                   where))) // cJSON: the first, Python: the last
            st = fn(state, (where_t){lg->path, r.lineno}, obj);
        cJSON_Delete(obj);
    }
    moe_file_lines_close(&r);
    return st;
}

// ---- expert_load.jsonl --------------------------------------------------------------

typedef struct {
    stats_log *lg;
    stats_load_fn fn;
    void *ctx;
    long *buf;       // counts [E], kept [E], coact [E(E-1)/2]
    long *micro;     // [micro_rows][E]
    int micro_rows;  // rows micro holds
    long *last_step; // [n_last] the latest step of each layer (0: none yet)
    int n_last;
} load_state;

// E from the first record when config.cfg did not say.
static moe_status first_E(load_state *s, where_t w, const cJSON *o) {
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(o, "counts");
    if (!cJSON_IsArray(a)) return bad(w, "counts", a ? "is not an array" : "is missing");
    const int n = cJSON_GetArraySize(a);
    if (n < 1 || n > STATS_MAX_EXPERTS) {
        char what[96];
        snprintf(what, sizeof what, "has %d entries (expected 1..%d experts)", n,
                 STATS_MAX_EXPERTS);
        return bad(w, "counts", what);
    }
    s->lg->E = n;
    return MOE_OK;
}

// "micro_counts": rows of E counts (grad_accum x ranks of them when known) summing to counts.
static moe_status get_micro(load_state *s, where_t w, const cJSON *mc, stats_load_rec *r) {
    const int E = s->lg->E, ga = s->lg->grad_accum, want = ga * (r->ranks ? (int)r->ranks : 1);
    char what[128];
    if (!cJSON_IsArray(mc)) return bad(w, "micro_counts", "is not an array");
    const int n = cJSON_GetArraySize(mc);
    if ((ga && n != want) || n < 1) {
        snprintf(what, sizeof what, "has %d entries, expected train.grad_accum%s = %d", n,
                 r->ranks ? " x ranks" : "", ga ? want : 1);
        return bad(w, "micro_counts", what);
    }
    if (n > s->micro_rows) {
        long *m = realloc(s->micro, (size_t)n * E * sizeof *m);
        if (!m) return moe_error(MOE_ENOMEM, "out of memory");
        s->micro = m, s->micro_rows = n;
    }
    const cJSON *row;
    int i = 0;
    cJSON_ArrayForEach(row, mc) {
        moe_status st = get_count_array(w, "micro_counts", row, E, s->micro + (size_t)i++ * E,
                                        "one per expert");
        if (st) return st;
    }
    for (int e = 0; e < E; e++) {
        long sum = 0;
        for (i = 0; i < n; i++) sum += s->micro[(size_t)i * E + e];
        if (sum != r->counts[e]) {
            snprintf(what, sizeof what, "sums to %ld for expert %d, but \"counts\" has %ld", sum, e,
                     r->counts[e]);
            return bad(w, "micro_counts", what);
        }
    }
    r->micro = s->micro, r->n_micro = n;
    return MOE_OK;
}

// step and layer, with the layer's steps strictly increasing.
static moe_status get_step_layer(load_state *s, where_t w, const cJSON *o, stats_load_rec *r) {
    const stats_log *lg = s->lg;
    moe_status st;
    if ((st = get_int(w, o, "step", 1, 1, MAX_COUNT, 0, &r->step)) ||
        (st = get_int(w, o, "layer", 1, 0, STATS_MAX_LAYERS - 1, 0, &r->layer)))
        return st;
    if (lg->n_layers && r->layer >= lg->n_layers)
        return moe_error(
            MOE_EIO, "%s:%ld: \"layer\" = %ld, but the run has model.n_layers = %d (%s)", w.path,
            w.line, r->layer, lg->n_layers, lg->cfg_path ? lg->cfg_path : "config.cfg");
    if (r->layer >= s->n_last) {
        const int n = (int)r->layer + 1;
        long *ls = realloc(s->last_step, (size_t)n * sizeof *ls);
        if (!ls) return moe_error(MOE_ENOMEM, "out of memory");
        memset(ls + s->n_last, 0, (size_t)(n - s->n_last) * sizeof *ls);
        s->last_step = ls, s->n_last = n;
    }
    long *last = &s->last_step[r->layer];
    if (r->step <= *last)
        return moe_error(MOE_EIO,
                         "%s:%ld: step %ld of layer %ld comes after step %ld (steps must increase)",
                         w.path, w.line, r->step, r->layer, *last);
    *last = r->step;
    return MOE_OK;
}

// counts, kept and coactivation into the reader's buffer.
static moe_status get_load_counts(load_state *s, where_t w, const cJSON *o, stats_load_rec *r) {
    const int E = s->lg->E;
    const size_t pairs = (size_t)E * (E - 1) / 2;
    if (!s->buf && !(s->buf = malloc((2 * (size_t)E + pairs + 1) * sizeof *s->buf)))
        return moe_error(MOE_ENOMEM, "out of memory");
    long *counts = s->buf, *kept = s->buf + E, *coact = s->buf + 2 * E;
    moe_status st = get_count_array(w, "counts", cJSON_GetObjectItemCaseSensitive(o, "counts"), E,
                                    counts, "one per expert");
    if (st) return st;
    r->counts = counts;
    const cJSON *kj = cJSON_GetObjectItemCaseSensitive(o, "kept");
    if (kj && !cJSON_IsNull(kj)) {
        if ((st = get_count_array(w, "kept", kj, E, kept, "one per expert"))) return st;
        for (int e = 0; e < E; e++)
            if (kept[e] > counts[e]) {
                char what[96];
                snprintf(what, sizeof what, "entry %d (%ld) exceeds \"counts\" (%ld)", e, kept[e],
                         counts[e]);
                return bad(w, "kept", what);
            }
        r->kept = kept;
    }
    const cJSON *cj = cJSON_GetObjectItemCaseSensitive(o, "coactivation");
    if (cj && !cJSON_IsNull(cj)) {
        if (pairs > (size_t)1 << 28) return bad(w, "coactivation", "is too large to read");
        if ((st = get_count_array(w, "coactivation", cj, (int)pairs, coact,
                                  "E (E - 1) / 2: one per pair of experts")))
            return st;
        r->coact = coact;
    }
    return MOE_OK;
}

static moe_status on_load_object(void *state, where_t w, const cJSON *o) {
    load_state *s = state;
    stats_log *lg = s->lg;
    stats_load_rec r = {.line = w.line};
    moe_status st;
    if ((st = get_step_layer(s, w, o, &r))) return st;
    if (!lg->E && (st = first_E(s, w, o))) return st;
    if ((st = get_load_counts(s, w, o, &r))) return st;
    if ((st = get_int(w, o, "tokens", 0, 0, MAX_COUNT, -1, &r.tokens)) ||
        (st = get_int(w, o, "capacity", 0, 0, MAX_COUNT, -1, &r.capacity)) ||
        (st = get_int(w, o, "ranks", 0, 1, 65536, 0, &r.ranks)) ||
        (st = get_num(w, o, "dropped", 0, MAX_COUNT, &r.dropped)) ||
        (st = get_num(w, o, "entropy", -HUGE_VAL, HUGE_VAL, &r.entropy)) ||
        (st = get_num(w, o, "aux", -HUGE_VAL, HUGE_VAL, &r.aux)) ||
        (st = get_num(w, o, "z", -HUGE_VAL, HUGE_VAL, &r.z)) ||
        (st = get_num(w, o, "exchange_s", 0, STATS_MAX_SECONDS, &r.exch_s)))
        return st;
    double unused;
    if ((st = get_num(w, o, "seq_aux", -HUGE_VAL, HUGE_VAL, &unused))) return st;
    if (r.ranks && lg->ranks && r.ranks != lg->ranks)
        return bad(w, "ranks", "changes within the run");
    if (r.ranks) lg->ranks = (int)r.ranks;
    const cJSON *mc = cJSON_GetObjectItemCaseSensitive(o, "micro_counts");
    if (mc && !cJSON_IsNull(mc) && (st = get_micro(s, w, mc, &r))) return st;
    if (r.step < lg->from) return MOE_OK; // --from: checked, not used
    return s->fn(s->ctx, &r);
}

moe_status stats_read_load(stats_log *lg, stats_load_fn fn, void *ctx) {
    load_state s = {.lg = lg, .fn = fn, .ctx = ctx};
    lg->ranks = 0;
    moe_status st = read_lines(lg, on_load_object, &s);
    free(s.buf), free(s.micro), free(s.last_step);
    return st;
}

// ---- metrics.jsonl ------------------------------------------------------------------

typedef struct {
    stats_log *lg;
    stats_metrics_fn fn;
    void *ctx;
    long last_step;
} metrics_state;

// The loss-like fields: null or finite numbers (>= 0 for the last three).
static moe_status check_metric_numbers(where_t w, const cJSON *o) {
    static const char *const any[] = {"loss", "ce", "aux", "z", "val_loss"};
    static const char *const nonneg[] = {"lr", "grad_norm", "tokens_per_s"};
    double v;
    moe_status st = MOE_OK;
    for (size_t i = 0; !st && i < sizeof any / sizeof *any; i++)
        st = get_num(w, o, any[i], -HUGE_VAL, HUGE_VAL, &v);
    for (size_t i = 0; !st && i < sizeof nonneg / sizeof *nonneg; i++)
        st = get_num(w, o, nonneg[i], 0, HUGE_VAL, &v);
    return st;
}

// "time": a time in [0, STATS_MAX_SECONDS] for every phase.
static moe_status get_time(where_t w, const cJSON *tm, stats_metrics_rec *m) {
    for (int i = 0; i < STATS_TIME_N; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(tm, stats_time_name(i));
        if (!cJSON_IsNumber(v) || !(v->valuedouble >= 0))
            return bad(w, "time", "lacks a number >= 0 for a phase");
        if (!(v->valuedouble <= STATS_MAX_SECONDS)) {
            char what[96];
            snprintf(what, sizeof what, "phase \"%s\" = %.6g s is beyond %g s", stats_time_name(i),
                     v->valuedouble, STATS_MAX_SECONDS);
            return bad(w, "time", what);
        }
        m->time[i] = v->valuedouble;
    }
    m->has_time = 1;
    return MOE_OK;
}

static moe_status on_metrics_object(void *state, where_t w, const cJSON *o) {
    metrics_state *s = state;
    stats_metrics_rec m = {.line = w.line};
    moe_status st;
    if ((st = get_int(w, o, "step", 1, 1, MAX_COUNT, 0, &m.step)) ||
        (st = get_num(w, o, "step_s", 0, STATS_MAX_SECONDS, &m.step_s)) ||
        (st = get_num(w, o, "capacity_factor", 0, 1e6, &m.capacity_factor)) ||
        (st = check_metric_numbers(w, o)))
        return st;
    if (m.step <= s->last_step)
        return moe_error(MOE_EIO, "%s:%ld: step %ld comes after step %ld (steps must increase)",
                         w.path, w.line, m.step, s->last_step);
    s->last_step = m.step;
    const cJSON *sk = cJSON_GetObjectItemCaseSensitive(o, "skipped");
    if (sk && !cJSON_IsBool(sk) && !cJSON_IsNull(sk)) return bad(w, "skipped", "is not a boolean");
    m.skipped = cJSON_IsTrue(sk);
    if (m.skipped) m.step_s = NAN;
    const cJSON *tm = cJSON_GetObjectItemCaseSensitive(o, "time");
    if (tm && !cJSON_IsNull(tm) && !cJSON_IsObject(tm)) return bad(w, "time", "is not an object");
    if (cJSON_IsObject(tm) && !m.skipped && (st = get_time(w, tm, &m))) return st;
    if (m.step < s->lg->from) return MOE_OK; // --from
    return s->fn(s->ctx, &m);
}

moe_status stats_read_metrics(stats_log *lg, stats_metrics_fn fn, void *ctx) {
    metrics_state s = {.lg = lg, .fn = fn, .ctx = ctx};
    return read_lines(lg, on_metrics_object, &s);
}
