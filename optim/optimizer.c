#include "optim/optimizer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int by_offset(const void *a, const void *b) {
    const optim_region *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

// Sorts the regions by offset and merges neighbours that touch and share the decay flag:
// one update kernel per merged range instead of one per tensor. Returns the new count.
static int merge_regions(optim_region *r, int n) {
    qsort(r, (size_t)n, sizeof *r, by_offset);
    int m = 0;
    for (int i = 0; i < n; i++) {
        if (m > 0 && r[m - 1].decay == r[i].decay &&
            r[m - 1].offset + r[m - 1].count == r[i].offset)
            r[m - 1].count += r[i].count;
        else
            r[m++] = r[i];
    }
    return m;
}

moe_status moe_optimizer_create(moe_optimizer *o, moe_backend *be, const optim_config *cfg,
                                size_t n_params, const optim_region *regions, int n_regions) {
    memset(o, 0, sizeof *o);
    if (cfg->kind != OPTIM_ADAMW && cfg->kind != OPTIM_SGD)
        return moe_error(MOE_EINVAL, "optimizer: unknown kind %d", (int)cfg->kind);
    for (int i = 0; i < n_regions; i++)
        if (regions[i].offset + regions[i].count > n_params)
            return moe_error(MOE_EINVAL, "optimizer: region %d [%zu, +%zu) beyond %zu parameters",
                             i, regions[i].offset, regions[i].count, n_params);
    o->cfg = *cfg;
    o->be = be;
    o->n = n_params;
    o->regions = malloc((size_t)n_regions * sizeof *regions + 1);
    if (!o->regions) return moe_error(MOE_ENOMEM, "optimizer: out of memory");
    memcpy(o->regions, regions, (size_t)n_regions * sizeof *regions);
    o->n_regions = merge_regions(o->regions, n_regions);
    for (int i = 1; i < o->n_regions; i++)
        if (o->regions[i - 1].offset + o->regions[i - 1].count > o->regions[i].offset) {
            size_t at = o->regions[i].offset;
            moe_optimizer_destroy(o);
            return moe_error(MOE_EINVAL, "optimizer: regions overlap at offset %zu", at);
        }
    if (cfg->kind == OPTIM_ADAMW) {
        o->m = be->alloc(be, n_params * sizeof(real));
        o->v = be->alloc(be, n_params * sizeof(real));
        if (!o->m || !o->v) {
            moe_optimizer_destroy(o);
            return moe_error(MOE_ENOMEM, "optimizer: cannot allocate %zu bytes of AdamW moments",
                             2 * n_params * sizeof(real));
        }
    }
    return MOE_OK;
}

void moe_optimizer_destroy(moe_optimizer *o) {
    if (o->be) {
        if (o->m) o->be->free(o->be, o->m);
        if (o->v) o->be->free(o->be, o->v);
    }
    free(o->regions);
    memset(o, 0, sizeof *o);
}

void moe_optimizer_step(moe_optimizer *o, real *params, moe_bf16 *params16, const real *grads,
                        double lr, double grad_scale) {
    const optim_config *c = &o->cfg;
    const int64_t t = ++o->t;
    const double bc1 = 1 - pow(c->beta1, (double)t), bc2 = 1 - pow(c->beta2, (double)t);
    moe_adamw_hparams hp = {.lr = (real)lr,
                            .beta1 = (real)c->beta1,
                            .beta2 = (real)c->beta2,
                            .eps = (real)c->eps,
                            .bc1 = (real)bc1,
                            .bc2 = (real)bc2,
                            .grad_scale = (real)grad_scale};
    for (int i = 0; i < o->n_regions; i++) {
        const optim_region *r = &o->regions[i];
        moe_bf16 *p16 = params16 ? params16 + r->offset : NULL;
        if (c->kind == OPTIM_SGD) {
            o->be->sgd_update(o->be, params + r->offset, p16, grads + r->offset, r->count, (real)lr,
                              (real)grad_scale);
        } else {
            hp.weight_decay = (real)(r->decay ? c->weight_decay : 0.0);
            o->be->adamw_update(o->be, params + r->offset, p16, o->m + r->offset, o->v + r->offset,
                                grads + r->offset, r->count, hp);
        }
    }
}

double moe_lr_at_step(moe_schedule_kind kind, double lr, double min_lr, int64_t warmup,
                      int64_t steps, int64_t step) {
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (kind == MOE_SCHEDULE_CONSTANT || steps <= warmup) return lr;
    double progress = (double)(step - warmup) / (double)(steps - warmup); // 0 -> 1
    if (progress > 1) progress = 1;
    return min_lr + 0.5 * (lr - min_lr) * (1 + cos(3.14159265358979323846 * progress));
}

double moe_clip_scale(double grad_norm, double max_norm) {
    if (max_norm <= 0) return 1;
    double s = max_norm / (grad_norm + 1e-6);
    return s < 1 ? s : 1;
}
