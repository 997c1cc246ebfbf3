// What the files of moe stats share (stats/ only; not installed): the run read into
// memory (run.c), the formatting both tables use (format.c), the two tables (report.c,
// capacity_plan.c) and the --watch loop (watch.c). Dependencies: stats.c (the command line)
// -> report.c, capacity_plan.c, placement.c, watch.c -> format.c, run.c -> records.c,
// quantile.c (a leaf).
#ifndef MOE_TRAIN_STATS_INTERNAL_H
#define MOE_TRAIN_STATS_INTERNAL_H

#include <cjson/cJSON.h>
#include <stddef.h>
#include <stdio.h>

#include "layers/status.h"
#include "config/config.h"
#include "stats/records.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

#define STATS_DEFAULT_WINDOW 100
#define STATS_DEFAULT_ALERT 1.5
#define STATS_DEFAULT_MAX_DROP 0.01
#define STATS_COLUMNS 100 // the default tables and prose fit this; --wide: the full tables

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
    double time[STATS_TIME_N];
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

// ---- run.c: the run in memory ----------------------------------------------------------

// Reads rd->dir's config.cfg (optional unless --capacity), expert_load.jsonl and
// metrics.jsonl into rd (its options set); notes of partial last lines go to err.
moe_status stats_load_run(run_t *rd, FILE *err);
void stats_run_free(run_t *rd);
// The metrics record of `step`, or NULL (rd->m is sorted by step).
const metric_t *stats_find_metric(const run_t *rd, long step);
// sum dropped / sum counts over records [a, b) with a known drop count (NaN: none).
double stats_drop_fraction(const rec_t *r, size_t a, size_t b);
int stats_cmp_double(const void *a, const void *b); // qsort, ascending

// ---- format.c: what both tables print --------------------------------------------------

const char *stats_pct(char *buf, size_t size, double v, int prec); // "12.5%", "-" if not finite
cJSON *stats_jnum(double v);                                       // a number, or null
// Prose (headers, notes, alerts): as formatted with --wide, else wrapped to STATS_COLUMNS.
void stats_prose(const run_t *rd, FILE *out, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
void stats_print_json(FILE *out, cJSON *doc); // prints and frees doc
void stats_add_run_fields(const run_t *rd, cJSON *doc, size_t steps, long first, long last);
// Steps logged by the layer with the most records (only: one layer, -1 all), first/last step.
void stats_run_span(const run_t *rd, int only, size_t *steps, long *first, long *last);
void stats_print_header(const run_t *rd, FILE *out, size_t steps, long first, long last);

// ---- the tables: 0 printed, else 1 (an error recorded) ----------------------------------

int stats_report(run_t *rd, FILE *out);          // report.c
int stats_capacity_report(run_t *rd, FILE *out); // capacity_plan.c

// --watch (watch.c): report(ctx, out, err) redrawn every interval seconds while dir's run
// writes its logs, at most count times; its last exit status.
int stats_watch_loop(const char *dir, double interval, long count,
                     int (*report)(void *ctx, FILE *out, FILE *err), void *ctx, FILE *out,
                     FILE *err);

#pragma GCC visibility pop

#endif
