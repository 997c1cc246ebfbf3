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

// Refuses regions beyond the parameters and spans that are unsorted, overlapping or beyond.
static moe_status check_ranges(size_t n_params, const optim_region *regions, int n_regions,
                               const optim_span *spans, int n_spans) {
    for (int i = 0; i < n_regions; i++)
        if (regions[i].offset + regions[i].count > n_params)
            return moe_error(MOE_EINVAL, "optimizer: region %d [%zu, +%zu) beyond %zu parameters",
                             i, regions[i].offset, regions[i].count, n_params);
    for (int j = 0; j < n_spans; j++)
        if (spans[j].offset + spans[j].count > n_params ||
            (j > 0 && spans[j - 1].offset + spans[j - 1].count > spans[j].offset))
            return moe_error(MOE_EINVAL,
                             "optimizer: span %d [%zu, +%zu) overlaps the one before, or lies "
                             "beyond %zu parameters",
                             j, spans[j].offset, spans[j].count, n_params);
    return MOE_OK;
}

// The merged regions r cut to the spans: one piece per overlap of a span and a region, in
// offset order. Moments are packed in span order, so a piece starting at parameter a inside
// span j has its moments at base_j + (a - span_j.offset), base_j = the spans' counts before j.
// Pieces that touch in parameters and in moments with one decay flag become one. Returns the
// pieces' count and the moments' in *n_moments.
static int clip_to_spans(optim_piece *out, const optim_region *r, int n, const optim_span *s,
                         int n_spans, size_t *n_moments) {
    int m = 0;
    size_t base = 0;
    for (int j = 0; j < n_spans; base += s[j].count, j++) {
        const size_t lo = s[j].offset, hi = s[j].offset + s[j].count;
        for (int i = 0; i < n; i++) {
            const size_t a = r[i].offset > lo ? r[i].offset : lo;
            const size_t b = r[i].offset + r[i].count < hi ? r[i].offset + r[i].count : hi;
            if (a >= b) continue;
            const optim_piece p = {a, b - a, base + (a - lo), r[i].decay};
            optim_piece *q = m ? &out[m - 1] : NULL;
            if (q && q->decay == p.decay && q->offset + q->count == p.offset &&
                q->moment + q->count == p.moment)
                q->count += p.count;
            else
                out[m++] = p;
        }
    }
    *n_moments = base;
    return m;
}

moe_status moe_optimizer_create(moe_optimizer *o, moe_backend *be, const optim_config *cfg,
                                size_t n_params, const optim_region *regions, int n_regions) {
    return moe_optimizer_create_spans(o, be, cfg, n_params, regions, n_regions, NULL, 0);
}

moe_status moe_optimizer_create_spans(moe_optimizer *o, moe_backend *be, const optim_config *cfg,
                                      size_t n_params, const optim_region *regions, int n_regions,
                                      const optim_span *spans, int n_spans) {
    memset(o, 0, sizeof *o);
    const optim_span all = {0, n_params};
    if (n_spans == 0) spans = &all, n_spans = 1;
    if (cfg->kind != OPTIM_ADAMW && cfg->kind != OPTIM_SGD)
        return moe_error(MOE_EINVAL, "optimizer: unknown kind %d", (int)cfg->kind);
    moe_status st = check_ranges(n_params, regions, n_regions, spans, n_spans);
    if (st) return st;
    o->cfg = *cfg;
    o->be = be;
    // a region cut by s spans gives at most s pieces: n_regions + n_spans bounds the count
    optim_region *merged = malloc((size_t)n_regions * sizeof *regions + 1);
    o->regions = malloc(((size_t)n_regions + (size_t)n_spans) * sizeof *o->regions);
    if (!merged || !o->regions) {
        free(merged);
        moe_optimizer_destroy(o);
        return moe_error(MOE_ENOMEM, "optimizer: out of memory");
    }
    memcpy(merged, regions, (size_t)n_regions * sizeof *regions);
    const int n_merged = merge_regions(merged, n_regions);
    for (int i = 1; i < n_merged; i++)
        if (merged[i - 1].offset + merged[i - 1].count > merged[i].offset) {
            size_t at = merged[i].offset;
            free(merged);
            moe_optimizer_destroy(o);
            return moe_error(MOE_EINVAL, "optimizer: regions overlap at offset %zu", at);
        }
    o->n_regions = clip_to_spans(o->regions, merged, n_merged, spans, n_spans, &o->n);
    free(merged);
    if (cfg->kind == OPTIM_ADAMW) {
        const size_t bytes = (o->n ? o->n : 1) * sizeof(real); // (an empty shard: 1)
        o->m = be->alloc(be, bytes);
        o->v = be->alloc(be, bytes);
        if (!o->m || !o->v) {
            moe_optimizer_destroy(o);
            return moe_error(MOE_ENOMEM, "optimizer: cannot allocate %zu bytes of AdamW moments",
                             2 * bytes);
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
        const optim_piece *r = &o->regions[i];
        moe_bf16 *p16 = params16 ? params16 + r->offset : NULL;
        if (c->kind == OPTIM_SGD) {
            o->be->sgd_update(o->be, params + r->offset, p16, grads + r->offset, r->count, (real)lr,
                              (real)grad_scale);
        } else {
            hp.weight_decay = (real)(r->decay ? c->weight_decay : 0.0);
            o->be->adamw_update(o->be, params + r->offset, p16, o->m + r->moment, o->v + r->moment,
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
