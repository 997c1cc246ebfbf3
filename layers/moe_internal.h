// What the MoE layer's files share (layers/moe.c: forward and backward; layers/moe_buffers.c:
// creating and freeing a layer's buffers): the layout of the one readback buffer. Only
// layers/ includes it.
#ifndef MOE_LAYERS_MOE_INTERNAL_H
#define MOE_LAYERS_MOE_INTERNAL_H

#include <stddef.h>

#include "layers/moe.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// The readback buffer: counts [E] and offsets [E+1] ints, then the loss slots at an offset
// aligned for reals.
static inline size_t readback_loss_offset(int E) {
    const size_t ints = (2 * (size_t)E + 1) * sizeof(int), a = sizeof(real);
    return (ints + a - 1) / a * a;
}
static inline size_t readback_bytes(int E) {
    return readback_loss_offset(E) + MOE_LOSS_SLOTS * sizeof(real);
}
// ... and then the top-k choices [T, k] ints (the router writes them there), read back with
// the rest when the layer counts co-activations or plans a dedup exchange, and after them
// (at max_tokens k ints) the capacity decision keep [T, k] (the dedup plan's too).
static inline int *readback_topk(void *readback, int E) {
    return (int *)((char *)readback + readback_bytes(E));
}
static inline int *readback_keep(const moe_layer *L, void *readback) {
    return readback_topk(readback, L->cfg.n_experts) + (size_t)L->max_tokens * L->cfg.top_k;
}
static inline int dedup_exchange(const moe_layer *L) {
    return L->ep && L->cfg.exchange == MOE_EXCHANGE_DEDUP;
}

// The rows exchange's plan of a forward (layers/moe_plan.c), from the kept rows per global
// expert (offsets [E+1], host): counts, the chunks' blocks on both sides, the regrouping by
// local expert (to_expert, to_source, local_offsets, expert_rows). Collective over the EP
// group (one all-to-all of counts).
void moe_rows_plan(moe_layer *L, const int *offsets);

// The dedup exchange's plan of a forward of T tokens (layers/moe_plan.c): the packets and
// their chunks on both sides (pk_*, tok_*, tokb_*, exp_*, expb_*, send_rows, recv_rows), the
// local experts' rows (local_offsets, expert_rows). Host only; collective over the EP group
// (one all-to-all of counts, one of the packets' items).
void moe_packets_plan(moe_layer *L, int T);

#pragma GCC visibility pop

#endif
