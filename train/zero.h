// The sharded optimizer (parallel.shard_optimizer, ZeRO-1; docs/expert-parallelism.md): the
// dense parameters [0, n_dense) are replicated on all R ranks of the world (data parallelism
// of degree D = R), so each rank keeps the AdamW moments of one contiguous piece of them
// only. Its experts (expert parallelism already split them over the EP group) are replicated
// on the De = R / ep_size ranks of its expert-data-parallel group (edp): their moments are
// cut the same way over edp, De pieces. A step then:
//   1. reduce-scatters the gradients: dense over the world, experts over edp; each rank gets
//      the sum over its pieces;
//   2. sums the gradient norm's squares over the pieces (each parameter once);
//   3. updates its pieces;
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
    moe_comm *world, *edp; // the dense pieces' ranks; the experts' (NULL: one rank, no pieces)
    size_t *counts;        // [world size] reals of each piece of the dense [0, n_dense)
    size_t *ecounts;       // [edp size] reals of each piece of the experts [n_dense, n_params)
    size_t lo, hi;         // this rank's dense piece [lo, hi)
    size_t elo, ehi;       // and its expert piece [elo, ehi) (in the parameter buffer)
} moe_zero;

// The D near-equal contiguous pieces of n reals: piece r is [floor(r n / D), floor((r+1) n /
// D)), so counts differ by at most one and the pieces tile [0, n) in rank order.
void moe_zero_piece(size_t n, int D, int r, size_t *lo, size_t *hi);

// The pieces of m's dense parameters over the world and of its experts over edp (NULL or
// size 1: whole).
moe_status moe_zero_init(moe_zero *z, const moe_model *m, moe_comm *world, moe_comm *edp);
void moe_zero_free(moe_zero *z);

// The rank's optimizer: moments for its pieces only (spans [lo, hi) and [elo, ehi)), the
// regions' weight decay flags kept inside them.
moe_status moe_zero_optimizer_create(const moe_zero *z, moe_optimizer *o, const moe_model *m,
                                     const optim_config *cfg, const optim_region *regions,
                                     int n_regions);

// Steps 1-4 above. grad_sum_squares: the squared norm of the whole reduced gradient, each
// parameter once, on every rank. gather_params: every rank's updated pieces into every
// rank's params; params16 (NULL: none) of the pieces that were not this rank's rounded here
// (this rank's were written by the update: to_bf16 gives the same bits everywhere).
void moe_zero_reduce_grads(const moe_zero *z, moe_model *m);
double moe_zero_grad_sum_squares(const moe_zero *z, moe_model *m);
void moe_zero_gather_params(const moe_zero *z, moe_model *m, moe_bf16 *params16);

// The whole moments of a sharded AdamW optimizer o, for a checkpoint save: *full gets m and v
// of all n_params (allocated here; moe_optimizer_destroy frees them), o's kind and count.
// Collective over the world.
moe_status moe_zero_gather_moments(const moe_zero *z, const moe_optimizer *o, const moe_model *m,
                                   moe_optimizer *full);
// An empty whole-layout optimizer like o (moments of n_params), for a checkpoint load; then
// moe_zero_take_shard(z, o, full) keeps this rank's pieces (and the count).
moe_status moe_zero_whole_like(const moe_optimizer *o, const moe_model *m, moe_optimizer *full);
void moe_zero_take_shard(const moe_zero *z, moe_optimizer *o, const moe_optimizer *full);

// Moments (reals) one rank keeps: the largest dense piece over D ranks and the largest piece
// of its n_expert_local expert parameters over De.
size_t moe_zero_moments_per_rank(size_t n_dense, size_t n_expert_local, int D, int De);

#pragma GCC visibility pop

#endif
