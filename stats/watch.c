// `moe stats --watch RUN_DIR [--interval S] [--count N] [report options]`: the report (or
// --capacity) redrawn every S seconds (default 2) while a run writes its logs, until the run
// has logged its last step (train.steps of RUN_DIR/config.cfg), N refreshes, or Ctrl-C. On a
// terminal each refresh clears the screen; otherwise refreshes follow each other, separated
// by their header line. A run directory without logs yet is waited for.
#define _GNU_SOURCE // open_memstream, nanosleep
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config/config.h"
#include "stats/records.h"
#include "stats/stats.h"
#include "stats/stats_internal.h"

static moe_status keep_step(void *ctx, const stats_metrics_rec *m) {
    *(long *)ctx = m->step;
    return MOE_OK;
}

// The step of the last valid record of metrics.jsonl at path (0: none yet). A damaged log
// stops the count where it is; the report drawn next names the damage.
static long last_logged_step(const char *path) {
    long step = 0;
    stats_log lg = {.path = path};
    stats_read_metrics(&lg, keep_step, &step);
    return step;
}

static void sleep_s(double s) {
    struct timespec ts = {(time_t)s, (long)((s - floor(s)) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

int stats_watch_loop(const char *dir, double interval, long count,
                     int (*report)(void *ctx, FILE *out, FILE *err), void *ctx, FILE *out,
                     FILE *err) {
    char path[4096];
    snprintf(path, sizeof path, "%s/config.cfg", dir);
    moe_train_config cfg;
    long steps = 0; // 0: unknown until config.cfg exists
    const int tty = isatty(fileno(out));
    int rc = 0;
    for (long k = 0; k < count; k++) {
        if (!steps && moe_train_config_load(&cfg, path, 0, NULL) == MOE_OK) steps = (long)cfg.steps;
        snprintf(path, sizeof path, "%s/metrics.jsonl", dir);
        const long step = last_logged_step(path);
        snprintf(path, sizeof path, "%s/config.cfg", dir);
        char *text = NULL, *etext = NULL;
        size_t len = 0, elen = 0;
        FILE *mo = open_memstream(&text, &len), *me = open_memstream(&etext, &elen);
        if (!mo || !me) {
            fprintf(err, "moe stats: out of memory\n");
            rc = 1;
            break;
        }
        rc = step ? report(ctx, mo, me) : 1;
        fclose(mo), fclose(me);
        char when[32];
        const time_t now = time(NULL);
        strftime(when, sizeof when, "%H:%M:%S", localtime(&now));
        if (tty) fputs("\033[H\033[2J", out);
        fprintf(out, "moe stats --watch %s: %s, step %ld/%ld, every %g s (Ctrl-C to stop)\n\n", dir,
                when, step, steps, interval);
        if (!step)
            fprintf(out, "waiting for %s/metrics.jsonl\n", dir);
        else
            fputs(rc ? etext : text, out);
        fflush(out);
        free(text), free(etext);
        if (step && rc == 2) break;        // a usage error: no point in redrawing it
        if (steps && step >= steps) break; // the run logged its last step
        if (k + 1 < count) sleep_s(interval);
    }
    return rc;
}
