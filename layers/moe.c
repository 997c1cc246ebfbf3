// The MoE layer: orchestration of the kernels in layers/backend.h (see moe.h).
#include "layers/moe.h"

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
    };
    return c;
}

moe_status moe_config_check(const moe_config *cfg) {
    if (!cfg) return moe_error(MOE_EINVAL, "moe: config is NULL");
    if (cfg->d_model < 1) return moe_error(MOE_EINVAL, "moe: d_model=%d must be >= 1", cfg->d_model);
    if (cfg->d_ff < 1) return moe_error(MOE_EINVAL, "moe: d_ff=%d must be >= 1", cfg->d_ff);
    if (cfg->n_experts < 1)
        return moe_error(MOE_EINVAL, "moe: n_experts=%d must be >= 1", cfg->n_experts);
    if (cfg->top_k < 1 || cfg->top_k > cfg->n_experts)
        return moe_error(MOE_EINVAL, "moe: top_k=%d must be in [1, n_experts=%d]", cfg->top_k,
                         cfg->n_experts);
    if (cfg->norm_topk_prob != 0 && cfg->norm_topk_prob != 1)
        return moe_error(MOE_EINVAL, "moe: norm_topk_prob=%d must be 0 or 1", cfg->norm_topk_prob);
    if (!isfinite(cfg->capacity_factor))
        return moe_error(MOE_EINVAL, "moe: capacity_factor=%g must be finite", cfg->capacity_factor);
    if (cfg->drop_policy != MOE_DROP_PROBS && cfg->drop_policy != MOE_DROP_POSITION)
        return moe_error(MOE_EINVAL, "moe: drop_policy=%d is neither probs nor position",
                         (int)cfg->drop_policy);
    if (!isfinite(cfg->aux_coef) || cfg->aux_coef < 0)
        return moe_error(MOE_EINVAL, "moe: aux_coef=%g must be finite and >= 0", cfg->aux_coef);
    if (!isfinite(cfg->z_coef) || cfg->z_coef < 0)
        return moe_error(MOE_EINVAL, "moe: z_coef=%g must be finite and >= 0", cfg->z_coef);
    if (cfg->scoring != MOE_SCORE_SOFTMAX && cfg->scoring != MOE_SCORE_SIGMOID)
        return moe_error(MOE_EINVAL, "moe: scoring=%d is neither softmax nor sigmoid", (int)cfg->scoring);
    if (!isfinite(cfg->route_scale) || !(cfg->route_scale > 0))
        return moe_error(MOE_EINVAL, "moe: route_scale=%g must be finite and > 0", cfg->route_scale);
    if (!isfinite(cfg->seq_aux_coef) || cfg->seq_aux_coef < 0)
        return moe_error(MOE_EINVAL, "moe: seq_aux_coef=%g must be finite and >= 0", cfg->seq_aux_coef);
    if (!(cfg->jitter_eps >= 0 && cfg->jitter_eps < 1))
        return moe_error(MOE_EINVAL, "moe: jitter_eps=%g must be in [0, 1)", cfg->jitter_eps);
    return MOE_OK;
}

int moe_capacity(const moe_config *cfg, int T) {
    if (cfg->capacity_factor <= 0) return 0;
    double c = ceil(((double)T * cfg->top_k / cfg->n_experts) * cfg->capacity_factor);
    // A capacity of at least T keeps everything: every token sends at most one assignment
    // to an expert. Clamp so huge factors cannot overflow an int.
    return c >= T ? T : (int)c;
}

size_t moe_weights_count(const moe_config *cfg) {
    size_t E = cfg->n_experts, d = cfg->d_model, ff = cfg->d_ff;
    return E * d + 3 * E * ff * d; // gate + w13 + w2
}

void moe_weights_view(moe_weights *w, real *buf, const moe_config *cfg) {
    size_t E = cfg->n_experts, d = cfg->d_model, ff = cfg->d_ff;
    w->gate = buf;
    w->w13 = w->gate + E * d;
    w->w2 = w->w13 + E * 2 * ff * d;
    w->bias = NULL; // not a parameter: the caller points it at a bias if it uses one
}

// ---- allocation ----------------------------------------------------------------

typedef struct {
    void **ptr;
    size_t bytes;
} buffer_spec;

moe_status moe_layer_init(moe_layer *L, moe_backend *be, const moe_config *cfg,
                          int max_tokens) {
    memset(L, 0, sizeof *L);
    if (!be) return moe_error(MOE_EINVAL, "moe: backend is NULL");
    moe_status st = moe_config_check(cfg);
    if (st) return st;
    if (max_tokens < 1) return moe_error(MOE_EINVAL, "moe: max_tokens=%d must be >= 1", max_tokens);
    const size_t T = max_tokens, E = cfg->n_experts, k = cfg->top_k, d = cfg->d_model,
                 ff = cfg->d_ff, N = T * k;
    if (N * (d > ff ? d : ff) > INT32_MAX)
        return moe_error(MOE_EINVAL, "moe: max_tokens*top_k*max(d_model,d_ff) = %zu exceeds 2^31-1",
                         N * (d > ff ? d : ff));
    L->cfg = *cfg;
    L->be = be;
    L->max_tokens = max_tokens;

    const size_t R = sizeof(real), I = sizeof(int);
    buffer_spec specs[] = {
        {(void **)&L->logits, T * E * R},   {(void **)&L->probs, T * E * R},
        {(void **)&L->scores, T * E * R},   {(void **)&L->seq_counts, T * E * I},
        {(void **)&L->jitter, T * d * R},   {(void **)&L->router_in, T * d * R},
        {(void **)&L->lse, T * R},          {(void **)&L->topk_idx, T * k * I},
        {(void **)&L->weights, T * k * R},  {(void **)&L->keep, T * k * I},
        {(void **)&L->assign_row, N * I},   {(void **)&L->row_token, N * I},
        {(void **)&L->scratch, 2 * N * I},  {(void **)&L->counts, (2 * E + 1) * I},
        {(void **)&L->xp, N * d * R},       {(void **)&L->h13, 2 * N * ff * R},
        {(void **)&L->act, N * ff * R},
        {(void **)&L->ye, N * d * R},       {(void **)&L->losses, 8 * R},
        {(void **)&L->dlogits, T * E * R},  {(void **)&L->dweights, T * k * R},
        {(void **)&L->dye, N * d * R},      {(void **)&L->dact, N * ff * R},
        {(void **)&L->dh13, 2 * N * ff * R},
        {(void **)&L->dxp, N * d * R},
    };
    for (size_t i = 0; i < sizeof specs / sizeof specs[0]; i++) {
        *specs[i].ptr = be->alloc(be, specs[i].bytes);
        L->bytes += specs[i].bytes;
        if (!*specs[i].ptr) {
            moe_layer_free(L);
            return moe_error(MOE_ENOMEM, "moe: cannot allocate %zu bytes of activations on %s",
                             specs[i].bytes, be->name);
        }
    }
    L->host_counts = calloc(2 * E + 1, I);
    L->host_kept = calloc(E, I);
    if (!L->host_counts || !L->host_kept) {
        moe_layer_free(L);
        return moe_error(MOE_ENOMEM, "moe: cannot allocate host counts");
    }
    return MOE_OK;
}

void moe_layer_free(moe_layer *L) {
    if (L->be) {
        void *bufs[] = {L->logits, L->probs,  L->scores, L->seq_counts, L->jitter, L->router_in, L->lse,      L->topk_idx, L->weights, L->keep,
                        L->assign_row, L->row_token, L->scratch, L->counts, L->xp, L->h13,
                        L->act,    L->ye,     L->losses,   L->dlogits,  L->dweights, L->dye,
                        L->dact,   L->dh13,   L->dxp};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) L->be->free(L->be, bufs[i]);
    }
    free(L->host_counts);
    free(L->host_kept);
    memset(L, 0, sizeof *L);
}

// ---- forward / backward ----------------------------------------------------------

static moe_status check_call(const moe_layer *L, const void *a, const void *b,
                             const moe_weights *w, int T) {
    if (!L->be) return moe_error(MOE_EINVAL, "moe: layer is not initialised");
    if (!a || !b || !w || !w->gate || !w->w13 || !w->w2)
        return moe_error(MOE_EINVAL, "moe: NULL tensor argument");
    if (T < 1 || T > L->max_tokens)
        return moe_error(MOE_EINVAL, "moe: T=%d tokens outside [1, max_tokens=%d]", T,
                         L->max_tokens);
    return MOE_OK;
}

moe_status moe_layer_forward(moe_layer *L, real *out, const real *inp, const moe_weights *w,
                             int T, int seq_len, int training, moe_stats *stats) {
    moe_status st = check_call(L, out, inp, w, T);
    if (st) return st;
    if (seq_len <= 0) seq_len = T;
    if (T % seq_len)
        return moe_error(MOE_EINVAL, "moe: T=%d tokens are not whole sequences of %d", T, seq_len);
    moe_backend *be = L->be;
    const moe_config *c = &L->cfg;
    const int E = c->n_experts, k = c->top_k, d = c->d_model, ff = c->d_ff;
    const int capacity = training ? moe_capacity(c, T) : 0; // inference never drops
    int *offsets = L->counts + E;

    // router input: x, or x * u with u ~ U(1-eps, 1+eps) (training only)
    const real *router_in = inp;
    L->jittered = training && c->jitter_eps > 0;
    if (L->jittered) {
        const real *u = L->jitter_override ? L->jitter_override : L->jitter;
        if (!L->jitter_override)
            be->uniform_noise(be, L->jitter, (size_t)T * d, L->noise_key, (real)(1 - c->jitter_eps),
                              (real)(1 + c->jitter_eps));
        be->mul(be, L->router_in, inp, u, (size_t)T * d, 0);
        router_in = L->router_in;
    }
    // router: logits [T,E] = router_in [T,d] @ gate [E,d]^T, scores, top-k
    be->matmul(be, L->logits, router_in, w->gate, T, E, d, 0, 1, 0);
    be->router_topk(be, L->scores, L->probs, L->lse, L->topk_idx, L->weights, L->logits, w->bias, T,
                    E, k, c->scoring, c->norm_topk_prob, (real)c->route_scale);
    be->moe_dispatch_counts(be, L->counts, L->topk_idx, T, k, E);
    if (c->seq_aux_coef > 0) be->moe_seq_counts(be, L->seq_counts, L->topk_idx, T, k, E, seq_len);
    be->moe_capacity_keep(be, L->keep, L->scratch, L->topk_idx, L->weights, L->counts, T, k, E,
                          capacity, c->drop_policy);
    be->moe_permute_index(be, offsets, L->assign_row, L->row_token, L->topk_idx, L->keep, T, k, E);
    // the one device-to-host copy: routed counts and row offsets (grouped GEMM shapes)
    be->copy_to_host(be, L->host_counts, L->counts, (size_t)(2 * E + 1) * sizeof(int));
    const int *host_offsets = L->host_counts + E;
    const int N = host_offsets[E];

    // experts: [h1 h3] = xp w13^T, act = silu(h1) h3, ye = act w2^T
    be->moe_permute(be, L->xp, inp, L->row_token, N, d);
    be->expert_matmul_forward(be, L->h13, L->xp, w->w13, host_offsets, E, 2 * ff, d);
    be->swiglu_forward(be, L->act, L->h13, N, ff);
    be->expert_matmul_forward(be, L->ye, L->act, w->w2, host_offsets, E, d, ff);
    be->moe_combine_forward(be, out, L->ye, L->weights, L->assign_row, T, k, d);

    real losses[8];
    be->router_losses(be, L->losses, L->probs, L->logits, L->lse, L->counts, L->seq_counts, T, E, k,
                      seq_len, (real)c->aux_coef, (real)c->seq_aux_coef, (real)c->z_coef);
    be->copy_to_host(be, losses, L->losses, sizeof losses);

    for (int e = 0; e < E; e++) L->host_kept[e] = host_offsets[e + 1] - host_offsets[e];
    moe_stats_from_counts(&L->stats, L->host_counts, L->host_kept, E, T, capacity);
    L->stats.aux = losses[0];
    L->stats.z = losses[1];
    L->stats.entropy = losses[2];
    L->stats.seq_aux = losses[3];
    L->stats.logit_mean = losses[4];
    L->stats.logit_std = losses[5];
    L->stats.logit_max_abs = losses[6];
    L->stats.lse_mean = losses[7];
    L->last_tokens = T;
    L->last_seq_len = seq_len;
    if (stats) *stats = L->stats;
    if (!isfinite(L->stats.aux) || !isfinite(L->stats.z) || !isfinite(L->stats.seq_aux))
        return moe_error(MOE_ENUMERIC, "moe: router loss is not finite (aux=%g, z=%g)",
                         L->stats.aux, L->stats.z);
    return MOE_OK;
}

moe_status moe_layer_backward(moe_layer *L, real *dinp, const moe_weights *grads,
                              const real *dout, const real *inp, const moe_weights *w,
                              double dloss) {
    moe_status st = check_call(L, dinp, dout, w, L->last_tokens);
    if (st) return st;
    if (!inp || !grads || !grads->gate || !grads->w13 || !grads->w2)
        return moe_error(MOE_EINVAL, "moe: NULL tensor argument to backward");
    if (!isfinite(dloss)) return moe_error(MOE_EINVAL, "moe: dloss=%g must be finite", dloss);
    moe_backend *be = L->be;
    const moe_config *c = &L->cfg;
    const int T = L->last_tokens, E = c->n_experts, k = c->top_k, d = c->d_model, ff = c->d_ff;
    const int *host_offsets = L->host_counts + E;
    const int N = host_offsets[E];

    // combine: dye = w * dout (per kept row), dweights = dout . ye
    be->moe_combine_backward(be, L->dye, L->dweights, dout, L->ye, L->weights, L->assign_row, T, k,
                             d);
    // w2: ye = act w2^T
    be->expert_matmul_backward_weight(be, grads->w2, L->dye, L->act, host_offsets, E, d, ff);
    be->expert_matmul_backward_input(be, L->dact, L->dye, w->w2, host_offsets, E, d, ff, 0);
    be->swiglu_backward(be, L->dh13, L->dact, L->h13, N, ff);
    // w13: h13 = xp w13^T
    be->expert_matmul_backward_weight(be, grads->w13, L->dh13, L->xp, host_offsets, E, 2 * ff, d);
    be->expert_matmul_backward_input(be, L->dxp, L->dh13, w->w13, host_offsets, E, 2 * ff, d, 0);
    be->moe_unpermute_add(be, dinp, L->dxp, L->assign_row, T, k, d);

    // router: dlogits from the combine weights and the losses; then the logits GEMM
    be->router_backward(be, L->dlogits, L->dweights, L->scores, L->probs, L->logits, L->lse,
                        L->topk_idx, L->weights, L->counts, L->seq_counts, T, E, k,
                        L->last_seq_len, c->scoring, c->norm_topk_prob, (real)c->route_scale,
                        (real)c->aux_coef, (real)c->seq_aux_coef, (real)c->z_coef, (real)dloss);
    const real *router_in = L->jittered ? L->router_in : inp;
    be->matmul(be, grads->gate, L->dlogits, router_in, E, d, T, 1, 0, 1); // dgate += dlogits^T x_r
    if (L->jittered) { // x_r = inp * u: dinp += (dlogits gate) * u
        const real *u = L->jitter_override ? L->jitter_override : L->jitter;
        be->matmul(be, L->dxp, L->dlogits, w->gate, T, d, E, 0, 0, 0); // dxp is free again
        be->mul(be, dinp, L->dxp, u, (size_t)T * d, 1);
    } else {
        be->matmul(be, dinp, L->dlogits, w->gate, T, d, E, 0, 0, 1); // dinp += dlogits gate
    }
    return MOE_OK;
}
