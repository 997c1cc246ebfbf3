// The MoE layer: orchestration of the kernels in layers/backend.h (see moe.h).
#include "layers/moe.h"

#include "layers/moe_internal.h"
#include "layers/timing.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

moe_config moe_config_default(int d_model, int d_ff, int n_experts, int top_k) {
    moe_config c = {
        .d_model = d_model,
        .d_ff = d_ff,
        .n_experts = n_experts,
        .top_k = top_k,
        .norm_topk_prob = 1,
        .capacity_factor = 0.0,
        .drop_policy = MOE_DROP_PROBS,
        .aux_coef = 0.01,
        .z_coef = 0.001,
        .scoring = MOE_SCORE_SOFTMAX,
        .route_scale = 1.0,
        .seq_aux_coef = 0.0,
        .jitter_eps = 0.0,
        .dtype = MOE_DTYPE_F32,
        .exchange = MOE_EXCHANGE_DEDUP,
        .overlap_chunks = 1,
        .n_group = 1,
        .topk_group = 1,
    };
    return c;
}

// Group-limited routing's fields (moe_config: n_group, topk_group).
static moe_status check_groups(const moe_config *cfg) {
    const int E = cfg->n_experts, n = cfg->n_group, kg = cfg->topk_group;
    if (n <= 1) {
        if (n < 0 || kg < 0 || kg > 1)
            return moe_error(MOE_EINVAL,
                             "moe: n_group=%d, topk_group=%d: without groups "
                             "(n_group <= 1) topk_group must be 1",
                             n, kg);
        return MOE_OK;
    }
    if (n > 64 || E % n || E / n < 2)
        return moe_error(MOE_EINVAL,
                         "moe: n_group=%d must divide n_experts=%d into groups of "
                         "at least 2 experts (at most 64 groups)",
                         n, E);
    if (kg < 1 || kg > n)
        return moe_error(MOE_EINVAL, "moe: topk_group=%d must be in [1, n_group=%d]", kg, n);
    if (cfg->top_k > kg * (E / n))
        return moe_error(MOE_EINVAL,
                         "moe: top_k=%d exceeds the %d experts of topk_group=%d "
                         "groups of %d",
                         cfg->top_k, kg * (E / n), kg, E / n);
    return MOE_OK;
}

moe_status moe_config_check(const moe_config *cfg) {
    if (!cfg) return moe_error(MOE_EINVAL, "moe: config is NULL");
    if (cfg->d_model < 1)
        return moe_error(MOE_EINVAL, "moe: d_model=%d must be >= 1", cfg->d_model);
    if (cfg->d_ff < 1) return moe_error(MOE_EINVAL, "moe: d_ff=%d must be >= 1", cfg->d_ff);
    if (cfg->n_experts < 1)
        return moe_error(MOE_EINVAL, "moe: n_experts=%d must be >= 1", cfg->n_experts);
    if (cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
        return moe_error(MOE_EINVAL, "moe: top_k=%d must be in [1, n_experts=%d]", cfg->top_k,
                         cfg->n_experts);
    if (cfg->norm_topk_prob != 0 && cfg->norm_topk_prob != 1)
        return moe_error(MOE_EINVAL, "moe: norm_topk_prob=%d must be 0 or 1", cfg->norm_topk_prob);
    if (!isfinite(cfg->capacity_factor))
        return moe_error(MOE_EINVAL, "moe: capacity_factor=%g must be finite",
                         cfg->capacity_factor);
    if (cfg->drop_policy != MOE_DROP_PROBS && cfg->drop_policy != MOE_DROP_POSITION)
        return moe_error(MOE_EINVAL, "moe: drop_policy=%d is neither probs nor position",
                         (int)cfg->drop_policy);
    if (!isfinite(cfg->aux_coef) || cfg->aux_coef < 0)
        return moe_error(MOE_EINVAL, "moe: aux_coef=%g must be finite and >= 0", cfg->aux_coef);
    if (!isfinite(cfg->z_coef) || cfg->z_coef < 0)
        return moe_error(MOE_EINVAL, "moe: z_coef=%g must be finite and >= 0", cfg->z_coef);
    if (cfg->scoring != MOE_SCORE_SOFTMAX && cfg->scoring != MOE_SCORE_SIGMOID)
        return moe_error(MOE_EINVAL, "moe: scoring=%d is neither softmax nor sigmoid",
                         (int)cfg->scoring);
    if (!isfinite(cfg->route_scale) || !(cfg->route_scale > 0))
        return moe_error(MOE_EINVAL, "moe: route_scale=%g must be finite and > 0",
                         cfg->route_scale);
    if (!isfinite(cfg->seq_aux_coef) || cfg->seq_aux_coef < 0)
        return moe_error(MOE_EINVAL, "moe: seq_aux_coef=%g must be finite and >= 0",
                         cfg->seq_aux_coef);
    if (!(cfg->jitter_eps >= 0 && cfg->jitter_eps < 1))
        return moe_error(MOE_EINVAL, "moe: jitter_eps=%g must be in [0, 1)", cfg->jitter_eps);
    if (cfg->dtype != MOE_DTYPE_F32 && cfg->dtype != MOE_DTYPE_BF16)
        return moe_error(MOE_EINVAL, "moe: dtype=%d is neither fp32 nor bf16", (int)cfg->dtype);
    moe_status st = check_groups(cfg);
    if (st) return st;
    if (cfg->exchange != MOE_EXCHANGE_DEDUP && cfg->exchange != MOE_EXCHANGE_ROWS)
        return moe_error(MOE_EINVAL, "moe: exchange=%d is neither dedup nor rows",
                         (int)cfg->exchange);
    if (cfg->overlap_chunks < 0 || cfg->overlap_chunks > MOE_OVERLAP_MAX)
        return moe_error(MOE_EINVAL, "moe: overlap_chunks=%d must be in [0, %d]",
                         cfg->overlap_chunks, MOE_OVERLAP_MAX);
    return MOE_OK;
}

int moe_capacity(const moe_config *cfg, int T, double capacity_factor) {
    if (!(capacity_factor > 0)) return 0;
    double c = ceil(((double)T * cfg->top_k / cfg->n_experts) * capacity_factor);
    // A capacity of at least T keeps everything: every token sends at most one assignment
    // to an expert. Clamp so huge factors cannot overflow an int.
    return c >= T ? T : (int)c;
}

size_t moe_weights_count_local(const moe_config *cfg, int E_local) {
    size_t E = cfg->n_experts, El = E_local, d = cfg->d_model, ff = cfg->d_ff;
    return E * d + 3 * El * ff * d; // gate + w13 + w2
}

void moe_weights_view_local(moe_weights *w, real *buf, const moe_config *cfg, int E_local) {
    size_t E = cfg->n_experts, El = E_local, d = cfg->d_model, ff = cfg->d_ff;
    w->gate = buf;
    w->w13 = w->gate + E * d;
    w->w2 = w->w13 + El * 2 * ff * d;
    w->bias = NULL; // not a parameter: the caller points it at a bias if it uses one
}

size_t moe_weights_count(const moe_config *cfg) {
    return moe_weights_count_local(cfg, cfg->n_experts);
}

void moe_weights_view(moe_weights *w, real *buf, const moe_config *cfg) {
    moe_weights_view_local(w, buf, cfg, cfg->n_experts);
}

// ---- forward / backward ----------------------------------------------------------

static moe_status check_call(const moe_layer *L, const void *a, const void *b, const moe_weights *w,
                             int T) {
    if (!L->be) return moe_error(MOE_EINVAL, "moe: layer is not initialised");
    if (!a || !b || !w || !w->gate || !w->w13 || !w->w2)
        return moe_error(MOE_EINVAL, "moe: NULL tensor argument");
    if (L->cfg.dtype == MOE_DTYPE_BF16 && (!w->gate16 || !w->w13_16 || !w->w2_16))
        return moe_error(MOE_EINVAL, "moe: dtype bf16 needs the bf16 weights (gate16, w13_16, "
                                     "w2_16)");
    if (T < 1 || T > L->max_tokens)
        return moe_error(MOE_EINVAL, "moe: T=%d tokens outside [1, max_tokens=%d]", T,
                         L->max_tokens);
    return MOE_OK;
}

// Route: the router's input (x, or x * u with u ~ U(1-eps, 1+eps) in training), logits
// [T,E] = router_in [T,d] @ gate [E,d]^T, scores and top-k, counts, the capacity decision,
// the grouped order of the kept rows, the router losses; then the layer's one device-to-host
// copy (counts, offsets, losses).
// Co-activations: coact[i E + j] += 1 for every token whose top-k holds experts i < j.
static void count_coactivations(moe_layer *L, const int *topk, int T) {
    const int E = L->cfg.n_experts, k = L->cfg.top_k;
    for (int t = 0; t < T; t++)
        for (int a = 0; a < k; a++)
            for (int b = a + 1; b < k; b++) {
                const int i = topk[t * k + a], j = topk[t * k + b];
                L->coact[i < j ? i * E + j : j * E + i]++;
            }
}

void moe_layer_set_aux_counts(moe_layer *L, const int *counts, int tokens) {
    L->aux_tokens = counts ? tokens : 0;
    if (counts)
        L->be->copy_to_device(L->be, L->aux_counts, counts, (size_t)L->cfg.n_experts * sizeof(int));
}

// The router kernels' hyper-parameters, from the layer's config (and its global counts).
static moe_router_hparams router_hparams(const moe_layer *L) {
    const moe_config *c = &L->cfg;
    const moe_router_hparams hp = {.aux_tokens = L->aux_tokens,
                                   .scoring = c->scoring,
                                   .norm_topk_prob = c->norm_topk_prob,
                                   .route_scale = (real)c->route_scale,
                                   .aux_coef = (real)c->aux_coef,
                                   .seq_aux_coef = (real)c->seq_aux_coef,
                                   .z_coef = (real)c->z_coef,
                                   .n_group = c->n_group,
                                   .topk_group = c->topk_group};
    return hp;
}

static void route(moe_layer *L, const real *inp, const moe_weights *w, int T, int seq_len,
                  int capacity) {
    moe_backend *be = L->be;
    const moe_config *c = &L->cfg;
    const int E = c->n_experts, k = c->top_k, d = c->d_model;
    const real *router_in = inp;
    if (L->jittered) {
        const real *u = L->jitter_override ? L->jitter_override : L->jitter;
        if (!L->jitter_override)
            be->uniform_noise(be, L->jitter, (size_t)T * d, L->noise_key, (real)(1 - c->jitter_eps),
                              (real)(1 + c->jitter_eps));
        be->mul(be, L->router_in, inp, u, (size_t)T * d, 0);
        router_in = L->router_in;
    }
    if (L->cfg.dtype == MOE_DTYPE_BF16) { // bf16 operands, fp32 logits
        be->to_bf16(be, L->router_in16, router_in, (size_t)T * d);
        be->matmul_bf16(be, L->logits, L->router_in16, w->gate16, T, E, d, 0, 1, 0);
    } else {
        be->matmul(be, L->logits, router_in, w->gate, T, E, d, 0, 1, 0);
    }
    const moe_router_shape shape = {.T = T, .E = E, .k = k, .seq_len = seq_len};
    const moe_router_hparams hp = router_hparams(L);
    const int *aux_counts = L->aux_tokens ? L->aux_counts : L->counts; // f's counts
    be->router_topk(be, L->scores, L->probs, L->lse, L->topk_idx, L->weights, L->logits, w->bias,
                    shape, hp);
    be->moe_dispatch_counts(be, L->counts, L->topk_idx, T, k, E);
    if (c->seq_aux_coef > 0) be->moe_seq_counts(be, L->seq_counts, L->topk_idx, T, k, E, seq_len);
    be->moe_capacity_keep(be, L->keep, L->scratch, L->topk_idx, L->weights, L->counts, T, k, E,
                          capacity, c->drop_policy);
    be->moe_permute_index(be, L->counts + E, L->assign_row, L->row_token, L->topk_idx, L->keep, T,
                          k, E);
    be->router_losses(be, L->losses, L->probs, L->logits, L->lse, aux_counts, L->seq_counts, shape,
                      hp);
    // the top-k choices when counted, and with them keep for a dedup plan
    const size_t N_max = (size_t)L->max_tokens * k, I = sizeof(int);
    const size_t extra = dedup_exchange(L) ? (N_max + (size_t)T * k) * I
                         : L->coactivation ? (size_t)T * k * I
                                           : 0;
    be->copy_to_host(be, L->host_readback, L->readback, readback_bytes(E) + extra);
    if (L->coactivation) count_coactivations(L, readback_topk(L->host_readback, E), T);
}

void moe_layer_exchange_reset(moe_layer *L) {
    if (L->sent_bytes) memset(L->sent_bytes, 0, (size_t)L->ep_size * sizeof(long));
    L->received_rows = 0, L->exchange_s = 0, L->experts_s = 0;
}

// Starts one nonblocking all-to-all-v of rows of `width` reals over the layer's group in
// transfer slot `slot` (sizes and displacements per rank), counted in its statistics.
static void start_rows(moe_layer *L, int slot, real *recv, const int *recv_rows, const int *recv_at,
                       const real *send, const int *send_rows, const int *send_at, int width) {
    const size_t row = (size_t)width * sizeof(real);
    const double w0 = L->ep->wait_s;
    L->ep->alltoallv_rows_start(L->ep, L->be, slot, recv, recv_rows, recv_at, send, send_rows,
                                send_at, row);
    L->exchange_s += L->ep->wait_s - w0;
    for (int j = 0; j < L->ep_size; j++) L->sent_bytes[j] += (long)send_rows[j] * (long)row;
}

static void wait_rows(moe_layer *L, int slot) {
    const double w0 = L->ep->wait_s;
    L->ep->alltoallv_rows_wait(L->ep, L->be, slot);
    L->exchange_s += L->ep->wait_s - w0;
}

// Chunk c's blocks, per rank (c * R): to the experts (the dispatch's blocks) or back (the
// combine's: the same for rows).
static void start_out(moe_layer *L, int slot, real *recv, const real *send, int c, int width) {
    const int at = c * L->ep_size;
    start_rows(L, slot, recv, L->exp_rows + at, L->exp_at + at, send, L->tok_rows + at,
               L->tok_at + at, width);
}
static void start_back(moe_layer *L, int slot, real *recv, const real *send, int c, int width) {
    const int at = c * L->ep_size;
    start_rows(L, slot, recv, L->tokb_rows + at, L->tokb_at + at, send, L->expb_rows + at,
               L->expb_at + at, width);
}

// The first packet (row) of chunk c's blocks on the experts' side, and their count.
static int chunk_block(const int *at, const int *rows, int c, int R, int *n) {
    *n = 0;
    for (int i = 0; i < R; i++) *n += rows[c * R + i];
    return at[c * R];
}

// The experts' lap, also counted as this layer's (experts_s: the hot-expert estimate).
static void lap_experts(moe_layer *L) {
    if (!L->timer) return;
    const double before = L->timer->s[MOE_T_EXPERTS];
    moe_lap(L->timer, MOE_T_EXPERTS);
    L->experts_s += L->timer->s[MOE_T_EXPERTS] - before;
}

// The work on one chunk's rows: experts [e0, e1) (local) from their rows in `in` to `out`.
typedef void (*chunk_work)(moe_layer *L, int e0, int e1, const void *ctx);

// The exchange "rows", pipelined: chunk c's rows travel from `send` (the tokens' order) to the
// experts (slot c) while chunk c-1 is computed; once they arrive they are regrouped by local
// expert into `in`, `work` computes them into `out`, and they go back (slot C + c) into `back`
// (the tokens' order), through `stage` (the chunk layout, [Ne, d]), beside the next chunk. The
// laps: waiting and regrouping count as `lap_before`, the return as `lap_after`.
static void exchange_pipelined(moe_layer *L, real *back, real *stage, const real *send, real *in,
                               const real *out, chunk_work work, const void *ctx, int lap_before,
                               int lap_after) {
    moe_backend *be = L->be;
    const int C = L->chunks, R = L->ep_size, d = L->cfg.d_model;
    start_out(L, 0, stage, send, 0, d);
    for (int c = 0; c < C; c++) {
        const int e0 = L->chunk_expert[c], e1 = L->chunk_expert[c + 1];
        wait_rows(L, c);
        if (c + 1 < C) start_out(L, c + 1, stage, send, c + 1, d);
        be->moe_copy_chunks(be, in, stage, L->to_expert + e0 * R, (e1 - e0) * R, d);
        moe_lap(L->timer, lap_before);
        work(L, e0, e1, ctx);
        lap_experts(L);
        be->moe_copy_chunks(be, stage, out, L->to_source + e0 * R, (e1 - e0) * R, d);
        start_back(L, C + c, back, stage, c, d);
        moe_lap(L->timer, lap_after);
    }
    for (int c = 0; c < C; c++) wait_rows(L, C + c);
    moe_lap(L->timer, lap_after);
}

// The plan's indexes to the device (what the gathers and sums below read).
static void upload_packets(moe_layer *L, int T) {
    moe_backend *be = L->be;
    const size_t I = sizeof(int), k = L->cfg.top_k;
    be->copy_to_device(be, L->d_pk_token, L->pk_token, (size_t)L->pk_sent * I);
    be->copy_to_device(be, L->d_pk_home, L->pk_home, (size_t)T * L->ep_size * I);
    be->copy_to_device(be, L->d_pk_expand, L->pk_expand, (size_t)L->expert_rows * I);
    be->copy_to_device(be, L->d_pk_assign, L->pk_assign, (size_t)L->pk_received * k * I);
    be->copy_to_device(be, L->d_pk_assign_b, L->pk_assign_b, (size_t)L->pk_received * k * I);
    be->copy_to_device(be, L->d_pk_perm_b, L->pk_perm_b, (size_t)L->pk_received * I);
}

// The dropless memory plan (max_expert_rows below rows_bound: a cap): the rows the local
// experts would compute (and, dedup, the packets received: packets <= rows' buffers too)
// against the cap, once the plan is known and before any row moves. Under expert parallelism
// every rank of the group learns every rank's figures (one all-reduce of 3 R longs), so all
// stop together, naming the same rank: its rows and its hottest expert (global index).
static moe_status check_row_cap(moe_layer *L, int packets) {
    if (L->max_expert_rows >= L->rows_bound) return MOE_OK; // no cap: buffers for any routing
    const int R = L->ep_size, me = L->ep ? L->ep->rank : 0;
    long *fig = calloc((size_t)3 * R, sizeof *fig);
    if (!fig) return moe_error(MOE_ENOMEM, "moe: out of host memory");
    long *f = fig + 3 * me;
    const int rows = L->expert_rows > packets ? L->expert_rows : packets;
    f[0] = rows, f[1] = L->expert0, f[2] = -1;
    for (int e = 0; e < L->E_local; e++) {
        const int n = L->expert_offsets[e + 1] - L->expert_offsets[e];
        if (n > f[2]) f[1] = L->expert0 + e, f[2] = n;
    }
    if (L->ep) L->ep->allreduce_sum_long(L->ep, fig, (size_t)3 * R);
    moe_status st = MOE_OK;
    for (int r = 0; r < R && !st; r++)
        if (fig[3 * r] > L->max_expert_rows)
            st = moe_error(MOE_EINVAL,
                           "dropless row cap: rank %d's experts would compute %ld rows "
                           "(the hottest: expert %ld, %ld rows), above the cap of %d rows "
                           "(model.dropless_max_rows; the worst routing needs %d)",
                           r, fig[3 * r], fig[3 * r + 1], fig[3 * r + 2], L->max_expert_rows,
                           L->rows_bound);
    free(fig);
    return st;
}

// Dedup dispatch, before the rows move: the plan, and the packets gathered by token in the
// dispatch order (rows into xp, combine weights into w_send).
static moe_status dispatch_packets(moe_layer *L, const real *inp, int T) {
    moe_backend *be = L->be;
    const int d = L->cfg.d_model, k = L->cfg.top_k;
    moe_packets_plan(L, T);
    moe_status st = check_row_cap(L, L->pk_received);
    if (st) return st;
    upload_packets(L, T);
    be->moe_permute(be, L->xp, inp, L->d_pk_token, L->pk_sent, d);
    be->moe_permute(be, L->w_send, L->weights, L->d_pk_token, L->pk_sent, k);
    L->received_rows += L->expert_rows;
    return MOE_OK;
}

// bf16 on one rank: the expert rows are rounded as they are gathered (dispatch) and their
// gradient as combine's backward writes it; under expert parallelism the rows travel in fp32
// and are rounded at the experts.
static int bf16_rows_direct(const moe_layer *L) { return L->cfg.dtype == MOE_DTYPE_BF16 && !L->ep; }

// Dispatch: xp = the kept rows in expert order (rows for expert e contiguous), the rows this
// rank sends. One rank: the experts read xp itself (bf16: xe16, gathered and rounded in one
// pass). Expert parallelism: each rank's rows go to the rank holding their experts, and are
// regrouped by local expert there (xe).
static moe_status dispatch(moe_layer *L, const real *inp, const int *offsets, int T) {
    moe_backend *be = L->be;
    const int E = L->cfg.n_experts, d = L->cfg.d_model;
    if (dedup_exchange(L)) return dispatch_packets(L, inp, T);
    if (!L->ep) {
        L->expert_offsets = offsets, L->expert_rows = offsets[E];
        moe_status st = check_row_cap(L, 0);
        if (st) return st;
    }
    if (bf16_rows_direct(L))
        be->moe_permute_bf16(be, L->xe16, inp, L->row_token, offsets[E], d);
    else
        be->moe_permute(be, L->xp, inp, L->row_token, offsets[E], d);
    if (!L->ep) return MOE_OK;
    moe_rows_plan(L, offsets); // the rows travel with the experts' work (experts_exchanged)
    moe_status st = check_row_cap(L, 0);
    if (st) return st;
    L->received_rows += L->expert_rows;
    return MOE_OK;
}

// Local experts [e0, e1) and their rows [r0, r0 + N) (offsets: the grouped GEMMs' view,
// absolute rows); their weights start at expert e0 (w13: e0 2ff d reals in, w2: e0 d ff).
typedef struct {
    const int *offsets;
    int E, N;
    size_t r0, w13, w2;
} expert_range;

static expert_range range_of(const moe_layer *L, int e0, int e1) {
    const size_t d = L->cfg.d_model, ff = L->cfg.d_ff, r0 = (size_t)L->expert_offsets[e0];
    return (expert_range){.offsets = L->expert_offsets + e0,
                          .E = e1 - e0,
                          .N = L->expert_offsets[e1] - (int)r0,
                          .r0 = r0,
                          .w13 = (size_t)e0 * 2 * ff * d,
                          .w2 = (size_t)e0 * d * ff};
}

// Experts [e0, e1): [h1 h3] = xe w13^T, act = silu(h1) h3, ye = act w2^T, grouped by local
// expert, from the kept input rows (bf16: xe16, rounded by the caller). What recompute runs
// again. The calls per expert are the same whatever the range (one GEMM over its rows).
static void experts_from_rows(moe_layer *L, const moe_weights *w, int e0, int e1) {
    moe_backend *be = L->be;
    const int d = L->cfg.d_model, ff = L->cfg.d_ff;
    const expert_range x = range_of(L, e0, e1);
    if (L->cfg.dtype == MOE_DTYPE_BF16) {
        // h13_16: the backward's; h13 scratch
        be->expert_swiglu_forward_bf16(be, L->act16, L->h13_16, L->h13, L->xe16, w->w13_16 + x.w13,
                                       x.offsets, x.E, ff, d);
        be->expert_matmul_forward_bf16(be, L->ye_local, L->act16, w->w2_16 + x.w2, x.offsets, x.E,
                                       d, ff);
        return;
    }
    be->expert_swiglu_forward(be, L->act, L->h13, L->xe, w->w13 + x.w13, x.offsets, x.E, ff, d);
    be->expert_matmul_forward(be, L->ye_local, L->act, w->w2 + x.w2, x.offsets, x.E, d, ff);
}

// The experts' forward on experts [e0, e1): bf16 rounds the input rows once (kept in xe16
// for the backward).
static void experts(moe_layer *L, int e0, int e1, const void *weights) {
    const moe_weights *w = weights;
    if (L->cfg.dtype == MOE_DTYPE_BF16 && !bf16_rows_direct(L)) {
        const expert_range x = range_of(L, e0, e1);
        const size_t d = L->cfg.d_model;
        L->be->to_bf16(L->be, L->xe16 + x.r0 * d, L->xe + x.r0 * d, (size_t)x.N * d);
    }
    experts_from_rows(L, w, e0, e1);
}

// The exchange "rows" and the experts, pipelined: xp goes to the experts through xr, their
// results come back into ye.
static int rows_exchange(const moe_layer *L) { return L->ep && !dedup_exchange(L); }

static void experts_exchanged(moe_layer *L, const moe_weights *w) {
    exchange_pipelined(L, L->ye, L->xr, L->xp, L->xe, L->ye_local, experts, w, MOE_T_DISPATCH,
                       MOE_T_COMBINE);
}

// The dedup exchange and the experts, pipelined by chunk c: the packets whose first expert is
// in chunk c arrive (rows into xr, weights into w_recv, the dispatch order) while chunk c-1
// computes; chunk c's expert rows are copied out of them (xe) and computed; then each packet
// whose last expert is in chunk c is summed, part[q] = sum_{slots j} w[q,j] ye[row(q,j)] (the
// combine order), and its row goes back (into ye) beside the next chunk. With several
// chunks the sums go to the backward scratch's dstage (xr still receives); with one, to xr.
static void experts_packets(moe_layer *L, const moe_weights *w) {
    moe_backend *be = L->be;
    const int C = L->chunks, R = L->ep_size, d = L->cfg.d_model, k = L->cfg.top_k;
    real *parts = C > 1 ? L->bwd->dstage : L->xr;
    start_out(L, 0, L->xr, L->xp, 0, d);
    start_out(L, C, L->w_recv, L->w_send, 0, k);
    for (int c = 0; c < C; c++) {
        const int e0 = L->chunk_expert[c], e1 = L->chunk_expert[c + 1];
        wait_rows(L, c), wait_rows(L, C + c);
        if (c + 1 < C) {
            start_out(L, c + 1, L->xr, L->xp, c + 1, d);
            start_out(L, C + c + 1, L->w_recv, L->w_send, c + 1, k);
        }
        const int r0 = L->expert_offsets[e0], n = L->expert_offsets[e1] - r0;
        be->moe_permute(be, L->xe + (size_t)r0 * d, L->xr, L->d_pk_expand + r0, n, d);
        moe_lap(L->timer, MOE_T_DISPATCH);
        experts(L, e0, e1, w);
        lap_experts(L);
        int nq;
        const int q0 = chunk_block(L->expb_at, L->expb_rows, c, R, &nq);
        be->moe_permute(be, L->w_recv_b + (size_t)q0 * k, L->w_recv, L->d_pk_perm_b + q0, nq, k);
        be->moe_combine_forward(be, parts + (size_t)q0 * d, L->ye_local,
                                L->w_recv_b + (size_t)q0 * k, L->d_pk_assign_b + (size_t)q0 * k, nq,
                                k, d);
        start_back(L, 2 * C + c, L->ye, parts, c, d);
        moe_lap(L->timer, MOE_T_COMBINE);
    }
    for (int c = 0; c < C; c++) wait_rows(L, 2 * C + c);
    moe_lap(L->timer, MOE_T_COMBINE);
}

// Combine: out[t] = sum_j weights[t,j] ye[row(t,j)], on the token's own rank: under expert
// parallelism the results travelled back first (experts_exchanged); the combine weights
// never travel.
static void combine(moe_layer *L, real *out, int T) {
    moe_backend *be = L->be;
    const moe_config *c = &L->cfg;
    if (dedup_exchange(L)) { // the token's rank adds its packets: out[t] = sum_r part[(t, r)]
        be->zero(be, out, (size_t)T * c->d_model * sizeof(real));
        be->moe_unpermute_add(be, out, L->ye, L->d_pk_home, T, L->ep_size, c->d_model);
        return;
    }
    be->moe_combine_forward(be, out, L->ye, L->weights, L->assign_row, T, c->top_k, c->d_model);
}

// Host-side statistics of the forward from the readback.
static void read_stats(moe_layer *L, int T, int capacity) {
    const int E = L->cfg.n_experts;
    const int *offsets = L->host_counts + E;
    const real *loss = L->host_losses;
    for (int e = 0; e < E; e++) L->host_kept[e] = offsets[e + 1] - offsets[e];
    moe_stats_from_counts(&L->stats, L->host_counts, L->host_kept, E, T, capacity);
    L->stats.aux = loss[MOE_LOSS_AUX];
    L->stats.z = loss[MOE_LOSS_Z];
    L->stats.entropy = loss[MOE_LOSS_ENTROPY];
    L->stats.seq_aux = loss[MOE_LOSS_SEQ_AUX];
    L->stats.logit_mean = loss[MOE_LOSS_LOGIT_MEAN];
    L->stats.logit_std = loss[MOE_LOSS_LOGIT_STD];
    L->stats.logit_max_abs = loss[MOE_LOSS_LOGIT_MAX_ABS];
    L->stats.lse_mean = loss[MOE_LOSS_LSE_MEAN];
}

moe_status moe_layer_forward(moe_layer *L, real *out, const real *inp, const moe_weights *w, int T,
                             int seq_len, moe_pass pass, moe_stats *stats) {
    moe_status st = check_call(L, out, inp, w, T);
    if (st) return st;
    if (seq_len <= 0) seq_len = T;
    if (T % seq_len)
        return moe_error(MOE_EINVAL, "moe: T=%d tokens are not whole sequences of %d", T, seq_len);
    if (pass.training && !isfinite(pass.capacity_factor))
        return moe_error(MOE_EINVAL, "moe: capacity_factor=%g must be finite",
                         pass.capacity_factor);
    // inference never drops
    const int capacity = pass.training ? moe_capacity(&L->cfg, T, pass.capacity_factor) : 0;
    L->jittered = pass.training && L->cfg.jitter_eps > 0;
    route(L, inp, w, T, seq_len, capacity);
    moe_lap(L->timer, MOE_T_ROUTER);
    st = dispatch(L, inp, L->host_counts + L->cfg.n_experts, T); // the row offsets (host)
    if (st) return st;
    moe_lap(L->timer, MOE_T_DISPATCH);
    if (rows_exchange(L)) {
        experts_exchanged(L, w);
    } else if (dedup_exchange(L)) {
        experts_packets(L, w);
    } else {
        experts(L, 0, L->E_local, w);
        lap_experts(L);
    }
    combine(L, out, T);

    read_stats(L, T, capacity);
    moe_lap(L->timer, MOE_T_COMBINE);
    L->last_tokens = T;
    L->last_seq_len = seq_len;
    if (stats) *stats = L->stats;
    if (!isfinite(L->stats.aux) || !isfinite(L->stats.z) || !isfinite(L->stats.seq_aux))
        return moe_error(MOE_ENUMERIC, "moe: router loss is not finite (aux=%g, z=%g)",
                         L->stats.aux, L->stats.z);
    return MOE_OK;
}

// Combine backward: dye = w * dout (per kept row), dweights = dout . ye (bf16 on one rank:
// dye rounded into g16 as it is written, for the experts' backward GEMMs).
static void combine_backward(moe_layer *L, const real *dout, int T) {
    const moe_config *c = &L->cfg;
    if (bf16_rows_direct(L))
        L->be->moe_combine_backward_bf16(L->be, L->bwd->g16, L->dweights, dout, L->ye, L->weights,
                                         L->assign_row, T, c->top_k, c->d_model);
    else
        L->be->moe_combine_backward(L->be, L->dye, L->dweights, dout, L->ye, L->weights,
                                    L->assign_row, T, c->top_k, c->d_model);
}

// The experts' backward's weights and gradients (chunk_work's context).
typedef struct {
    const moe_weights *grads, *w;
} weights_pair;

// Experts backward on experts [e0, e1): ye = act w2^T, act = swiglu(h13), h13 = xe w13^T.
// With one rank dye_e is dye and dxe the rank's dxp. Each expert's weight gradient is one
// GEMM over all its rows, whatever the range.
static void experts_backward(moe_layer *L, int e0, int e1, const void *pair) {
    const moe_weights *grads = ((const weights_pair *)pair)->grads;
    const moe_weights *w = ((const weights_pair *)pair)->w;
    moe_backend *be = L->be;
    moe_backward_scratch *s = L->bwd;
    const int d = L->cfg.d_model, ff = L->cfg.d_ff;
    const expert_range x = range_of(L, e0, e1);
    const int *o = x.offsets, E = x.E;
    const size_t w13 = x.w13, w2 = x.w2;
    if (L->cfg.dtype == MOE_DTYPE_BF16) { // each output gradient rounded once, for two GEMMs
        if (!bf16_rows_direct(L))
            be->to_bf16(be, s->g16 + x.r0 * d, s->dye_e + x.r0 * d, (size_t)x.N * d);
        // dh13_16 in the fp32 dh13 (free in a bf16 backward), apart from dY in g16
        moe_bf16 *dh13_16 = (moe_bf16 *)s->dh13;
        be->expert_matmul_backward_weight_bf16(be, grads->w2 + w2, s->g16, L->act16, o, E, d, ff);
        be->expert_swiglu_backward_bf16(be, dh13_16, s->dact, s->g16, w->w2_16 + w2, L->h13_16, o,
                                        E, ff, d);
        be->expert_matmul_backward_weight_bf16(be, grads->w13 + w13, dh13_16, L->xe16, o, E, 2 * ff,
                                               d);
        be->expert_matmul_backward_input_bf16(be, s->dxe, dh13_16, w->w13_16 + w13, o, E, 2 * ff, d,
                                              0);
        return;
    }
    be->expert_matmul_backward_weight(be, grads->w2 + w2, s->dye_e, L->act, o, E, d, ff);
    be->expert_swiglu_backward(be, s->dh13, s->dact, s->dye_e, w->w2 + w2, L->h13, o, E, ff, d);
    be->expert_matmul_backward_weight(be, grads->w13 + w13, s->dh13, L->xe, o, E, 2 * ff, d);
    be->expert_matmul_backward_input(be, s->dxe, s->dh13, w->w13 + w13, o, E, 2 * ff, d, 0);
}

// The dedup backward, pipelined as the forward: dout goes out once per packet in the dispatch
// order's chunks (into dstage); chunk c's packets give their slots' dye = w dout and
// dweights = dout . ye (the combine backward), chunk c's experts run their backward, and each
// packet whose last expert is in chunk c sums its slots' dxe into one row (xr, free in the
// backward), which goes back with its dweights (w_recv_b) beside the next chunk. The token's
// rank adds them up: dinp[t] += sum_r dx[(t, r)], dweights[t] = sum_r dw[(t, r)] (each
// slot's is nonzero at one rank only).
static void backward_packets(moe_layer *L, real *dinp, const weights_pair *pair, const real *dout,
                             int T) {
    moe_backend *be = L->be;
    moe_backward_scratch *s = L->bwd;
    const int C = L->chunks, R = L->ep_size, d = L->cfg.d_model, k = L->cfg.top_k;
    be->moe_permute(be, s->dye, dout, L->d_pk_token, L->pk_sent, d);
    start_out(L, 0, s->dstage, s->dye, 0, d);
    for (int c = 0; c < C; c++) {
        wait_rows(L, c);
        if (c + 1 < C) start_out(L, c + 1, s->dstage, s->dye, c + 1, d);
        int np, nq;
        const int p0 = chunk_block(L->exp_at, L->exp_rows, c, R, &np);
        be->moe_combine_backward(
            be, s->dye_e, L->dw_recv + (size_t)p0 * k, s->dstage + (size_t)p0 * d, L->ye_local,
            L->w_recv + (size_t)p0 * k, L->d_pk_assign + (size_t)p0 * k, np, k, d);
        moe_lap(L->timer, MOE_T_COMBINE);
        experts_backward(L, L->chunk_expert[c], L->chunk_expert[c + 1], pair);
        lap_experts(L);
        const int q0 = chunk_block(L->expb_at, L->expb_rows, c, R, &nq);
        real *dx = L->xr + (size_t)q0 * d, *dw = L->w_recv_b + (size_t)q0 * k;
        be->zero(be, dx, (size_t)nq * d * sizeof(real));
        be->moe_unpermute_add(be, dx, s->dxe, L->d_pk_assign_b + (size_t)q0 * k, nq, k, d);
        be->moe_permute(be, dw, L->dw_recv, L->d_pk_perm_b + q0, nq, k);
        start_back(L, C + c, s->dxp, L->xr, c, d);
        start_back(L, 2 * C + c, L->dw_send, L->w_recv_b, c, k);
        moe_lap(L->timer, MOE_T_DISPATCH);
    }
    for (int c = C; c < 3 * C; c++) wait_rows(L, c);
    be->moe_unpermute_add(be, dinp, s->dxp, L->d_pk_home, T, R, d);
    be->zero(be, s->dweights, (size_t)T * k * sizeof(real));
    be->moe_unpermute_add(be, s->dweights, L->dw_send, L->d_pk_home, T, R, k);
}

// Dispatch backward: dinp[t] += sum_j dxp[row(t,j)] (under expert parallelism dxe came back
// to the tokens' ranks first, pipelined with the experts' backward).
static void dispatch_backward(moe_layer *L, real *dinp, int T) {
    const moe_config *c = &L->cfg;
    L->be->moe_unpermute_add(L->be, dinp, L->bwd->dxp, L->assign_row, T, c->top_k, c->d_model);
}

// Route backward: dlogits from the combine weights and the router losses, then the router
// GEMM: dgate += dlogits^T router_in, dinp += (dlogits gate) (* u when jittered).
static void route_backward(moe_layer *L, real *dinp, const moe_weights *grads, const real *inp,
                           const moe_weights *w, double dloss) {
    moe_backend *be = L->be;
    const moe_config *c = &L->cfg;
    moe_backward_scratch *s = L->bwd;
    const int T = L->last_tokens, E = c->n_experts, k = c->top_k, d = c->d_model;
    const moe_router_shape shape = {.T = T, .E = E, .k = k, .seq_len = L->last_seq_len};
    be->router_backward(be, s->dlogits, s->dweights, L->scores, L->probs, L->logits, L->lse,
                        L->topk_idx, L->weights, L->aux_tokens ? L->aux_counts : L->counts,
                        L->seq_counts, shape, router_hparams(L), (real)dloss);
    const real *router_in = L->jittered ? L->router_in : inp;
    // dgate += dlogits^T router_in; dx_r (+)= dlogits gate, straight into dinp without jitter
    real *dxr = L->jittered ? s->dxp : dinp; // dxp is free again
    const real beta = L->jittered ? 0 : 1;
    if (c->dtype == MOE_DTYPE_BF16) {
        be->to_bf16(be, s->g16, s->dlogits, (size_t)T * E);
        be->matmul_bf16(be, grads->gate, s->g16, L->router_in16, E, d, T, 1, 0, 1);
        be->matmul_bf16(be, dxr, s->g16, w->gate16, T, d, E, 0, 0, beta);
    } else {
        be->matmul(be, grads->gate, s->dlogits, router_in, E, d, T, 1, 0, 1);
        be->matmul(be, dxr, s->dlogits, w->gate, T, d, E, 0, 0, beta);
    }
    if (L->jittered) { // x_r = inp * u: dinp += dx_r * u
        const real *u = L->jitter_override ? L->jitter_override : L->jitter;
        be->mul(be, dinp, s->dxp, u, (size_t)T * d, 1);
    }
}

moe_status moe_layer_backward(moe_layer *L, real *dinp, const moe_weights *grads, const real *dout,
                              const real *inp, const moe_weights *w, double dloss) {
    moe_status st = check_call(L, dinp, dout, w, L->last_tokens);
    if (st) return st;
    if (!inp || !grads || !grads->gate || !grads->w13 || !grads->w2)
        return moe_error(MOE_EINVAL, "moe: NULL tensor argument to backward");
    if (!isfinite(dloss)) return moe_error(MOE_EINVAL, "moe: dloss=%g must be finite", dloss);
    if (!L->bwd) return moe_error(MOE_EINVAL, "moe: the layer was created forward-only");
    const int T = L->last_tokens, dedup = dedup_exchange(L);
    if (L->recompute) { // h13, act, ye_local again from the kept rows (another layer's since)
        experts_from_rows(L, w, 0, L->E_local);
        lap_experts(L);
    }
    const weights_pair pair = {.grads = grads, .w = w};
    moe_backward_scratch *s = L->bwd;
    if (dedup) { // the combine's and the dispatch's backward around the experts', pipelined
        backward_packets(L, dinp, &pair, dout, T);
    } else {
        combine_backward(L, dout, T);
        moe_lap(L->timer, MOE_T_COMBINE);
        if (rows_exchange(L)) { // dye to the experts, dxe back, pipelined as in the forward
            exchange_pipelined(L, s->dxp, s->dstage, s->dye, s->dye_e, s->dxe, experts_backward,
                               &pair, MOE_T_COMBINE, MOE_T_DISPATCH);
        } else {
            experts_backward(L, 0, L->E_local, &pair);
            lap_experts(L);
        }
        dispatch_backward(L, dinp, T);
    }
    moe_lap(L->timer, MOE_T_DISPATCH);
    route_backward(L, dinp, grads, inp, w, dloss);
    moe_lap(L->timer, MOE_T_ROUTER);
    return MOE_OK;
}
