// Optimizers (AdamW, SGD), the learning-rate schedule (linear warmup + cosine decay) and
// global-norm gradient clipping. The per-element update is a backend kernel; this module
// holds the state and decides what to call with which hyperparameters.
#ifndef MOE_OPTIMIZER_H
#define MOE_OPTIMIZER_H

#include <stdint.h>

#include "layers/backend.h"
#include "layers/status.h"

typedef enum { OPTIM_ADAMW = 0, OPTIM_SGD = 1 } optim_kind;

typedef struct {
    optim_kind kind;
    double beta1, beta2, eps; // AdamW
    double weight_decay;      // decoupled (AdamW only), applied to regions with decay=1
} optim_config;

// A contiguous range of the parameter buffer and whether weight decay applies to it.
typedef struct {
    size_t offset, count;
    int decay;
} optim_region;

// A range of the parameter buffer that an optimizer updates and keeps moments of (a sharded
// optimizer, parallel.shard_optimizer: this rank's piece of the dense parameters and its
// experts).
typedef struct {
    size_t offset, count;
} optim_span;

// A region clipped to the optimizer's spans, with where its moments start: moments are kept
// only for the spans, packed in span order, so region parameter p has moments at
// moment + (p - offset).
typedef struct {
    size_t offset, count, moment;
    int decay;
} optim_piece;

typedef struct {
    optim_config cfg;
    moe_backend *be;
    size_t n;    // moments (the parameters of the spans; all n_params without spans)
    real *m, *v; // AdamW moments [n] (device), NULL for SGD
    int64_t t;   // updates done (AdamW bias correction uses t+1)
    int n_regions;
    optim_piece *regions;
} moe_optimizer;

// regions: any order; contiguous ones with the same decay flag are merged, overlapping ones
// refused.
moe_status moe_optimizer_create(moe_optimizer *o, moe_backend *be, const optim_config *cfg,
                                size_t n_params, const optim_region *regions, int n_regions);
// The same over the spans only (sorted, disjoint): what lies outside them is never updated and
// has no moments. n_spans 0: all of [0, n_params), as moe_optimizer_create.
moe_status moe_optimizer_create_spans(moe_optimizer *o, moe_backend *be, const optim_config *cfg,
                                      size_t n_params, const optim_region *regions, int n_regions,
                                      const optim_span *spans, int n_spans);
void moe_optimizer_destroy(moe_optimizer *o);

// One update of params with grad_scale * grads at learning rate lr. params16 (NULL: none) is
// written bf16 of the updated params in the same pass, over the regions (what lies outside
// them does not change).
void moe_optimizer_step(moe_optimizer *o, real *params, moe_bf16 *params16, const real *grads,
                        double lr, double grad_scale);

// Learning rate at step (0-based): linear warmup lr*(step+1)/warmup over warmup steps,
// then cosine from lr to min_lr over the remaining steps (constant: lr after warmup).
typedef enum { MOE_SCHEDULE_COSINE = 0, MOE_SCHEDULE_CONSTANT = 1 } moe_schedule_kind;
double moe_lr_at_step(moe_schedule_kind kind, double lr, double min_lr, int64_t warmup,
                      int64_t steps, int64_t step);

// torch.nn.utils.clip_grad_norm_: scale = max_norm / (norm + 1e-6) when that is < 1, else 1.
// max_norm <= 0 disables clipping (scale 1).
double moe_clip_scale(double grad_norm, double max_norm);

#endif
