// The sharded optimizer (train/zero.h): pieces, the step's collectives, whole moments for
// checkpoints.
#include "train/zero.h"

#include <stdlib.h>
#include <string.h>

void moe_zero_piece(size_t n, int D, int r, size_t *lo, size_t *hi) {
    *lo = n * (size_t)r / (size_t)D; // (n D fits: n < 2^40 parameters, D < 2^20 ranks)
    *hi = n * (size_t)(r + 1) / (size_t)D;
}

moe_status moe_zero_init(moe_zero *z, const moe_model *m, int D, int rank) {
    memset(z, 0, sizeof *z);
    z->counts = malloc((size_t)D * sizeof *z->counts);
    if (!z->counts) return moe_error(MOE_ENOMEM, "shard_optimizer: out of memory");
    z->D = D, z->rank = rank;
    for (int r = 0; r < D; r++) {
        size_t lo, hi;
        moe_zero_piece(m->n_dense, D, r, &lo, &hi);
        z->counts[r] = hi - lo;
    }
    moe_zero_piece(m->n_dense, D, rank, &z->lo, &z->hi);
    return MOE_OK;
}

void moe_zero_free(moe_zero *z) {
    free(z->counts);
    memset(z, 0, sizeof *z);
}

moe_status moe_zero_optimizer_create(const moe_zero *z, moe_optimizer *o, const moe_model *m,
                                     const optim_config *cfg, const optim_region *regions,
                                     int n_regions) {
    const optim_span spans[2] = {{z->lo, z->hi - z->lo}, {m->n_dense, m->n_params - m->n_dense}};
    return moe_optimizer_create_spans(o, m->be, cfg, m->n_params, regions, n_regions, spans, 2);
}

void moe_zero_reduce_grads(const moe_zero *z, moe_model *m, moe_comm *world, moe_comm *edp) {
    world->reduce_scatter_sum_real(world, m->be, m->grads, z->counts);
    if (edp && edp->size > 1)
        edp->allreduce_sum_real(edp, m->be, m->grads + m->n_dense, m->n_params - m->n_dense);
}

// |g|^2 = sum over pieces r of |g_r|^2 (each dense parameter in exactly one piece) + the
// experts' as moe_model_grad_sum_squares counts them (each expert once: summed over its EP
// group). The same terms as unsharded, summed in another order: equal to double rounding.
double moe_zero_grad_sum_squares(const moe_zero *z, moe_model *m, moe_comm *world) {
    double dense, experts;
    m->be->sum_squares(m->be, &dense, m->grads + z->lo, z->hi - z->lo);
    world->allreduce_sum_double(world, &dense, 1);
    m->be->sum_squares(m->be, &experts, m->grads + m->n_dense, m->n_params - m->n_dense);
    if (m->ep) m->ep->allreduce_sum_double(m->ep, &experts, 1);
    return dense + experts;
}

void moe_zero_gather_params(const moe_zero *z, moe_model *m, moe_comm *world, moe_bf16 *params16) {
    world->allgather_real(world, m->be, m->params, z->counts);
    if (!params16) return;
    m->be->to_bf16(m->be, params16, m->params, z->lo); // the pieces before this rank's
    m->be->to_bf16(m->be, params16 + z->hi, m->params + z->hi, m->n_dense - z->hi); // after
}

moe_status moe_zero_whole_like(const moe_optimizer *o, const moe_model *m, moe_optimizer *full) {
    memset(full, 0, sizeof *full);
    full->cfg = o->cfg, full->be = o->be, full->n = m->n_params, full->t = o->t;
    if (!o->m) return MOE_OK; // SGD: no moments
    full->m = o->be->alloc(o->be, m->n_params * sizeof(real));
    full->v = o->be->alloc(o->be, m->n_params * sizeof(real));
    if (full->m && full->v) return MOE_OK;
    moe_optimizer_destroy(full);
    return moe_error(MOE_ENOMEM,
                     "shard_optimizer: cannot allocate %zu bytes for the whole AdamW moments of a "
                     "checkpoint",
                     2 * m->n_params * sizeof(real));
}

// The sharded moments hold [lo, hi) at 0 and the experts [n_dense, n_params) right after
// (spans packed in order): parameter p >= lo has its moment at p - lo, p < hi or p >= n_dense.
static size_t expert_moments(const moe_zero *z) { return z->hi - z->lo; }

moe_status moe_zero_gather_moments(const moe_zero *z, const moe_optimizer *o, const moe_model *m,
                                   moe_comm *world, moe_optimizer *full) {
    moe_status st = moe_zero_whole_like(o, m, full);
    long failed = st != MOE_OK; // every rank allocates, or none gathers (no rank left waiting)
    world->allreduce_sum_long(world, &failed, 1);
    if (failed)
        return st ? st
                  : moe_error(MOE_ENOMEM,
                              "shard_optimizer: %ld rank(s) could not allocate the "
                              "whole moments for a checkpoint",
                              failed);
    if (!o->m) return MOE_OK;
    moe_backend *be = o->be;
    const size_t piece = (z->hi - z->lo) * sizeof(real),
                 experts = (m->n_params - m->n_dense) * sizeof(real);
    for (int i = 0; i < 2; i++) {
        real *dst = i ? full->v : full->m, *src = i ? o->v : o->m;
        if (piece) be->copy_on_device(be, dst + z->lo, src, piece);
        if (experts) be->copy_on_device(be, dst + m->n_dense, src + expert_moments(z), experts);
        world->allgather_real(world, be, dst, z->counts);
    }
    return MOE_OK;
}

void moe_zero_take_shard(const moe_zero *z, moe_optimizer *o, const moe_optimizer *full,
                         const moe_model *m) {
    o->t = full->t;
    if (!o->m) return;
    moe_backend *be = o->be;
    const size_t piece = (z->hi - z->lo) * sizeof(real),
                 experts = (m->n_params - m->n_dense) * sizeof(real);
    for (int i = 0; i < 2; i++) {
        real *dst = i ? o->v : o->m, *src = i ? full->v : full->m;
        if (piece) be->copy_on_device(be, dst, src + z->lo, piece);
        if (experts) be->copy_on_device(be, dst + expert_moments(z), src + m->n_dense, experts);
    }
}

size_t moe_zero_moments_per_rank(size_t n_dense, size_t n_expert_local, int D) {
    return (n_dense + (size_t)D - 1) / (size_t)D + n_expert_local; // the largest piece: ceil
}
