// The sharded optimizer (train/zero.h): pieces, the step's collectives, whole moments for
// checkpoints.
#include "train/zero.h"

#include <stdlib.h>
#include <string.h>

void moe_zero_piece(size_t n, int D, int r, size_t *lo, size_t *hi) {
    *lo = n * (size_t)r / (size_t)D; // (n D fits: n < 2^40 parameters, D < 2^20 ranks)
    *hi = n * (size_t)(r + 1) / (size_t)D;
}

// counts [D] of the pieces of n, and piece r's range.
static void pieces_of(size_t n, int D, int r, size_t *counts, size_t *lo, size_t *hi) {
    for (int i = 0; i < D; i++) {
        size_t a, b;
        moe_zero_piece(n, D, i, &a, &b);
        counts[i] = b - a;
    }
    moe_zero_piece(n, D, r, lo, hi);
}

moe_status moe_zero_init(moe_zero *z, const moe_model *m, moe_comm *world, moe_comm *edp) {
    memset(z, 0, sizeof *z);
    z->world = world, z->edp = edp && edp->size > 1 ? edp : NULL;
    const int De = z->edp ? z->edp->size : 1;
    z->counts = malloc(((size_t)world->size + (size_t)De) * sizeof *z->counts);
    if (!z->counts) return moe_error(MOE_ENOMEM, "shard_optimizer: out of memory");
    z->ecounts = z->counts + world->size;
    pieces_of(m->n_dense, world->size, world->rank, z->counts, &z->lo, &z->hi);
    pieces_of(m->n_params - m->n_dense, De, z->edp ? z->edp->rank : 0, z->ecounts, &z->elo,
              &z->ehi);
    z->elo += m->n_dense, z->ehi += m->n_dense;
    return MOE_OK;
}

void moe_zero_free(moe_zero *z) {
    free(z->counts);
    memset(z, 0, sizeof *z);
}

moe_status moe_zero_optimizer_create(const moe_zero *z, moe_optimizer *o, const moe_model *m,
                                     const optim_config *cfg, const optim_region *regions,
                                     int n_regions) {
    const optim_span spans[2] = {{z->lo, z->hi - z->lo}, {z->elo, z->ehi - z->elo}};
    return moe_optimizer_create_spans(o, m->be, cfg, m->n_params, regions, n_regions, spans, 2);
}

void moe_zero_reduce_grads(const moe_zero *z, moe_model *m) {
    z->world->reduce_scatter_sum_real(z->world, m->be, m->grads, z->counts);
    if (z->edp) z->edp->reduce_scatter_sum_real(z->edp, m->be, m->grads + m->n_dense, z->ecounts);
}

// |g|^2 = sum over the world's ranks of the squares of their dense piece and of their expert
// piece: each dense parameter lies in one rank's piece, and each expert parameter in one
// piece of one rank of the group holding it (EP groups hold distinct experts, their edp
// group splits them). The same terms as unsharded, summed in another order: equal to double
// rounding. Dense and expert sums stay apart, added last as moe_model_grad_sum_squares does.
double moe_zero_grad_sum_squares(const moe_zero *z, moe_model *m) {
    double ss[2];
    m->be->sum_squares(m->be, &ss[0], m->grads + z->lo, z->hi - z->lo);
    m->be->sum_squares(m->be, &ss[1], m->grads + z->elo, z->ehi - z->elo);
    z->world->allreduce_sum_double(z->world, ss, 2);
    return ss[0] + ss[1];
}

// bf16 of params [a, b) (the pieces other ranks updated).
static void round_range(moe_model *m, moe_bf16 *params16, size_t a, size_t b) {
    if (b > a) m->be->to_bf16(m->be, params16 + a, m->params + a, b - a);
}

void moe_zero_gather_params(const moe_zero *z, moe_model *m, moe_bf16 *params16) {
    z->world->allgather_real(z->world, m->be, m->params, z->counts);
    if (z->edp) z->edp->allgather_real(z->edp, m->be, m->params + m->n_dense, z->ecounts);
    if (!params16) return;
    round_range(m, params16, 0, z->lo);
    round_range(m, params16, z->hi, z->elo); // (hi <= n_dense <= elo)
    round_range(m, params16, z->ehi, m->n_params);
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

// The sharded moments hold the dense piece [lo, hi) at 0 and the expert piece [elo, ehi)
// right after it (spans packed in order).
static size_t expert_moments(const moe_zero *z) { return z->hi - z->lo; }

moe_status moe_zero_gather_moments(const moe_zero *z, const moe_optimizer *o, const moe_model *m,
                                   moe_optimizer *full) {
    moe_status st = moe_zero_whole_like(o, m, full);
    long failed = st != MOE_OK; // every rank allocates, or none gathers (no rank left waiting)
    z->world->allreduce_sum_long(z->world, &failed, 1);
    if (failed)
        return st ? st
                  : moe_error(MOE_ENOMEM,
                              "shard_optimizer: %ld rank(s) could not allocate the "
                              "whole moments for a checkpoint",
                              failed);
    if (!o->m) return MOE_OK;
    moe_backend *be = o->be;
    const size_t piece = (z->hi - z->lo) * sizeof(real), epiece = (z->ehi - z->elo) * sizeof(real);
    for (int i = 0; i < 2; i++) {
        real *dst = i ? full->v : full->m, *src = i ? o->v : o->m;
        if (piece) be->copy_on_device(be, dst + z->lo, src, piece);
        if (epiece) be->copy_on_device(be, dst + z->elo, src + expert_moments(z), epiece);
        z->world->allgather_real(z->world, be, dst, z->counts);
        if (z->edp) z->edp->allgather_real(z->edp, be, dst + m->n_dense, z->ecounts);
    }
    return MOE_OK;
}

void moe_zero_take_shard(const moe_zero *z, moe_optimizer *o, const moe_optimizer *full) {
    o->t = full->t;
    if (!o->m) return;
    moe_backend *be = o->be;
    const size_t piece = (z->hi - z->lo) * sizeof(real), epiece = (z->ehi - z->elo) * sizeof(real);
    for (int i = 0; i < 2; i++) {
        real *dst = i ? o->v : o->m, *src = i ? full->v : full->m;
        if (piece) be->copy_on_device(be, dst, src + z->lo, piece);
        if (epiece) be->copy_on_device(be, dst + expert_moments(z), src + z->elo, epiece);
    }
}

size_t moe_zero_moments_per_rank(size_t n_dense, size_t n_expert_local, int D, int De) {
    // the largest pieces: ceil(n / D)
    return (n_dense + (size_t)D - 1) / (size_t)D + (n_expert_local + (size_t)De - 1) / (size_t)De;
}
