// Capacity that follows the router: model.capacity_factor as a schedule or "auto"
// (config/config.h capacity_plan; docs/expert-load.md "Capacity that follows the router").
//
// Schedule: points (s_i, f_i); the factor of step s (0-based) is f_0 before s_0, f_last after
// the last point, and linear in between: f_i + (f_{i+1} - f_i) (s - s_i) / (s_{i+1} - s_i).
//
// Auto: each finite step, per MoE layer, the factor that would have kept that step's drops at
// or below max_drop (the smallest capacity C with sum_g sum_e max(0, c_ge - C) <= max_drop *
// all assignments, over its micro-batches g: exactly what `moe stats --capacity` computes,
// through the same functions). Every `window` such steps the factor becomes
//   target = max over layers of the P99 (numpy's linear percentile) of the window's needs,
//   clamped to [min, max], then kept within [old / max_change, old * max_change].
// It starts at max (a young router is unbalanced). Under expert parallelism every rank sees
// the same gathered counts, so every rank makes the same decision.
#ifndef MOE_TRAIN_CAPACITY_H
#define MOE_TRAIN_CAPACITY_H

#include <stdint.h>

#include "layers/status.h"
#include "config/config.h"

typedef struct {
    moe_capacity_plan plan;
    int L;         // MoE layers
    double factor; // auto: the factor in force
    int64_t n;     // auto: steps observed in the current window
    double *need;  // auto: [window][L] the needs of those steps
} moe_capacity_ctl;

// One auto decision, at the end of a window.
typedef struct {
    double old_factor, new_factor;
    double p99;    // the window's P99 need, the largest over layers
    int p99_layer; // its layer
    int limited;   // 1: clamped to the bounds, 2: limited by max_change, 0: neither
    char why[200]; // one line for the console and the log
} moe_capacity_decision;

// For a plan (copied) and L layers; start = the factor of step 0 (model.moe.capacity_factor).
moe_status moe_capacity_ctl_init(moe_capacity_ctl *c, const moe_capacity_plan *plan, double start,
                                 int L);
void moe_capacity_ctl_free(moe_capacity_ctl *c);

// The factor in force at step (0-based): fixed: start; schedule: as above; auto: c->factor.
double moe_capacity_ctl_factor(const moe_capacity_ctl *c, double start, int64_t step);

// The factor a step of one layer needed (see above): counts [groups][E] routed assignments
// of its micro-batches of T tokens each, top_k of E experts.
double moe_capacity_needed_factor(const long *counts, int groups, int E, long T, int top_k,
                                  double max_drop);

// Auto: records one finite step's needs (need [L]); returns 1 and fills *d when this step
// ends a window (the factor then changes for the next steps when d->new_factor differs).
int moe_capacity_ctl_observe(moe_capacity_ctl *c, const double *need, int64_t step,
                             moe_capacity_decision *d);

#endif
