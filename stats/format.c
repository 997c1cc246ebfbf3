// What the report and --capacity both print (stats_internal.h): the header, the span of
// steps, prose wrapped to STATS_COLUMNS, percentages and JSON numbers.
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

#include "stats/stats_internal.h"

const char *stats_pct(char *buf, size_t size, double v, int prec) {
    if (!isfinite(v))
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.*f%%", prec, 100 * v);
    return buf;
}

cJSON *stats_jnum(double v) { return isfinite(v) ? cJSON_CreateNumber(v) : cJSON_CreateNull(); }

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
void stats_prose(const run_t *rd, FILE *out, const char *fmt, ...) {
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

void stats_print_json(FILE *out, cJSON *doc) {
    char *s = cJSON_Print(doc);
    if (s) {
        fputs(s, out);
        fputc('\n', out);
        free(s);
    }
    cJSON_Delete(doc);
}

void stats_add_run_fields(const run_t *rd, cJSON *doc, size_t steps, long first, long last) {
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
void stats_run_span(const run_t *rd, int only, size_t *steps, long *first, long *last) {
    *steps = 0, *first = LONG_MAX, *last = 0;
    for (int l = 0; l < rd->n_layers; l++) {
        const layer_t *L = &rd->layers[l];
        if (!L->n || (only >= 0 && l != only)) continue;
        if (L->n > *steps) *steps = L->n;
        if (L->r[0].step < *first) *first = L->r[0].step;
        if (L->r[L->n - 1].step > *last) *last = L->r[L->n - 1].step;
    }
}

void stats_print_header(const run_t *rd, FILE *out, size_t steps, long first, long last) {
    fprintf(out, "moe stats: %s\n", rd->dir);
    char from[64] = "";
    if (rd->from > 0) snprintf(from, sizeof from, " (--from %ld: earlier steps ignored)", rd->from);
    if (rd->have_metrics)
        stats_prose(rd, out,
                    "  expert_load.jsonl: %zu steps logged (steps %ld..%ld)%s; metrics.jsonl: %zu "
                    "steps, %ld skipped\n",
                    steps, first, last, from, rd->m_n, rd->m_skipped);
    else
        stats_prose(rd, out,
                    "  expert_load.jsonl: %zu steps logged (steps %ld..%ld)%s; no metrics.jsonl\n",
                    steps, first, last, from);
    char moe_layers[48] = ""; // " (2 MoE)" when some layers are dense
    if (rd->cfg && moe_model_n_moe_layers(&rd->cfg->model) < rd->cfg->model.n_layers)
        snprintf(moe_layers, sizeof moe_layers, " (%d MoE)",
                 moe_model_n_moe_layers(&rd->cfg->model));
    if (rd->cfg && rd->cfg->capacity.mode != MOE_CAPACITY_FIXED)
        fprintf(out,
                "  model: %d layers%s, %d experts, top-%d, capacity_factor %s: %.4g at step %ld\n",
                rd->cfg->model.n_layers, moe_layers, rd->E, rd->top_k,
                rd->cfg->capacity.mode == MOE_CAPACITY_AUTO ? "auto" : "scheduled",
                isnan(rd->last_cf) ? rd->cfg->model.moe.capacity_factor : rd->last_cf,
                rd->last_cf_step);
    else if (rd->cfg)
        fprintf(out, "  model: %d layers%s, %d experts, top-%d, capacity_factor %g%s\n",
                rd->cfg->model.n_layers, moe_layers, rd->E, rd->top_k,
                rd->cfg->model.moe.capacity_factor,
                rd->cfg->model.moe.capacity_factor > 0 ? "" : " (dropless)");
    else
        fprintf(out, "  model: %d experts (no config.cfg)\n", rd->E);
}
