// The Mixtral-style decoder: parameter layout, initialisation, forward, backward.
// Orchestration only: every loop over floats is a backend kernel (see model.h).
#include "layers/model.h"

#include "layers/timing.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

moe_status moe_model_config_check(const moe_model_config *c) {
    if (c->vocab_size < 2)
        return moe_error(MOE_EINVAL, "model: vocab_size=%d must be >= 2", c->vocab_size);
    if (c->n_layers < 1)
        return moe_error(MOE_EINVAL, "model: n_layers=%d must be >= 1", c->n_layers);
    if (c->n_heads < 1 || c->head_dim < 0 || (c->head_dim == 0 && c->d_model % c->n_heads))
        return moe_error(MOE_EINVAL,
                         "model: d_model=%d is not a multiple of n_heads=%d (and head_dim=%d "
                         "does not say the head size)",
                         c->d_model, c->n_heads, c->head_dim);
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads)
        return moe_error(MOE_EINVAL, "model: n_heads=%d is not a multiple of n_kv_heads=%d",
                         c->n_heads, c->n_kv_heads);
    if (moe_model_head_dim(c) % 2)
        return moe_error(MOE_EINVAL, "model: head_dim=%d must be even (RoPE pairs)",
                         moe_model_head_dim(c));
    if (c->max_seq_len < 1)
        return moe_error(MOE_EINVAL, "model: max_seq_len=%d must be >= 1", c->max_seq_len);
    if (!(c->rope_theta > 0) || !isfinite(c->rope_theta))
        return moe_error(MOE_EINVAL, "model: rope_theta=%g must be > 0", c->rope_theta);
    if (!(c->rms_norm_eps > 0) || !isfinite(c->rms_norm_eps))
        return moe_error(MOE_EINVAL, "model: rms_norm_eps=%g must be > 0", c->rms_norm_eps);
    if (c->moe.d_model != c->d_model)
        return moe_error(MOE_EINVAL, "model: moe.d_model=%d differs from d_model=%d",
                         c->moe.d_model, c->d_model);
    if (c->dtype != MOE_DTYPE_F32 && c->dtype != MOE_DTYPE_BF16)
        return moe_error(MOE_EINVAL, "model: dtype=%d is neither fp32 nor bf16", (int)c->dtype);
    moe_config mc = c->moe;
    mc.dtype = c->dtype; // (the layers' precision is the model's)
    return moe_config_check(&mc);
}

// ---- parameter layout -------------------------------------------------------------

// Where each view starts in the flat buffer, in reals (the layout without a buffer).
typedef struct {
    size_t embed, attn_norm, wqkv, wo, moe_norm, router, final_norm, lm_head, w13, w2;
} params_offsets;

// Consecutive regions, dense first and the weights of the El local experts of each layer
// last (El = E with one rank); returns the reals used, and *n_dense the size of the dense
// part.
static size_t params_layout(params_offsets *o, const moe_model_config *c, int El, size_t *n_dense) {
    const size_t V = c->vocab_size, d = c->d_model, L = c->n_layers, H = c->n_heads,
                 KV = c->n_kv_heads, hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd,
                 E = c->moe.n_experts, ff = c->moe.d_ff;
    size_t off = 0;
#define TAKE(field, n) (o->field = off, off += (n))
    TAKE(embed, V * d);
    TAKE(attn_norm, L * d);
    TAKE(wqkv, L * Q * d);
    TAKE(wo, L * d * H * hd);
    TAKE(moe_norm, L * d);
    TAKE(router, L * E * d);
    TAKE(final_norm, d);
    if (c->tie_embeddings)
        o->lm_head = o->embed;
    else
        TAKE(lm_head, V * d);
    if (n_dense) *n_dense = off;
    TAKE(w13, L * (size_t)El * 2 * ff * d);
    TAKE(w2, L * (size_t)El * d * ff);
#undef TAKE
    return off;
}

// Points the views at their regions of buf.
static void params_views(moe_model_params *p, real *buf, const moe_model_config *c, int El) {
    params_offsets o;
    params_layout(&o, c, El, NULL);
    *p = (moe_model_params){.embed = buf + o.embed,
                            .attn_norm = buf + o.attn_norm,
                            .wqkv = buf + o.wqkv,
                            .wo = buf + o.wo,
                            .moe_norm = buf + o.moe_norm,
                            .router = buf + o.router,
                            .final_norm = buf + o.final_norm,
                            .lm_head = buf + o.lm_head,
                            .w13 = buf + o.w13,
                            .w2 = buf + o.w2};
}

size_t moe_model_param_count(const moe_model_config *cfg) {
    params_offsets o;
    return params_layout(&o, cfg, cfg->moe.n_experts, NULL);
}

// Layer l's MoE weights (its El local experts); bias (the model's router_bias, or NULL for
// gradient views) [L, E].
static moe_weights layer_moe_weights(const moe_model_params *p, const moe_model_config *c, int El,
                                     int l, real *bias) {
    const size_t E = c->moe.n_experts, d = c->d_model, ff = c->moe.d_ff;
    moe_weights w = {
        .gate = p->router + l * E * d,
        .w13 = p->w13 + l * (size_t)El * 2 * ff * d,
        .w2 = p->w2 + l * (size_t)El * d * ff,
        .bias = bias ? bias + l * E : NULL,
    };
    return w;
}

// A parameter's bf16 copy: the same offset in params16.
static const moe_bf16 *shadow(const moe_model *m, const real *w) {
    return m->params16 + (w - m->params);
}

// base + off, or NULL for a buffer that this precision does not have (no arithmetic on NULL).
static moe_bf16 *at16(moe_bf16 *base, size_t off) { return base ? base + off : NULL; }

// Layer l's MoE weights in the model's precision (the bf16 copies too in bf16).
static moe_weights layer_weights(const moe_model *m, int l) {
    moe_weights w = layer_moe_weights(&m->p, &m->cfg, m->E_local, l, m->router_bias);
    if (m->params16)
        w.gate16 = shadow(m, w.gate), w.w13_16 = shadow(m, w.w13), w.w2_16 = shadow(m, w.w2);
    return w;
}

static void add_tensor(moe_model_tensor *tab, int *n, const char *name, size_t offset, int rows,
                       int cols, int layer, int is_norm, int expert) {
    moe_model_tensor *t = &tab[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = offset;
    t->rows = rows, t->cols = cols, t->layer = layer;
    t->is_norm = is_norm, t->is_expert = expert >= 0, t->expert = expert;
}

// Tensors of a model holding El experts per layer.
static int64_t tensor_count(const moe_model_config *c, int El) {
    return 3 - (c->tie_embeddings != 0) + (int64_t)c->n_layers * (7 + 3 * (int64_t)El);
}

int64_t moe_model_tensor_count(const moe_model_config *c) {
    return tensor_count(c, c->moe.n_experts);
}

// The tensor table in Hugging Face Mixtral names, in HF order: the experts in slots e0 ..
// e0+El-1 of each layer (tensor_count entries), named by their global index (slot_of: the
// slot of each global expert, NULL: the identity), listed by it.
static void build_tensor_table(moe_model_tensor *tab, const moe_model_config *c, int El, int e0,
                               const int *slot_of) {
    params_offsets o;
    params_layout(&o, c, El, NULL);
    const int V = c->vocab_size, d = c->d_model, H = c->n_heads, KV = c->n_kv_heads,
              hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd, E = c->moe.n_experts,
              ff = c->moe.d_ff;
    char name[96];
    int n = 0;
    add_tensor(tab, &n, "model.embed_tokens.weight", o.embed, V, d, -1, 0, -1);
    for (int l = 0; l < c->n_layers; l++) {
        const size_t wqkv = o.wqkv + (size_t)l * Q * d, gate = o.router + (size_t)l * E * d;
#define LNAME(fmt) (snprintf(name, sizeof name, "model.layers.%d." fmt, l), name)
        add_tensor(tab, &n, LNAME("input_layernorm.weight"), o.attn_norm + (size_t)l * d, d, 0, l,
                   1, -1);
        add_tensor(tab, &n, LNAME("self_attn.q_proj.weight"), wqkv, H * hd, d, l, 0, -1);
        add_tensor(tab, &n, LNAME("self_attn.k_proj.weight"), wqkv + (size_t)H * hd * d, KV * hd, d,
                   l, 0, -1);
        add_tensor(tab, &n, LNAME("self_attn.v_proj.weight"), wqkv + (size_t)(H + KV) * hd * d,
                   KV * hd, d, l, 0, -1);
        add_tensor(tab, &n, LNAME("self_attn.o_proj.weight"), o.wo + (size_t)l * d * H * hd, d,
                   H * hd, l, 0, -1);
        add_tensor(tab, &n, LNAME("post_attention_layernorm.weight"), o.moe_norm + (size_t)l * d, d,
                   0, l, 1, -1);
        add_tensor(tab, &n, LNAME("block_sparse_moe.gate.weight"), gate, E, d, l, 0, -1);
#undef LNAME
        for (int j = 0; j < E; j++) { // global expert j, HF order, if it is in a local slot
            const int jl = (slot_of ? slot_of[j] : j) - e0;
            if (jl < 0 || jl >= El) continue;
            const size_t w13 = o.w13 + ((size_t)l * El + jl) * 2 * ff * d,
                         w2 = o.w2 + ((size_t)l * El + jl) * d * ff;
            snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.w1.weight", l,
                     j);
            add_tensor(tab, &n, name, w13, ff, d, l, 0, j);
            snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.w2.weight", l,
                     j);
            add_tensor(tab, &n, name, w2, d, ff, l, 0, j);
            snprintf(name, sizeof name, "model.layers.%d.block_sparse_moe.experts.%d.w3.weight", l,
                     j);
            add_tensor(tab, &n, name, w13 + (size_t)ff * d, ff, d, l, 0, j);
        }
    }
    add_tensor(tab, &n, "model.norm.weight", o.final_norm, d, 0, -1, 1, -1);
    if (!c->tie_embeddings) add_tensor(tab, &n, "lm_head.weight", o.lm_head, V, d, -1, 0, -1);
}

moe_model_tensor *moe_model_tensor_table(const moe_model_config *cfg) {
    moe_model_tensor *tab = calloc((size_t)moe_model_tensor_count(cfg), sizeof *tab);
    if (tab) build_tensor_table(tab, cfg, cfg->moe.n_experts, 0, NULL);
    return tab;
}

// ---- allocation ---------------------------------------------------------------------

typedef struct {
    void **ptr;
    size_t bytes;
} buffer_spec;

static moe_status alloc_all(moe_model *m, const buffer_spec *specs, size_t n) {
    for (size_t i = 0; i < n; i++) {
        *specs[i].ptr = m->be->alloc(m->be, specs[i].bytes);
        m->buffer_bytes += specs[i].bytes;
        if (!*specs[i].ptr)
            return moe_error(MOE_ENOMEM, "model: cannot allocate %zu bytes on %s", specs[i].bytes,
                             m->be->name);
    }
    return MOE_OK;
}

// What both modes share: parameters, tensor table, RoPE tables for max_pos positions,
// n_moe MoE layers of max_tokens tokens each.
static moe_status create_common(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                                moe_comm *ep, int max_pos, int n_moe, int max_tokens,
                                int forward_only) {
    memset(m, 0, sizeof *m);
    moe_status st = moe_model_config_check(cfg);
    if (st) return st;
    const int E = cfg->moe.n_experts, R_ep = ep ? ep->size : 1;
    if (E % R_ep)
        return moe_error(MOE_EINVAL,
                         "model: n_experts=%d is not divisible by the %d ranks of "
                         "the expert-parallel group",
                         E, R_ep);
    m->cfg = *cfg;
    m->be = be;
    m->ep = R_ep > 1 ? ep : NULL;
    m->E_local = E / R_ep, m->expert0 = R_ep > 1 ? ep->rank * m->E_local : 0;
    const size_t L = cfg->n_layers, hd = moe_model_head_dim(cfg), P = max_pos, R = sizeof(real);
    params_offsets offsets;
    m->n_params = params_layout(&offsets, cfg, m->E_local, &m->n_dense);
    buffer_spec specs[] = {
        {(void **)&m->params, m->n_params * R},
        {(void **)&m->rope_cos, P * hd / 2 * R},
        {(void **)&m->rope_sin, P * hd / 2 * R},
    };
    if ((st = alloc_all(m, specs, sizeof specs / sizeof specs[0]))) return st;
    if (cfg->router_bias) {
        buffer_spec bias = {(void **)&m->router_bias, L * cfg->moe.n_experts * R};
        if ((st = alloc_all(m, &bias, 1))) return st;
    }
    params_views(&m->p, m->params, cfg, m->E_local);
    if (cfg->dtype == MOE_DTYPE_BF16) {
        buffer_spec shadow16 = {(void **)&m->params16, m->n_params * sizeof(moe_bf16)};
        if ((st = alloc_all(m, &shadow16, 1))) return st;
    }

    // tensor table: 1 + per layer 7 + 3 E_local, + final norm + lm_head
    m->n_tensors = (int)tensor_count(cfg, m->E_local);
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    if (m->tensors) build_tensor_table(m->tensors, cfg, m->E_local, m->expert0, NULL);
    m->n_moe = n_moe;
    m->moe = calloc(n_moe, sizeof(moe_layer));
    m->moe_stats = calloc(L, sizeof(moe_stats));
    if (!m->tensors || !m->moe || !m->moe_stats)
        return moe_error(MOE_ENOMEM, "model: cannot allocate host tables");
    // Layer 0 allocates the backward scratch and the others share it: backwards run one
    // layer at a time (its bytes count as layer 0's).
    for (int l = 0; l < n_moe; l++) {
        const moe_layer_shape shape = {.max_tokens = max_tokens,
                                       .ep = m->ep,
                                       .scratch = l ? m->moe[0].bwd : NULL,
                                       .forward_only = forward_only};
        moe_config mc = cfg->moe;
        mc.dtype = cfg->dtype; // the model's precision
        if ((st = moe_layer_create(&m->moe[l], be, &mc, &shape))) return st;
    }

    // RoPE tables: angle = pos * theta^(-2i/hd), computed in double
    real *cs = malloc(2 * P * hd / 2 * R);
    if (!cs) return moe_error(MOE_ENOMEM, "model: cannot allocate RoPE tables");
    for (size_t pos = 0; pos < P; pos++)
        for (size_t i = 0; i < hd / 2; i++) {
            double angle = pos * pow(cfg->rope_theta, -2.0 * i / hd);
            cs[pos * hd / 2 + i] = (real)cos(angle);
            cs[P * hd / 2 + pos * hd / 2 + i] = (real)sin(angle);
        }
    be->copy_to_device(be, m->rope_cos, cs, P * hd / 2 * R);
    be->copy_to_device(be, m->rope_sin, cs + P * hd / 2, P * hd / 2 * R);
    free(cs);
    return MOE_OK;
}

moe_status moe_model_create(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                            int max_batch, int max_seq) {
    return moe_model_create_parallel(m, be, cfg, max_batch, max_seq, NULL);
}

moe_status moe_model_create_parallel(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                                     int max_batch, int max_seq, moe_comm *ep) {
    if (max_batch < 1 || max_seq < 1 || max_seq > cfg->max_seq_len) {
        memset(m, 0, sizeof *m);
        return moe_error(MOE_EINVAL, "model: batch %d x seq %d out of range (max_seq_len %d)",
                         max_batch, max_seq, cfg->max_seq_len);
    }
    const size_t T = (size_t)max_batch * max_seq, d = cfg->d_model, L = cfg->n_layers,
                 H = cfg->n_heads, KV = cfg->n_kv_heads, hd = moe_model_head_dim(cfg),
                 Q = (H + 2 * KV) * hd, V = cfg->vocab_size, S = max_seq, B = max_batch,
                 R = sizeof(real);
    moe_status st = create_common(m, be, cfg, ep, max_seq, cfg->n_layers, (int)T, 0);
    if (st) {
        moe_model_destroy(m);
        return st;
    }
    m->training = 1;
    if (m->params16 && (!be->attention_forward_bf16 || !be->attention_backward_bf16)) {
        moe_model_destroy(m);
        return moe_error(MOE_EINVAL,
                         "model: backend %s has no bf16 attention kernels yet (dtype bf16 needs "
                         "them; fp32 runs on it)",
                         be->name);
    }
    m->max_batch = max_batch, m->max_seq = max_seq;
    m->attn_scratch_size = be->attention_scratch_size(be, (int)S, (int)hd);
    // bf16 keeps n1, qkv and attn_out of every layer in bf16, and one layer's in fp32
    const size_t Lk = m->params16 ? 1 : L;
    if (m->params16) {
        const size_t B16 = sizeof(moe_bf16);
        size_t g = V > Q ? V : Q;
        g = g > d ? g : d;
        g = g > H * hd ? g : H * hd;
        buffer_spec b16[] = {
            {(void **)&m->n1_16, L * T * d * B16},     {(void **)&m->qkv16, L * T * Q * B16},
            {(void **)&m->ao16, L * T * H * hd * B16}, {(void **)&m->xf16, T * d * B16},
            {(void **)&m->g16, T * g * B16},
        };
        if ((st = alloc_all(m, b16, sizeof b16 / sizeof b16[0]))) {
            moe_model_destroy(m);
            return st;
        }
    }
    buffer_spec specs[] = {
        {(void **)&m->grads, m->n_params * R},
        {(void **)&m->tokens, T * sizeof(int)},
        {(void **)&m->targets, T * sizeof(int)},
        {(void **)&m->x, (L + 1) * T * d * R},
        {(void **)&m->n1, Lk * T * d * R},
        {(void **)&m->rstd1, L * T * R},
        {(void **)&m->qkv, Lk * T * Q * R},
        {(void **)&m->lse, L * B * H * S * R},
        {(void **)&m->attn_out, Lk * T * H * hd * R},
        {(void **)&m->h, L * T * d * R},
        {(void **)&m->n2, L * T * d * R},
        {(void **)&m->rstd2, L * T * R},
        {(void **)&m->moe_out, T * d * R},
        {(void **)&m->xf, T * d * R},
        {(void **)&m->rstdf, T * R},
        {(void **)&m->logits, T * V * R},
        {(void **)&m->losses, T * R},
        {(void **)&m->dx, T * d * R},
        {(void **)&m->dn, T * d * R},
        {(void **)&m->dattn_out, T * H * hd * R},
        {(void **)&m->dqkv, T * Q * R},
        {(void **)&m->attn_scratch, m->attn_scratch_size * R},
        {(void **)&m->dlogits, T * V * R},
    };
    if ((st = alloc_all(m, specs, sizeof specs / sizeof specs[0]))) {
        moe_model_destroy(m);
        return st;
    }
    params_views(&m->g, m->grads, cfg, m->E_local);
    return MOE_OK;
}

moe_status moe_model_create_inference(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                                      int max_pos, int max_chunk) {
    return moe_model_create_inference_parallel(m, be, cfg, max_pos, max_chunk, NULL);
}

moe_status moe_model_create_inference_parallel(moe_model *m, moe_backend *be,
                                               const moe_model_config *cfg, int max_pos,
                                               int max_chunk, moe_comm *ep) {
    return moe_model_create_inference_batch(m, be, cfg, max_pos, max_chunk, 1, ep);
}

moe_status moe_model_create_inference_batch(moe_model *m, moe_backend *be,
                                            const moe_model_config *cfg, int max_pos, int max_chunk,
                                            int n_seqs, moe_comm *ep) {
    if (max_pos < 1 || max_chunk < 1 || max_chunk > max_pos || n_seqs < 1 ||
        (size_t)n_seqs * max_pos > ((size_t)1 << 28)) {
        memset(m, 0, sizeof *m);
        return moe_error(MOE_EINVAL,
                         "model: %d sequences of %d positions with chunks of %d tokens is invalid",
                         n_seqs, max_pos, max_chunk);
    }
    const size_t C = max_chunk, P = max_pos, d = cfg->d_model, L = cfg->n_layers, H = cfg->n_heads,
                 KV = cfg->n_kv_heads, hd = moe_model_head_dim(cfg), Q = (H + 2 * KV) * hd,
                 V = cfg->vocab_size, R = sizeof(real);
    // one MoE layer's buffers serve every layer: nothing is kept for a backward
    moe_status st = create_common(m, be, cfg, ep, max_pos, 1, max_chunk, 1);
    if (st) {
        moe_model_destroy(m);
        return st;
    }
    m->max_batch = 1, m->max_seq = max_chunk, m->max_pos = max_pos, m->n_seqs = n_seqs;
    m->expert_hits = calloc(2 * L * cfg->moe.n_experts, sizeof(long));
    m->step_hits = m->expert_hits ? m->expert_hits + L * cfg->moe.n_experts : NULL;
    if (!m->expert_hits) {
        moe_model_destroy(m);
        return moe_error(MOE_ENOMEM, "model: cannot allocate expert hit counts");
    }
    buffer_spec specs[] = {
        {(void **)&m->tokens, C * sizeof(int)},
        {(void **)&m->targets, C * sizeof(int)},
        {(void **)&m->losses, C * R},
        {(void **)&m->x, C * d * R},
        {(void **)&m->n1, C * d * R},
        {(void **)&m->rstd1, C * R},
        {(void **)&m->qkv, C * Q * R},
        {(void **)&m->attn_out, C * H * hd * R},
        {(void **)&m->moe_out, C * d * R},
        {(void **)&m->logits, C * V * R},
        {(void **)&m->attn_scratch, H * C * P * R},
        {(void **)&m->k_cache, L * n_seqs * P * KV * hd * R},
        {(void **)&m->v_cache, L * n_seqs * P * KV * hd * R},
    };
    if ((st = alloc_all(m, specs, sizeof specs / sizeof specs[0]))) {
        moe_model_destroy(m);
        return st;
    }
    if (m->params16) { // the bf16 GEMM inputs of one chunk
        size_t g = Q > d ? Q : d;
        g = g > H * hd ? g : H * hd;
        buffer_spec b16 = {(void **)&m->g16, C * g * sizeof(moe_bf16)};
        if ((st = alloc_all(m, &b16, 1))) {
            moe_model_destroy(m);
            return st;
        }
    }
    return MOE_OK;
}

void moe_model_destroy(moe_model *m) {
    if (m->be) {
        void *bufs[] = {m->params,  m->grads,    m->rope_cos,  m->rope_sin,    m->tokens,
                        m->targets, m->x,        m->n1,        m->rstd1,       m->qkv,
                        m->lse,     m->attn_out, m->h,         m->n2,          m->rstd2,
                        m->moe_out, m->xf,       m->rstdf,     m->logits,      m->losses,
                        m->dx,      m->dn,       m->dattn_out, m->dqkv,        m->attn_scratch,
                        m->dlogits, m->k_cache,  m->v_cache,   m->router_bias, m->params16,
                        m->n1_16,   m->qkv16,    m->ao16,      m->xf16,        m->g16};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
            if (bufs[i]) m->be->free(m->be, bufs[i]);
    }
    if (m->moe)
        for (int l = m->n_moe - 1; l >= 0; l--) moe_layer_free(&m->moe[l]); // owner last
    // (sizes only: see moe_model_memory)
    free(m->moe);
    free(m->moe_stats);
    free(m->tensors);
    free(m->placement);
    free(m->expert_hits);
    memset(m, 0, sizeof *m);
}

void moe_model_reduce_grads(moe_model *m, moe_comm *world, moe_comm *edp) {
    if (world && world->size > 1) world->allreduce_sum_real(world, m->be, m->grads, m->n_dense);
    if (edp && edp->size > 1)
        edp->allreduce_sum_real(edp, m->be, m->grads + m->n_dense, m->n_params - m->n_dense);
}

double moe_model_grad_sum_squares(moe_model *m) {
    double dense, experts;
    m->be->sum_squares(m->be, &dense, m->grads, m->n_dense);
    m->be->sum_squares(m->be, &experts, m->grads + m->n_dense, m->n_params - m->n_dense);
    if (m->ep) m->ep->allreduce_sum_double(m->ep, &experts, 1); // each expert once
    return dense + experts;
}

void moe_model_set_timer(moe_model *m, moe_timer *t) {
    m->timer = t;
    for (int l = 0; l < m->n_moe; l++) m->moe[l].timer = t;
}

void moe_model_zero_grads(moe_model *m) {
    if (m->grads) m->be->zero(m->be, m->grads, m->n_params * sizeof(real));
}

// ---- expert placement -----------------------------------------------------------------

moe_status moe_model_set_expert_placement(moe_model *m, const int *placement) {
    const int E = m->cfg.moe.n_experts;
    free(m->placement), m->placement = NULL, m->slot_of = NULL;
    if (placement) {
        int *p = malloc(2 * (size_t)E * sizeof(int));
        if (!p) return moe_error(MOE_ENOMEM, "model: out of memory");
        for (int e = 0; e < E; e++) p[E + e] = -1;
        for (int s = 0; s < E; s++) {
            const int g = placement[s];
            if (g < 0 || g >= E || p[E + g] >= 0) {
                free(p);
                return moe_error(MOE_EINVAL,
                                 "model: expert placement entry %d = %d: not a permutation of "
                                 "0 .. %d",
                                 s, g, E - 1);
            }
            p[s] = g, p[E + g] = s;
        }
        m->placement = p, m->slot_of = p + E;
    }
    build_tensor_table(m->tensors, &m->cfg, m->E_local, m->expert0, m->slot_of);
    return MOE_OK;
}

int moe_model_expert_global(const moe_model *m, int slot) {
    return m->placement ? m->placement[slot] : slot;
}

int moe_model_holds_expert(const moe_model *m, int expert) {
    const int s = m->slot_of ? m->slot_of[expert] : expert;
    return s >= m->expert0 && s < m->expert0 + m->E_local;
}

void moe_model_placement_permute(const moe_model *m, real *v, int n, int width, int to_global) {
    if (!m->placement) return;
    const size_t E = m->cfg.moe.n_experts, w = width;
    real *tmp = malloc(E * w * sizeof(real));
    if (!tmp) moe_fatal("model: out of memory");
    for (int b = 0; b < n; b++) {
        real *blk = v + (size_t)b * E * w;
        memcpy(tmp, blk, E * w * sizeof(real));
        for (size_t s = 0; s < E; s++) { // slot s <-> global placement[s]
            const size_t g = m->placement[s];
            memcpy(blk + (to_global ? g : s) * w, tmp + (to_global ? s : g) * w, w * sizeof(real));
        }
    }
    free(tmp);
}

void moe_model_placement_image(const moe_model *m, real *host, int to_global) {
    moe_model_placement_permute(m, host + (m->p.router - m->params), m->cfg.n_layers,
                                m->cfg.d_model, to_global);
}

// ---- forward / backward ---------------------------------------------------------------

static moe_status check_ids(const int *ids, size_t n, int V, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= V)
            return moe_error(MOE_EINVAL, "model: %s[%zu] = %d is outside the vocabulary [0, %d)",
                             what, i, ids[i], V);
    return MOE_OK;
}

void moe_model_refresh_bf16(moe_model *m) {
    if (m->params16) m->be->to_bf16(m->be, m->params16, m->params, m->n_params);
}

moe_bf16 *moe_model_bf16_for_update(moe_model *m) {
    m->params16_current = m->params16 != NULL;
    return m->params16;
}

// y [T, n_out] = x [T, n_in] W^T for a weight W [n_out, n_in] of the model, in its precision.
// bf16: x is rounded into x16 (which the backward reads when it is a kept buffer) and the
// GEMM reads W's bf16 copy; accumulation and y stay fp32.
static void linear_forward(moe_model *m, real *y, const real *x, moe_bf16 *x16, const real *W,
                           int T, int n_out, int n_in) {
    moe_backend *be = m->be;
    if (!m->params16) {
        be->matmul(be, y, x, W, T, n_out, n_in, 0, 1, 0);
        return;
    }
    be->to_bf16(be, x16, x, (size_t)T * n_in);
    be->matmul_bf16(be, y, x16, shadow(m, W), T, n_out, n_in, 0, 1, 0);
}

// Its backward: dx [T, n_in] = dy W (written), dW += dy^T x. fp32 reads x, bf16 the x16 of
// the forward and dy rounded once (into g16) for both GEMMs.
static void linear_backward(moe_model *m, real *dx, real *dW, const real *dy, const real *x,
                            const moe_bf16 *x16, const real *W, int T, int n_out, int n_in) {
    moe_backend *be = m->be;
    if (!m->params16) {
        be->matmul(be, dx, dy, W, T, n_in, n_out, 0, 0, 0);
        be->matmul(be, dW, dy, x, n_out, n_in, T, 1, 0, 1);
        return;
    }
    be->to_bf16(be, m->g16, dy, (size_t)T * n_out);
    be->matmul_bf16(be, dx, m->g16, shadow(m, W), T, n_in, n_out, 0, 0, 0);
    be->matmul_bf16(be, dW, m->g16, x16, n_out, n_in, T, 1, 0, 1);
}

// RoPE on the q and k heads of T qkv rows [T, (H + 2KV) hd] of sequences of S rows from
// position pos0 (inverse: the backward's rotation).
static moe_rope_args qkv_rope(const moe_model_config *c, int T, int S, int pos0, int inverse) {
    const int H = c->n_heads, KV = c->n_kv_heads;
    const moe_rope_args a = {.T = T,
                             .S = S,
                             .pos0 = pos0,
                             .n_rot = H + KV,
                             .n_heads = H + 2 * KV,
                             .hd = moe_model_head_dim(c),
                             .inverse = inverse};
    return a;
}

// The attention kernels' shape for B sequences of S tokens.
static moe_attention_shape attention_shape(const moe_model_config *c, int B, int S) {
    const moe_attention_shape sh = {
        .B = B, .S = S, .H = c->n_heads, .KV = c->n_kv_heads, .hd = moe_model_head_dim(c)};
    return sh;
}

// Inference, bf16: q, k and v rounded to bf16 in place (through q16), the values training's
// bf16 attention reads; the cached attention then runs in fp32 on them. fp32: nothing.
static void round_qkv(moe_model *m, real *qkv, moe_bf16 *q16, size_t n) {
    if (!m->params16) return;
    m->be->to_bf16(m->be, q16, qkv, n);
    m->be->from_bf16(m->be, qkv, q16, n);
}

moe_status moe_model_forward(moe_model *m, const int *tokens, const int *targets, int B, int S,
                             moe_pass pass) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    if (!m->training)
        return moe_error(MOE_EINVAL, "model: created for inference: use moe_model_infer");
    if (B < 1 || B > m->max_batch || S < 1 || S > m->max_seq)
        return moe_error(MOE_EINVAL, "model: batch %d x seq %d exceeds the buffers (%d x %d)", B, S,
                         m->max_batch, m->max_seq);
    const int T = B * S, d = c->d_model, L = c->n_layers, H = c->n_heads, KV = c->n_kv_heads,
              hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd, V = c->vocab_size;
    moe_status st = check_ids(tokens, T, V, "tokens");
    if (!st && targets) st = check_ids(targets, T, V, "targets");
    if (st) return st;
    m->B = B, m->S = S;
    be->copy_to_device(be, m->tokens, tokens, (size_t)T * sizeof(int));
    if (targets) be->copy_to_device(be, m->targets, targets, (size_t)T * sizeof(int));
    // the weights may have changed since the last forward, unless the optimizer step that
    // just changed them also wrote their bf16 copy (moe_model_bf16_for_update)
    if (!m->params16_current) moe_model_refresh_bf16(m);
    m->params16_current = 0;
    moe_timer *tm = m->timer;
    moe_lap_start(tm);

    be->embedding_forward(be, m->x, m->tokens, m->p.embed, T, d);
    m->aux = m->z = 0;
    const size_t Td = (size_t)T * d;
    for (int l = 0; l < L; l++) {
        const size_t lk = m->params16 ? 0 : (size_t)l; // bf16: one layer of fp32 work space
        real *xl = m->x + l * Td, *n1 = m->n1 + lk * Td, *h = m->h + l * Td, *n2 = m->n2 + l * Td;
        real *qkv = m->qkv + lk * T * Q, *ao = m->attn_out + lk * T * H * hd;
        real *lse = m->lse + (size_t)l * B * H * S;
        moe_bf16 *n1_16 = at16(m->n1_16, l * Td), *qkv16 = at16(m->qkv16, (size_t)l * T * Q),
                 *ao16 = at16(m->ao16, (size_t)l * T * H * hd);
        be->rmsnorm_forward(be, n1, m->rstd1 + (size_t)l * T, xl, m->p.attn_norm + (size_t)l * d, T,
                            d, (real)c->rms_norm_eps);
        moe_lap(tm, MOE_T_DENSE);
        linear_forward(m, qkv, n1, n1_16, m->p.wqkv + (size_t)l * Q * d, T, Q, d);
        be->rope(be, qkv, qkv, m->rope_cos, m->rope_sin, qkv_rope(c, T, S, 0, 0));
        if (m->params16) { // q, k, v rounded once (kept for the backward); bf16 products
            be->to_bf16(be, qkv16, qkv, (size_t)T * Q);
            be->attention_forward_bf16(be, ao, lse, qkv16, attention_shape(c, B, S),
                                       m->attn_scratch, m->attn_scratch_size);
        } else {
            be->attention_forward(be, ao, lse, qkv, attention_shape(c, B, S), m->attn_scratch,
                                  m->attn_scratch_size);
        }
        linear_forward(m, h, ao, ao16, m->p.wo + (size_t)l * d * H * hd, T, d, H * hd);
        be->add(be, h, h, xl, Td);
        moe_lap(tm, MOE_T_ATTENTION);
        be->rmsnorm_forward(be, n2, m->rstd2 + (size_t)l * T, h, m->p.moe_norm + (size_t)l * d, T,
                            d, (real)c->rms_norm_eps);
        moe_lap(tm, MOE_T_DENSE);
        moe_weights w = layer_weights(m, l);
        m->moe[l].noise_key = m->noise_key ^ (0xD1B54A32D192ED03ull * (uint64_t)(l + 1));
        st = moe_layer_forward(&m->moe[l], m->moe_out, n2, &w, T, S, pass, &m->moe_stats[l]);
        if (st) return moe_error_context(st, "layer %d", l);
        be->add(be, m->x + (l + 1) * Td, h, m->moe_out, Td);
        moe_lap(tm, MOE_T_COMBINE); // the residual add of the MoE output
        m->aux += m->moe_stats[l].aux + m->moe_stats[l].seq_aux;
        m->z += m->moe_stats[l].z;
    }
    be->rmsnorm_forward(be, m->xf, m->rstdf, m->x + (size_t)L * T * d, m->p.final_norm, T, d,
                        (real)c->rms_norm_eps);
    linear_forward(m, m->logits, m->xf, m->xf16, m->p.lm_head, T, V, d);

    m->ce = 0;
    if (targets) {
        be->cross_entropy_forward(be, m->losses, m->logits, m->targets, T, V);
        double sum;
        be->sum(be, &sum, m->losses, (size_t)T);
        m->ce = sum / T;
    }
    moe_lap(tm, MOE_T_DENSE);
    return MOE_OK;
}

moe_status moe_model_backward(moe_model *m, double loss_scale) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    if (m->B == 0 || !m->training) return moe_error(MOE_EINVAL, "model: backward before forward");
    const int B = m->B, S = m->S, T = B * S, d = c->d_model, L = c->n_layers, H = c->n_heads,
              KV = c->n_kv_heads, hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd,
              V = c->vocab_size;
    const size_t Td = (size_t)T * d;

    moe_timer *tm = m->timer;
    moe_lap_start(tm);
    // logits = xf lm_head^T; CE is a mean over T tokens
    be->cross_entropy_backward(be, m->dlogits, m->logits, m->targets, T, V, (real)(loss_scale / T));
    // dxf = dlogits lm_head, dlm += dlogits^T xf
    linear_backward(m, m->dn, m->g.lm_head, m->dlogits, m->xf, m->xf16, m->p.lm_head, T, V, d);
    be->zero(be, m->dx, Td * sizeof(real));
    be->rmsnorm_backward(be, m->dx, m->g.final_norm, m->dn, m->x + (size_t)L * Td, m->p.final_norm,
                         m->rstdf, T, d);

    for (int l = L - 1; l >= 0; l--) {
        const size_t lk = m->params16 ? 0 : (size_t)l;
        real *xl = m->x + l * Td, *n1 = m->n1 + lk * Td, *h = m->h + l * Td, *n2 = m->n2 + l * Td;
        real *qkv = m->qkv + lk * T * Q, *ao = m->attn_out + lk * T * H * hd;
        const real *lse = m->lse + (size_t)l * B * H * S;
        const moe_bf16 *n1_16 = at16(m->n1_16, l * Td), *qkv16 = at16(m->qkv16, (size_t)l * T * Q),
                       *ao16 = at16(m->ao16, (size_t)l * T * H * hd);
        // x_{l+1} = h + MoE(n2), n2 = RMSNorm(h): dx holds dL/dx_{l+1}, becomes dL/dh
        moe_weights w = layer_weights(m, l), gw = layer_moe_weights(&m->g, c, m->E_local, l, NULL);
        be->zero(be, m->dn, Td * sizeof(real));
        moe_lap(tm, MOE_T_DENSE);
        moe_status st = moe_layer_backward(&m->moe[l], m->dn, &gw, m->dx, n2, &w, loss_scale);
        if (st) return moe_error_context(st, "layer %d", l);
        be->rmsnorm_backward(be, m->dx, m->g.moe_norm + (size_t)l * d, m->dn, h,
                             m->p.moe_norm + (size_t)l * d, m->rstd2 + (size_t)l * T, T, d);
        moe_lap(tm, MOE_T_DENSE);
        // h = x_l + attn_out wo^T: dx becomes dL/dx_l
        linear_backward(m, m->dattn_out, m->g.wo + (size_t)l * d * H * hd, m->dx, ao, ao16,
                        m->p.wo + (size_t)l * d * H * hd, T, d, H * hd);
        if (m->params16) { // do rounded once (g16 is free again); q, k, v and o as kept
            be->to_bf16(be, m->g16, m->dattn_out, (size_t)T * H * hd);
            be->attention_backward_bf16(be, m->dqkv, m->g16, qkv16, ao16, lse,
                                        attention_shape(c, B, S), m->attn_scratch,
                                        m->attn_scratch_size);
        } else {
            be->attention_backward(be, m->dqkv, m->dattn_out, qkv, ao, lse,
                                   attention_shape(c, B, S), m->attn_scratch, m->attn_scratch_size);
        }
        be->rope(be, m->dqkv, m->dqkv, m->rope_cos, m->rope_sin, qkv_rope(c, T, S, 0, 1));
        linear_backward(m, m->dn, m->g.wqkv + (size_t)l * Q * d, m->dqkv, n1, n1_16,
                        m->p.wqkv + (size_t)l * Q * d, T, Q, d);
        moe_lap(tm, MOE_T_ATTENTION);
        be->rmsnorm_backward(be, m->dx, m->g.attn_norm + (size_t)l * d, m->dn, xl,
                             m->p.attn_norm + (size_t)l * d, m->rstd1 + (size_t)l * T, T, d);
    }
    be->embedding_backward(be, m->g.embed, m->dx, m->tokens, T, d);
    moe_lap(tm, MOE_T_DENSE);
    return MOE_OK;
}

// The attention of n rows over their sequences' KV caches (inference): a chunk of one sequence
// in cache slot `slot` at positions pos0.. (pos == NULL), or one row per sequence, row i in
// slot slots[i] at position pos[i] (batched decoding).
static void infer_attention(moe_model *m, int l, int n, int slot, int pos0, const int *slots,
                            const int *pos) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    const int H = c->n_heads, KV = c->n_kv_heads, hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd;
    const size_t cache = (size_t)m->max_pos * KV * hd;
    for (int i = 0; i < (pos ? n : 1); i++) {
        const int rows = pos ? 1 : n, at = pos ? pos[i] : pos0, sq = pos ? slots[i] : slot;
        real *kc = m->k_cache + ((size_t)l * m->n_seqs + sq) * cache,
             *vc = m->v_cache + ((size_t)l * m->n_seqs + sq) * cache;
        real *qkv = m->qkv + (size_t)i * Q;
        be->rope(be, qkv, qkv, m->rope_cos, m->rope_sin, qkv_rope(c, rows, rows, at, 0));
        round_qkv(m, qkv, m->g16, (size_t)rows * Q);
        be->kv_cache_append(be, kc, vc, qkv, rows, at, H, KV, hd);
        be->attention_cached_forward(be, m->attn_out + (size_t)i * H * hd, m->attn_scratch, qkv, kc,
                                     vc, rows, at, H, KV, hd);
    }
}

// moe_model_infer's body for the rows infer_attention describes.
static moe_status infer_rows(moe_model *m, const int *tokens, int n, int slot, int pos0,
                             const int *slots, const int *pos) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    const int d = c->d_model, L = c->n_layers, H = c->n_heads, KV = c->n_kv_heads,
              hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd, V = c->vocab_size;
    moe_status st = check_ids(tokens, n, V, "tokens");
    if (st) return st;
    const size_t nd = (size_t)n * d;
    const real eps = (real)c->rms_norm_eps;
    be->copy_to_device(be, m->tokens, tokens, (size_t)n * sizeof(int));
    if (!pos && pos0 == 0)
        moe_model_refresh_bf16(m); // a new sequence: the weights may have been loaded
    be->embedding_forward(be, m->x, m->tokens, m->p.embed, n, d);
    for (int l = 0; l < L; l++) {
        // x += Attn(RMSNorm(x)) over the cache
        be->rmsnorm_forward(be, m->n1, m->rstd1, m->x, m->p.attn_norm + (size_t)l * d, n, d, eps);
        linear_forward(m, m->qkv, m->n1, m->g16, m->p.wqkv + (size_t)l * Q * d, n, Q, d);
        infer_attention(m, l, n, slot, pos0, slots, pos);
        linear_forward(m, m->moe_out, m->attn_out, m->g16, m->p.wo + (size_t)l * d * H * hd, n, d,
                       H * hd);
        be->add(be, m->x, m->x, m->moe_out, nd);
        // x += MoE(RMSNorm(x)), dropless: a batch's rows are routed together
        be->rmsnorm_forward(be, m->n1, m->rstd1, m->x, m->p.moe_norm + (size_t)l * d, n, d, eps);
        moe_weights w = layer_weights(m, l);
        st = moe_layer_forward(&m->moe[0], m->moe_out, m->n1, &w, n, n, moe_pass_infer(),
                               &m->moe_stats[l]);
        if (st) return moe_error_context(st, "layer %d", l);
        for (int e = 0; e < c->moe.n_experts; e++)
            m->expert_hits[(size_t)l * c->moe.n_experts + e] +=
                (m->step_hits[(size_t)l * c->moe.n_experts + e] = m->moe_stats[l].routed[e]);
        be->add(be, m->x, m->x, m->moe_out, nd);
    }
    be->rmsnorm_forward(be, m->n1, m->rstd1, m->x, m->p.final_norm, n, d, eps);
    linear_forward(m, m->logits, m->n1, m->g16, m->p.lm_head, n, V, d);
    return MOE_OK;
}

moe_status moe_model_infer(moe_model *m, const int *tokens, int n, int pos0) {
    return moe_model_infer_slot(m, 0, tokens, n, pos0);
}

moe_status moe_model_infer_slot(moe_model *m, int slot, const int *tokens, int n, int pos0) {
    if (m->training)
        return moe_error(MOE_EINVAL, "model: created for training: use moe_model_forward");
    if (n < 1 || n > m->max_seq || pos0 < 0 || pos0 + n > m->max_pos || slot < 0 ||
        slot >= m->n_seqs)
        return moe_error(MOE_EINVAL,
                         "model: %d tokens at position %d of sequence %d exceed the KV cache (%d "
                         "sequences of %d positions, chunks of at most %d)",
                         n, pos0, slot, m->n_seqs, m->max_pos, m->max_seq);
    return infer_rows(m, tokens, n, slot, pos0, NULL, NULL);
}

moe_status moe_model_decode_batch(moe_model *m, const int *tokens, int n, const int *slots,
                                  const int *pos) {
    if (m->training)
        return moe_error(MOE_EINVAL, "model: created for training: use moe_model_forward");
    if (n < 1 || n > m->max_seq)
        return moe_error(MOE_EINVAL, "model: a batch of %d rows exceeds the chunk of %d", n,
                         m->max_seq);
    for (int i = 0; i < n; i++)
        if (slots[i] < 0 || slots[i] >= m->n_seqs || pos[i] < 0 || pos[i] >= m->max_pos)
            return moe_error(MOE_EINVAL,
                             "model: row %d (sequence %d, position %d) outside the KV cache (%d "
                             "sequences of %d positions)",
                             i, slots[i], pos[i], m->n_seqs, m->max_pos);
    return infer_rows(m, tokens, n, 0, 0, slots, pos);
}

void moe_model_memory(const moe_model *m, size_t *params, size_t *grads, size_t *activations) {
    *params = m->n_params * (sizeof(real) + (m->params16 ? sizeof(moe_bf16) : 0));
    *grads = m->grads ? m->n_params * sizeof(real) : 0;
    size_t moe = 0;
    for (int l = 0; l < m->n_moe; l++) moe += m->moe[l].bytes;
    *activations = m->buffer_bytes - *params - *grads + moe;
}
