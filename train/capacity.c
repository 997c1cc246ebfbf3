// Capacity that follows the router (capacity.h).
#include "train/capacity.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stats/stats.h"

moe_status moe_capacity_ctl_init(moe_capacity_ctl *c, const moe_capacity_plan *plan, double start,
                                 int L) {
    memset(c, 0, sizeof *c);
    c->plan = *plan;
    c->L = L;
    c->factor = start;
    if (plan->mode != MOE_CAPACITY_AUTO) return MOE_OK;
    c->need = malloc((size_t)plan->window * (size_t)L * sizeof *c->need);
    if (!c->need)
        return moe_error(MOE_ENOMEM, "capacity: cannot hold a window of %lld steps x %d layers",
                         (long long)plan->window, L);
    return MOE_OK;
}

void moe_capacity_ctl_free(moe_capacity_ctl *c) {
    free(c->need);
    c->need = NULL;
}

static double scheduled(const moe_capacity_plan *p, int64_t step) {
    const int n = p->n_points;
    if (step <= p->step[0]) return p->factor[0];
    for (int i = 0; i + 1 < n; i++)
        if (step < p->step[i + 1]) {
            const double u = (double)(step - p->step[i]) / (double)(p->step[i + 1] - p->step[i]);
            return p->factor[i] + (p->factor[i + 1] - p->factor[i]) * u;
        }
    return p->factor[n - 1];
}

double moe_capacity_ctl_factor(const moe_capacity_ctl *c, double start, int64_t step) {
    switch (c->plan.mode) {
    case MOE_CAPACITY_SCHEDULE: return scheduled(&c->plan, step);
    case MOE_CAPACITY_AUTO: return c->factor;
    default: return start;
    }
}

double moe_capacity_needed_factor(const long *counts, int groups, int E, long T, int top_k,
                                  double max_drop) {
    long C = stats_needed_capacity(counts, groups, E, 1, max_drop);
    if (C > T) C = T;
    return stats_capacity_factor(C, T, top_k, E);
}

static int cmp_double(const void *a, const void *b) {
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

// The window's decision: P99 of each layer's needs, the largest, clamped, rate-limited.
static void decide(moe_capacity_ctl *c, int64_t step, moe_capacity_decision *d) {
    const moe_capacity_plan *p = &c->plan;
    const int64_t n = c->n;
    double *col = malloc((size_t)n * sizeof *col);
    if (!col) moe_fatal("capacity: out of memory");
    memset(d, 0, sizeof *d);
    d->p99 = -1;
    for (int l = 0; l < c->L; l++) {
        for (int64_t i = 0; i < n; i++) col[i] = c->need[i * c->L + l];
        qsort(col, (size_t)n, sizeof *col, cmp_double);
        const double q = stats_percentile_sorted(col, (size_t)n, 99);
        if (q > d->p99) d->p99 = q, d->p99_layer = l;
    }
    free(col);
    double target = d->p99;
    if (target < p->min) target = p->min, d->limited = 1;
    if (target > p->max) target = p->max, d->limited = 1;
    const double lo = c->factor / p->max_change, hi = c->factor * p->max_change;
    if (target < lo) target = lo, d->limited = 2;
    if (target > hi) target = hi, d->limited = 2;
    d->old_factor = c->factor, d->new_factor = target;
    static const char *const how[] = {"", ", clamped to [capacity_min, capacity_max]",
                                      ", limited by capacity_max_change"};
    snprintf(d->why, sizeof d->why,
             "P99 need %.4g (layer %d) over steps %lld-%lld at max_drop %g%s", d->p99, d->p99_layer,
             (long long)(step + 2 - n), (long long)(step + 1), p->max_drop, how[d->limited]);
    c->factor = target;
    c->n = 0;
}

int moe_capacity_ctl_observe(moe_capacity_ctl *c, const double *need, int64_t step,
                             moe_capacity_decision *d) {
    if (c->plan.mode != MOE_CAPACITY_AUTO) return 0;
    memcpy(c->need + c->n * c->L, need, (size_t)c->L * sizeof *need);
    if (++c->n < c->plan.window) return 0;
    decide(c, step, d);
    return 1;
}
