// The exchange plans of a forward under expert parallelism (layers/moe.h, DESIGN.md §4): which
// rows travel, in which chunk (cfg.overlap_chunks), and where every row goes on both sides.
// Host index work only; layers/moe.c moves the rows.
//   rows:  one row per kept assignment; chunk c is the rows of chunk c's local experts.
//   dedup: a packet is one (token, destination rank) pair carrying the token's row once for
//          all its kept slots at that rank; it goes out in the chunk of its first slot's
//          group (g_min) and its sum comes back in the chunk of its last (g_max); with one
//          chunk this is the plain dedup plan.
#include "layers/moe_internal.h"

#include <stdlib.h>
#include <string.h>

// ---- rows --------------------------------------------------------------------------------

// The exchange plan of a forward (expert parallelism), from the kept rows per global expert
// (offsets, host): rank j of the group gets this rank's rows of experts [j El, (j+1) El),
// contiguous in xp; the per-local-expert counts go both ways in one all-to-all of ints. In
// chunks of local experts (L->chunks, 1: the whole), chunk c's rows for rank j start at its
// first expert's offset in xp; what arrives is [chunk][source rank][local expert] in xr and
// the experts want [local expert][source rank].
void moe_rows_plan(moe_layer *L, const int *offsets) {
    const int R = L->ep_size, El = L->E_local;
    for (int j = 0; j < R; j++) {
        for (int e = 0; e < El; e++)
            L->send_counts[j * El + e] = offsets[j * El + e + 1] - offsets[j * El + e];
        L->send_rows[j] = offsets[(j + 1) * El] - offsets[j * El];
        L->recv_rows[j] = 0;
    }
    L->ep->alltoall_int(L->ep, L->recv_counts, L->send_counts, El);
    int at = 0; // rows of (c, i, e) in the order they arrive
    for (int c = 0; c < L->chunks; c++) {
        const int e0 = L->chunk_expert[c], e1 = L->chunk_expert[c + 1];
        for (int i = 0; i < R; i++) {
            const int ci = c * R + i;
            L->tok_at[ci] = offsets[i * El + e0];
            L->tok_rows[ci] = offsets[i * El + e1] - offsets[i * El + e0];
            L->exp_at[ci] = at;
            for (int e = e0; e < e1; e++) {
                const int n = L->recv_counts[i * El + e];
                L->to_expert[e * R + i] = (moe_row_chunk){.src = at, .rows = n};
                at += n;
            }
            L->exp_rows[ci] = at - L->exp_at[ci];
            L->recv_rows[i] += L->exp_rows[ci];
        }
    }
    const size_t blocks = (size_t)L->chunks * R * sizeof(int); // back: the same blocks
    memcpy(L->tokb_rows, L->tok_rows, blocks), memcpy(L->tokb_at, L->tok_at, blocks);
    memcpy(L->expb_rows, L->exp_rows, blocks), memcpy(L->expb_at, L->exp_at, blocks);
    L->local_offsets[0] = 0;
    for (int e = 0, row = 0; e < El; e++) { // where (e, i) goes in the experts' order
        for (int i = 0; i < R; i++) {
            moe_row_chunk *c = &L->to_expert[e * R + i];
            c->dst = row, row += c->rows;
            L->to_source[e * R + i] =
                (moe_row_chunk){.src = c->dst, .dst = c->src, .rows = c->rows};
        }
        L->local_offsets[e + 1] = row;
    }
    L->expert_offsets = L->local_offsets;
    L->expert_rows = at;
}

// ---- dedup -------------------------------------------------------------------------------


// The chunk of local expert e (chunks are runs of local experts).
static int chunk_of(const moe_layer *L, int e) {
    int c = 0;
    while (e >= L->chunk_expert[c + 1]) c++;
    return c;
}

// g_min and g_max of a packet's slots s[k] (local experts, -1 none); g_min = C when none.
static void packet_chunks(const moe_layer *L, const int *s, int *g_min, int *g_max) {
    *g_min = L->chunks, *g_max = -1;
    for (int j = 0; j < L->cfg.top_k; j++) {
        if (s[j] < 0) continue;
        const int g = chunk_of(L, s[j]);
        if (g < *g_min) *g_min = g;
        if (g > *g_max) *g_max = g;
    }
}

// The slots of token t at rank r into s[k] (its local expert there, or -1); how many it has.
static int slots_at(const moe_layer *L, const int *topk, const int *keep, int t, int r, int *s) {
    const int k = L->cfg.top_k, El = L->E_local;
    int here = 0;
    for (int j = 0; j < k; j++) {
        const int e = topk[t * k + j];
        s[j] = keep[t * k + j] && e / El == r ? e - r * El : -1;
        here += s[j] >= 0;
    }
    return here;
}

// Sending side (from the readback's top-k and keep): the packets in dispatch order
// [destination][g_min][token] (pk_token, pk_slots: the token then the slots), their blocks per
// (chunk, destination) (tok_*), and the combine order [destination][g_max][token]: where each
// sum comes back (pk_home, tokb_*). The spare item after the last packet is scratch.
static void plan_send(moe_layer *L, int T) {
    const int R = L->ep_size, k = L->cfg.top_k, C = L->chunks, K1 = k + 1;
    const int *topk = readback_topk(L->host_readback, L->cfg.n_experts);
    const int *keep = readback_keep(L, L->host_readback);
    int n = 0, g0, g1;
    for (int r = 0; r < R; r++) {
        const int first = n;
        for (int c = 0; c < C; c++) {
            L->tok_at[c * R + r] = n;
            for (int t = 0; t < T; t++) {
                int *item = L->pk_slots + (size_t)n * K1;
                if (!slots_at(L, topk, keep, t, r, item + 1)) continue;
                packet_chunks(L, item + 1, &g0, &g1);
                if (g0 != c) continue;
                item[0] = t, L->pk_token[n++] = t;
            }
            L->tok_rows[c * R + r] = n - L->tok_at[c * R + r];
        }
        L->send_rows[r] = n - first;
    }
    L->pk_sent = n;
    int *s = L->pk_slots + (size_t)n * K1 + 1, b = 0; // the spare item
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) {
            L->tokb_at[c * R + r] = b;
            for (int t = 0; t < T; t++) {
                if (c == 0) L->pk_home[t * R + r] = -1;
                if (!slots_at(L, topk, keep, t, r, s)) continue;
                packet_chunks(L, s, &g0, &g1);
                if (g1 == c) L->pk_home[t * R + r] = b++;
            }
            L->tokb_rows[c * R + r] = b - L->tokb_at[c * R + r];
        }
}

// The per-chunk packet counts (C ints per rank) and the packets' items (k + 1 host ints
// each) go to their receivers.
static void exchange_plan(moe_layer *L) {
    const int R = L->ep_size, C = L->chunks;
    for (int r = 0; r < R; r++)
        for (int c = 0; c < C; c++) L->send_counts[r * C + c] = L->tok_rows[c * R + r];
    L->ep->alltoall_int(L->ep, L->recv_counts, L->send_counts, C);
    for (int i = 0; i < R; i++) {
        L->recv_rows[i] = 0;
        for (int c = 0; c < C; c++) L->recv_rows[i] += L->recv_counts[i * C + c];
    }
    L->ep->alltoallv_host(L->ep, L->pk_slots_in, L->recv_rows, L->pk_slots, L->send_rows,
                          (size_t)(L->cfg.top_k + 1) * sizeof(int));
}

// Receiving side, the dispatch order [g_min][source][token] (exp_*: where chunk c from source
// i lands) and, per received packet d in that order, its item: arrival[d] (the items came
// [source][g_min][token]; send_counts, free again, holds where each block arrived).
static const int *item_of(const moe_layer *L, int c, int i, int m) {
    const int at = L->send_counts[c * L->ep_size + i] + m;
    return L->pk_slots_in + (size_t)at * (L->cfg.top_k + 1);
}

static int plan_dispatch_order(moe_layer *L) {
    const int R = L->ep_size, C = L->chunks;
    for (int i = 0, a = 0; i < R; i++)
        for (int c = 0; c < C; c++) L->send_counts[c * R + i] = a, a += L->recv_counts[i * C + c];
    int at = 0;
    for (int c = 0; c < C; c++)
        for (int i = 0; i < R; i++) {
            L->exp_at[c * R + i] = at;
            L->exp_rows[c * R + i] = L->recv_counts[i * C + c];
            at += L->exp_rows[c * R + i];
        }
    return at;
}

// pk_order: the received packets (dispatch indexes) by source, then token: each source's C
// blocks are in token order, merged here (the order one chunk would have).
static void plan_token_order(moe_layer *L) {
    const int R = L->ep_size, C = L->chunks;
    int o = 0, head[MOE_OVERLAP_MAX];
    for (int i = 0; i < R; i++) {
        for (int c = 0; c < C; c++) head[c] = 0;
        for (;;) {
            int best = -1, best_t = 0;
            for (int c = 0; c < C; c++) {
                if (head[c] >= L->exp_rows[c * R + i]) continue;
                const int t = item_of(L, c, i, head[c])[0];
                if (best < 0 || t < best_t) best = c, best_t = t;
            }
            if (best < 0) break;
            L->pk_order[o++] = L->exp_at[best * R + i] + head[best]++;
        }
    }
}

// The item of dispatch-order packet d (the inverse of item_of's placement).
static const int *item_at(const moe_layer *L, int d) {
    const int R = L->ep_size, C = L->chunks;
    for (int c = C - 1; c >= 0; c--)
        for (int i = R - 1; i >= 0; i--)
            if (d >= L->exp_at[c * R + i]) return item_of(L, c, i, d - L->exp_at[c * R + i]);
    return NULL; // not reached: exp_at[0] = 0
}

// The local experts' rows in [local expert][source][token] order (the rows exchange's, and
// one chunk's), each the copy of one received packet (pk_expand), and the inverse pk_assign
// (the expert row of each received slot, dispatch order).
static void plan_rows(moe_layer *L, const int *const *items) {
    const int El = L->E_local, k = L->cfg.top_k, P = L->pk_received;
    for (int s = 0; s < P * k; s++) L->pk_assign[s] = -1;
    int row = 0;
    for (int e = 0; e < El; e++) {
        L->local_offsets[e] = row;
        for (int o = 0; o < P; o++) {
            const int d = L->pk_order[o];
            for (int j = 0; j < k; j++)
                if (items[d][1 + j] == e) { // beyond the cap: counted, not written
                    if (row < L->max_expert_rows) L->pk_expand[row] = d;
                    L->pk_assign[d * k + j] = row++;
                }
        }
    }
    L->local_offsets[El] = row;
    L->expert_offsets = L->local_offsets;
    L->expert_rows = row;
}

// The combine order [g_max][source][token]: pk_perm_b (its dispatch index), pk_assign_b and
// expb_* (where chunk c's sums for source i start).
static void plan_combine_order(moe_layer *L, const int *const *items) {
    const int R = L->ep_size, C = L->chunks, k = L->cfg.top_k;
    int q = 0, g0, g1;
    for (int c = 0; c < C; c++)
        for (int i = 0, o = 0; i < R; i++) {
            L->expb_at[c * R + i] = q;
            for (int end = o + L->recv_rows[i]; o < end; o++) {
                const int d = L->pk_order[o];
                packet_chunks(L, items[d] + 1, &g0, &g1);
                if (g1 != c) continue;
                L->pk_perm_b[q] = d;
                for (int j = 0; j < k; j++) L->pk_assign_b[q * k + j] = L->pk_assign[d * k + j];
                q++;
            }
            L->expb_rows[c * R + i] = q - L->expb_at[c * R + i];
        }
}

void moe_packets_plan(moe_layer *L, int T) {
    plan_send(L, T);
    exchange_plan(L);
    const int P = plan_dispatch_order(L);
    L->pk_received = P;
    const int **items = malloc((size_t)(P ? P : 1) * sizeof *items);
    if (!items) moe_fatal("moe: out of host memory");
    for (int d = 0; d < P; d++) items[d] = item_at(L, d);
    plan_token_order(L);
    plan_rows(L, items);
    plan_combine_order(L, items);
    free(items);
}
