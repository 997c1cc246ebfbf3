// The sharded optimizer (parallel.shard_optimizer, ZeRO-1; docs/expert-parallelism.md): the
// dense parameters [0, n_dense) are replicated on all R ranks of the world (data parallelism
// of degree D = R), so each rank keeps the AdamW moments of one contiguous piece of them
// only, plus those of its own experts (which expert parallelism already split; their moments
// stay whole on each replica of the expert-data-parallel group). A step then:
//   1. reduce-scatters the dense gradients: rank r gets the world's sum over its piece;
//   2. sums the gradient norm's squares over the pieces (each dense parameter once);
//   3. updates its piece and its experts;
//   4. all-gathers the updated pieces (and rounds the others' bf16 copies itself).
// Checkpoints hold the whole moments (gathered before a save, cut after a load), so they
// resume under any R, sharded or not. Train-internal (hidden in libmoe.so).
#ifndef MOE_ZERO_H
#define MOE_ZERO_H

#include <stddef.h>

#include "layers/exchange.h"
#include "layers/model.h"
#include "optim/optimizer.h"

#pragma GCC visibility push(hidden)

typedef struct {
    int D, rank;    // the world's ranks (D pieces) and this rank's piece
    size_t *counts; // [D] reals of each piece of [0, n_dense)
    size_t lo, hi;  // this rank's piece [lo, hi)
} moe_zero;

// The D near-equal contiguous pieces of n reals: piece r is [floor(r n / D), floor((r+1) n /
// D)), so counts differ by at most one and the pieces tile [0, n) in rank order.
void moe_zero_piece(size_t n, int D, int r, size_t *lo, size_t *hi);

// The pieces of m's dense parameters over D ranks, this rank's `rank`.
moe_status moe_zero_init(moe_zero *z, const moe_model *m, int D, int rank);
void moe_zero_free(moe_zero *z);

// The rank's optimizer: moments for its piece and its experts only (spans [lo, hi) and
// [n_dense, n_params)), the regions' weight decay flags kept inside them.
moe_status moe_zero_optimizer_create(const moe_zero *z, moe_optimizer *o, const moe_model *m,
                                     const optim_config *cfg, const optim_region *regions,
                                     int n_regions);

// Steps 1-4 above. reduce_grads: dense over the world (reduce-scatter), experts over edp
// (all-reduce, as unsharded). grad_sum_squares: the squared norm of the whole reduced
// gradient, each parameter once (dense pieces summed over the world, experts over the EP
// group), on every rank. gather_params: the world's updated pieces into every rank's params;
// params16 (NULL: none) of the pieces that were not this rank's rounded here (this rank's
// were written by the update: to_bf16 gives the same bits everywhere).
void moe_zero_reduce_grads(const moe_zero *z, moe_model *m, moe_comm *world, moe_comm *edp);
double moe_zero_grad_sum_squares(const moe_zero *z, moe_model *m, moe_comm *world);
void moe_zero_gather_params(const moe_zero *z, moe_model *m, moe_comm *world, moe_bf16 *params16);

// The whole moments of a sharded AdamW optimizer o, for a checkpoint save: *full gets m and v
// of all n_params (allocated here; moe_optimizer_destroy frees them), o's kind and count.
// Collective over the world.
moe_status moe_zero_gather_moments(const moe_zero *z, const moe_optimizer *o, const moe_model *m,
                                   moe_comm *world, moe_optimizer *full);
// An empty whole-layout optimizer like o (moments of n_params), for a checkpoint load; then
// moe_zero_take_shard(z, o, full, m) keeps this rank's piece and experts (and the count).
moe_status moe_zero_whole_like(const moe_optimizer *o, const moe_model *m, moe_optimizer *full);
void moe_zero_take_shard(const moe_zero *z, moe_optimizer *o, const moe_optimizer *full,
                         const moe_model *m);

// Moments (reals) one rank keeps: the largest dense piece over D ranks and its experts'.
size_t moe_zero_moments_per_rank(size_t n_dense, size_t n_expert_local, int D);

#pragma GCC visibility pop

#endif
