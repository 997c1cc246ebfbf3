// `moe stats`: the command line (stats.h). One option table (cli/options.h) with five forms
// (the report, --capacity, --watch, --watch --capacity, --placement); the report is report.c,
// --capacity capacity_plan.c, --placement placement.c, --watch watch.c, all reading the run
// through run.c and records.h.
#define _POSIX_C_SOURCE 200809L

#include "stats/stats.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "cli/options.h"
#include "layers/status.h"
#include "config/config.h"
#include "stats/records.h"
#include "stats/stats_internal.h"

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
    {"--from", CLI_INT(stats_args, from), .value = "STEP", .lo = 1, .hi = 9007199254740992.0,
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
    if (stats_load_run(&rd, err)) {
        fprintf(err, "moe stats: error: %s\n", moe_last_error());
        rc = 1;
    } else if (rd.only_layer >= 0 &&
               (rd.only_layer >= rd.n_layers || !rd.layers[rd.only_layer].n)) {
        if (rd.cfg && rd.only_layer < rd.cfg->model.n_layers &&
            !moe_model_layer_is_moe(&rd.cfg->model, rd.only_layer))
            fprintf(err,
                    "moe stats: --layer %d: a dense layer of the model (no experts, no load)\n",
                    rd.only_layer);
        else
            fprintf(err, "moe stats: --layer %d: no records of that layer in %s (layers 0..%d)\n",
                    rd.only_layer, rd.load_path, rd.n_layers - 1);
        rc = 2;
    } else {
        rc = rd.capacity ? stats_capacity_report(&rd, out) : stats_report(&rd, out);
        if (rc) fprintf(err, "moe stats: error: %s\n", moe_last_error());
    }
    fflush(out);
    stats_run_free(&rd);
    return rc;
}

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
