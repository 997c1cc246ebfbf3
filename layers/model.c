// The Mixtral-style decoder: parameter layout, initialisation, forward, backward.
// Orchestration only: every loop over floats is a backend kernel (see model.h).
#include "layers/model.h"

#include "layers/timing.h"

#include <math.h>
#include <stdio.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

const char *moe_model_family_name(moe_family f) {
    static const char *const names[] = {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe"};
    return (unsigned)f < sizeof names / sizeof names[0] ? names[f] : "?";
}

int moe_model_layer_is_moe(const moe_model_config *c, int l) {
    const int step = c->sparse_step > 0 ? c->sparse_step : 1;
    return l >= c->first_k_dense && !moe_model_dense_layer_listed(c, l) && (l + 1) % step == 0;
}

int moe_model_n_moe_layers(const moe_model_config *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += moe_model_layer_is_moe(c, l);
    return n;
}

int moe_model_moe_index(const moe_model_config *c, int l) {
    if (!moe_model_layer_is_moe(c, l)) return -1;
    int j = 0;
    for (int i = 0; i < l; i++) j += moe_model_layer_is_moe(c, i);
    return j;
}

// The dense layers before l (layer l's index among them when it is dense).
static int dense_index(const moe_model_config *c, int l) {
    int j = 0;
    for (int i = 0; i < l; i++) j += !moe_model_layer_is_moe(c, i);
    return j;
}

// The dense layers' MLP width (0: the experts').
static int dense_ff(const moe_model_config *c) {
    return c->dense_d_ff > 0 ? c->dense_d_ff : c->moe.d_ff;
}

// The widest MLP outside the experts (dense layers, shared expert), 0 when there is none.
static int mlp_ff_max(const moe_model_config *c) {
    const int dff = moe_model_n_moe_layers(c) < c->n_layers ? dense_ff(c) : 0;
    return dff > c->shared_d_ff ? dff : c->shared_d_ff;
}

// The widths the q/k norm weights have: nq, nk (0 when off) and the segments per row, nh.
static void qk_norm_widths(const moe_model_config *c, int *nq, int *nk, int *nh) {
    const int hd = moe_model_head_dim(c), full = c->qk_norm == MOE_QK_NORM_FULL;
    *nq = c->qk_norm ? (full ? c->n_heads * hd : hd) : 0;
    *nk = c->qk_norm ? (full ? c->n_kv_heads * hd : hd) : 0;
    *nh = c->qk_norm ? (full ? 2 : c->n_heads + c->n_kv_heads) : 0;
}

static moe_status check_layer_kinds(const moe_model_config *c) {
    if (c->first_k_dense < 0 || c->first_k_dense > c->n_layers || c->sparse_step < 0 ||
        c->sparse_step > c->n_layers)
        return moe_error(MOE_EINVAL,
                         "model: first_k_dense=%d and sparse_step=%d must be in [0, n_layers=%d]",
                         c->first_k_dense, c->sparse_step, c->n_layers);
    for (int l = c->n_layers; l < MOE_MODEL_MAX_LAYERS; l++)
        if (moe_model_dense_layer_listed(c, l))
            return moe_error(MOE_EINVAL, "model: dense_layers lists layer %d of %d", l,
                             c->n_layers);
    if (!moe_model_n_moe_layers(c))
        return moe_error(MOE_EINVAL,
                         "model: first_k_dense, dense_layers and sparse_step leave no MoE layer");
    if (c->dense_d_ff < 0 || c->dense_d_ff > (1 << 20) || c->shared_d_ff < 0 ||
        c->shared_d_ff > (1 << 20))
        return moe_error(MOE_EINVAL, "model: dense_d_ff=%d and shared_d_ff=%d must be in [0, 2^20]",
                         c->dense_d_ff, c->shared_d_ff);
    if (c->shared_gate && !c->shared_d_ff)
        return moe_error(MOE_EINVAL, "model: shared_gate needs a shared expert (shared_d_ff > 0)");
    if ((unsigned)c->qk_norm > MOE_QK_NORM_FULL)
        return moe_error(MOE_EINVAL, "model: qk_norm=%d is not a q/k norm", (int)c->qk_norm);
    return MOE_OK;
}

// What each family's HF class can express: a model it cannot is refused with the reason.
static moe_status check_family(const moe_model_config *c) {
    const int dense = moe_model_n_moe_layers(c) < c->n_layers, hd = moe_model_head_dim(c);
    const char *why = NULL;
    switch (c->family) {
    case MOE_FAMILY_MIXTRAL:
        if (dense || c->shared_d_ff || c->qk_norm || c->qkv_bias)
            why = "MixtralForCausalLM has no dense layers, shared expert, q/k norm or q/k/v "
                  "biases (family \"qwen3_moe\", \"qwen2_moe\" or \"olmoe\" has them)";
        break;
    case MOE_FAMILY_QWEN3_MOE:
        if (c->qk_norm != MOE_QK_NORM_HEAD || c->shared_d_ff || c->qkv_bias)
            why = "Qwen3MoeForCausalLM has qk_norm \"head\", no shared expert and no "
                  "q/k/v biases";
        break;
    case MOE_FAMILY_QWEN2_MOE:
        if (c->qk_norm || !c->shared_d_ff || !c->shared_gate)
            why = "Qwen2MoeForCausalLM has a gated shared expert in every MoE layer "
                  "(shared_d_ff > 0, shared_gate = true) and no q/k norm";
        break;
    case MOE_FAMILY_OLMOE:
        if (c->qk_norm != MOE_QK_NORM_FULL || dense || c->shared_d_ff || c->qkv_bias ||
            hd * c->n_heads != c->d_model)
            why = "OlmoeForCausalLM has qk_norm \"full\", head_dim = d_model / n_heads, "
                  "and no dense layers, shared expert or biases";
        break;
    default: return moe_error(MOE_EINVAL, "model: family=%d is not a family", (int)c->family);
    }
    if (why)
        return moe_error(MOE_EINVAL, "model: model.family = \"%s\" cannot express this model: %s",
                         moe_model_family_name(c->family), why);
    return MOE_OK;
}

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
    moe_status st = check_layer_kinds(c);
    if (!st) st = check_family(c);
    if (st) return st;
    moe_config mc = c->moe;
    mc.dtype = c->dtype; // (the layers' precision is the model's)
    return moe_config_check(&mc);
}

// ---- parameter layout -------------------------------------------------------------

// Where each view starts in the flat buffer, in reals (the layout without a buffer).
typedef struct {
    size_t embed, attn_norm, wqkv, bqkv, q_norm, k_norm, wo, moe_norm, router, shared_gate,
        shared_w13, shared_w2, dense_w13, dense_w2, final_norm, lm_head, w13, w2;
} params_offsets;

// Consecutive regions, dense first and the weights of the El local experts of each MoE layer
// last (El = E with one rank); returns the reals used, and *n_dense the size of the dense
// part. The parts a config does not have take no room (Mixtral's layout is unchanged).
static size_t params_layout(params_offsets *o, const moe_model_config *c, int El, size_t *n_dense) {
    const size_t V = c->vocab_size, d = c->d_model, L = c->n_layers, H = c->n_heads,
                 KV = c->n_kv_heads, hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd,
                 E = c->moe.n_experts, ff = c->moe.d_ff, Lm = moe_model_n_moe_layers(c),
                 Ld = L - Lm, sff = c->shared_d_ff, dff = dense_ff(c);
    int nq, nk, nh;
    qk_norm_widths(c, &nq, &nk, &nh);
    size_t off = 0;
#define TAKE(field, n) (o->field = off, off += (n))
    TAKE(embed, V * d);
    TAKE(attn_norm, L * d);
    TAKE(wqkv, L * Q * d);
    TAKE(bqkv, c->qkv_bias ? L * Q : 0);
    TAKE(q_norm, L * nq);
    TAKE(k_norm, L * nk);
    TAKE(wo, L * d * H * hd);
    TAKE(moe_norm, L * d);
    TAKE(router, Lm * E * d);
    TAKE(shared_gate, c->shared_gate ? Lm * d : 0);
    TAKE(shared_w13, Lm * 2 * sff * d);
    TAKE(shared_w2, Lm * d * sff);
    TAKE(dense_w13, Ld * 2 * dff * d);
    TAKE(dense_w2, Ld * d * dff);
    TAKE(final_norm, d);
    if (c->tie_embeddings)
        o->lm_head = o->embed;
    else
        TAKE(lm_head, V * d);
    if (n_dense) *n_dense = off;
    TAKE(w13, Lm * (size_t)El * 2 * ff * d);
    TAKE(w2, Lm * (size_t)El * d * ff);
#undef TAKE
    return off;
}

// Points the views at their regions of buf (NULL for the parts the config does not have).
static void params_views(moe_model_params *p, real *buf, const moe_model_config *c, int El) {
    params_offsets o;
    params_layout(&o, c, El, NULL);
    const int dense = moe_model_n_moe_layers(c)<c->n_layers, shared = c->shared_d_ff> 0;
    *p = (moe_model_params){.embed = buf + o.embed,
                            .attn_norm = buf + o.attn_norm,
                            .wqkv = buf + o.wqkv,
                            .bqkv = c->qkv_bias ? buf + o.bqkv : NULL,
                            .q_norm = c->qk_norm ? buf + o.q_norm : NULL,
                            .k_norm = c->qk_norm ? buf + o.k_norm : NULL,
                            .wo = buf + o.wo,
                            .moe_norm = buf + o.moe_norm,
                            .router = buf + o.router,
                            .shared_gate = c->shared_gate ? buf + o.shared_gate : NULL,
                            .shared_w13 = shared ? buf + o.shared_w13 : NULL,
                            .shared_w2 = shared ? buf + o.shared_w2 : NULL,
                            .dense_w13 = dense ? buf + o.dense_w13 : NULL,
                            .dense_w2 = dense ? buf + o.dense_w2 : NULL,
                            .final_norm = buf + o.final_norm,
                            .lm_head = buf + o.lm_head,
                            .w13 = buf + o.w13,
                            .w2 = buf + o.w2};
}

size_t moe_model_param_count(const moe_model_config *cfg) {
    params_offsets o;
    return params_layout(&o, cfg, cfg->moe.n_experts, NULL);
}

// MoE layer l's weights (its El local experts); bias (the model's router_bias, or NULL for
// gradient views) [L, E], indexed by model layer.
static moe_weights layer_moe_weights(const moe_model_params *p, const moe_model_config *c, int El,
                                     int l, real *bias) {
    const size_t E = c->moe.n_experts, d = c->d_model, ff = c->moe.d_ff,
                 j = (size_t)moe_model_moe_index(c, l);
    moe_weights w = {
        .gate = p->router + j * E * d,
        .w13 = p->w13 + j * (size_t)El * 2 * ff * d,
        .w2 = p->w2 + j * (size_t)El * d * ff,
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

enum { T_NORM = 1, T_BIAS = 2, T_RESIDUAL = 4 }; // a tensor's kind, for the table's flags

static void add_tensor(moe_model_tensor *tab, int *n, const char *name, size_t offset, int rows,
                       int cols, int layer, int kind, int expert) {
    moe_model_tensor *t = &tab[(*n)++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->offset = offset;
    t->rows = rows, t->cols = cols, t->layer = layer;
    t->is_norm = !!(kind & T_NORM), t->is_bias = !!(kind & T_BIAS);
    t->is_residual = !!(kind & T_RESIDUAL);
    t->is_expert = expert >= 0, t->expert = expert;
}

// Tensors of layer l of a model holding El experts per MoE layer.
static int64_t layer_tensor_count(const moe_model_config *c, int El, int l) {
    int64_t n = 6 + 3 * (c->qkv_bias != 0) + 2 * (c->qk_norm != 0); // norms, q k v o, ...
    if (!moe_model_layer_is_moe(c, l)) return n + 3;                // the dense MLP
    return n + 1 + 3 * (int64_t)El + 3 * (c->shared_d_ff > 0) + (c->shared_gate != 0);
}

static int64_t tensor_count(const moe_model_config *c, int El) {
    int64_t n = 3 - (c->tie_embeddings != 0);
    for (int l = 0; l < c->n_layers; l++) n += layer_tensor_count(c, El, l);
    return n;
}

int64_t moe_model_tensor_count(const moe_model_config *c) {
    return tensor_count(c, c->moe.n_experts);
}

// The HF names of a family's MoE tensors: the router, the experts' three projections
// (w1 = gate, w2 = down, w3 = up).
typedef struct {
    const char *router, *expert_fmt[3];
} family_names;

static const family_names *names_of(moe_family f) {
    static const family_names mixtral = {"block_sparse_moe.gate",
                                         {"block_sparse_moe.experts.%d.w1",
                                          "block_sparse_moe.experts.%d.w2",
                                          "block_sparse_moe.experts.%d.w3"}},
                              qwen = {"mlp.gate",
                                      {"mlp.experts.%d.gate_proj", "mlp.experts.%d.down_proj",
                                       "mlp.experts.%d.up_proj"}};
    return f == MOE_FAMILY_MIXTRAL ? &mixtral : &qwen;
}

// One SwiGLU MLP's tensors under prefix pre: gate_proj, up_proj (rows 0..f-1 and f..2f-1 of
// w13 [2f, d]), down_proj w2 [d, f].
static void add_mlp(moe_model_tensor *tab, int *n, const char *pre, size_t w13, size_t w2, int f,
                    int d, int l) {
    char name[96];
    snprintf(name, sizeof name, "%s.gate_proj.weight", pre);
    add_tensor(tab, n, name, w13, f, d, l, 0, -1);
    snprintf(name, sizeof name, "%s.up_proj.weight", pre);
    add_tensor(tab, n, name, w13 + (size_t)f * d, f, d, l, 0, -1);
    snprintf(name, sizeof name, "%s.down_proj.weight", pre);
    add_tensor(tab, n, name, w2, d, f, l, T_RESIDUAL, -1);
}

// Layer l's attention tensors: input norm, q k v (and biases), o, q/k norms.
static void add_attention(moe_model_tensor *tab, int *n, const params_offsets *o,
                          const moe_model_config *c, int l) {
    const int d = c->d_model, H = c->n_heads, KV = c->n_kv_heads, hd = moe_model_head_dim(c),
              Q = (H + 2 * KV) * hd, rows[3] = {H * hd, KV * hd, KV * hd};
    const char *proj[3] = {"q_proj", "k_proj", "v_proj"};
    int nq, nk, nh;
    qk_norm_widths(c, &nq, &nk, &nh);
    char name[96];
#define LNAME(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
    add_tensor(tab, n, LNAME("model.layers.%d.input_layernorm.weight", l),
               o->attn_norm + (size_t)l * d, d, 0, l, T_NORM, -1);
    for (int i = 0, r0 = 0; i < 3; r0 += rows[i], i++) {
        add_tensor(tab, n, LNAME("model.layers.%d.self_attn.%s.weight", l, proj[i]),
                   o->wqkv + ((size_t)l * Q + r0) * d, rows[i], d, l, 0, -1);
        if (c->qkv_bias)
            add_tensor(tab, n, LNAME("model.layers.%d.self_attn.%s.bias", l, proj[i]),
                       o->bqkv + (size_t)l * Q + r0, rows[i], 0, l, T_BIAS, -1);
    }
    add_tensor(tab, n, LNAME("model.layers.%d.self_attn.o_proj.weight", l),
               o->wo + (size_t)l * d * H * hd, d, H * hd, l, T_RESIDUAL, -1);
    if (c->qk_norm) {
        add_tensor(tab, n, LNAME("model.layers.%d.self_attn.q_norm.weight", l),
                   o->q_norm + (size_t)l * nq, nq, 0, l, T_NORM, -1);
        add_tensor(tab, n, LNAME("model.layers.%d.self_attn.k_norm.weight", l),
                   o->k_norm + (size_t)l * nk, nk, 0, l, T_NORM, -1);
    }
    add_tensor(tab, n, LNAME("model.layers.%d.post_attention_layernorm.weight", l),
               o->moe_norm + (size_t)l * d, d, 0, l, T_NORM, -1);
#undef LNAME
}

// MoE layer l's tensors: router, shared expert, then the experts in slots e0 .. e0+El-1,
// named by their global index (slot_of: the slot of each global expert, NULL: the identity),
// listed by it.
static void add_moe(moe_model_tensor *tab, int *n, const params_offsets *o,
                    const moe_model_config *c, int El, int e0, const int *slot_of, int l) {
    const family_names *fn = names_of(c->family);
    const int d = c->d_model, E = c->moe.n_experts, ff = c->moe.d_ff, sff = c->shared_d_ff;
    const size_t j = (size_t)moe_model_moe_index(c, l);
    char name[96], pre[96];
    snprintf(name, sizeof name, "model.layers.%d.%s.weight", l, fn->router);
    add_tensor(tab, n, name, o->router + j * E * d, E, d, l, 0, -1);
    if (sff) {
        snprintf(pre, sizeof pre, "model.layers.%d.mlp.shared_expert", l);
        add_mlp(tab, n, pre, o->shared_w13 + j * 2 * sff * d, o->shared_w2 + j * d * sff, sff, d,
                l);
    }
    if (c->shared_gate) {
        snprintf(name, sizeof name, "model.layers.%d.mlp.shared_expert_gate.weight", l);
        add_tensor(tab, n, name, o->shared_gate + j * d, 1, d, l, 0, -1);
    }
    for (int e = 0; e < E; e++) { // global expert e, HF order, if it is in a local slot
        const int el = (slot_of ? slot_of[e] : e) - e0;
        if (el < 0 || el >= El) continue;
        const size_t w13 = o->w13 + (j * El + el) * 2 * ff * d, w2 = o->w2 + (j * El + el) * d * ff;
        const size_t at[3] = {w13, w2, w13 + (size_t)ff * d};
        for (int p = 0; p < 3; p++) { // w1 (gate), w2 (down), w3 (up) in HF's order
            int u = snprintf(pre, sizeof pre, "model.layers.%d.", l);
            u += snprintf(pre + u, sizeof pre - (size_t)u, fn->expert_fmt[p], e);
            snprintf(pre + u, sizeof pre - (size_t)u, ".weight");
            add_tensor(tab, n, pre, at[p], p == 1 ? d : ff, p == 1 ? ff : d, l,
                       p == 1 ? T_RESIDUAL : 0, e);
        }
    }
}

// The tensor table in the family's Hugging Face names, in HF order (tensor_count entries).
static void build_tensor_table(moe_model_tensor *tab, const moe_model_config *c, int El, int e0,
                               const int *slot_of) {
    params_offsets o;
    params_layout(&o, c, El, NULL);
    const int V = c->vocab_size, d = c->d_model, dff = dense_ff(c);
    int n = 0;
    add_tensor(tab, &n, "model.embed_tokens.weight", o.embed, V, d, -1, 0, -1);
    for (int l = 0; l < c->n_layers; l++) {
        add_attention(tab, &n, &o, c, l);
        if (moe_model_layer_is_moe(c, l)) {
            add_moe(tab, &n, &o, c, El, e0, slot_of, l);
        } else {
            const size_t j = (size_t)dense_index(c, l);
            char pre[64];
            snprintf(pre, sizeof pre, "model.layers.%d.mlp", l);
            add_mlp(tab, &n, pre, o.dense_w13 + j * 2 * dff * d, o.dense_w2 + j * d * dff, dff, d,
                    l);
        }
    }
    add_tensor(tab, &n, "model.norm.weight", o.final_norm, d, 0, -1, T_NORM, -1);
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
        if (!specs[i].bytes) continue; // a part this config does not have: stays NULL
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

    m->n_tensors = (int)tensor_count(cfg, m->E_local);
    m->tensors = calloc((size_t)m->n_tensors, sizeof *m->tensors);
    if (m->tensors) build_tensor_table(m->tensors, cfg, m->E_local, m->expert0, NULL);
    m->n_moe = n_moe;
    m->moe = calloc(n_moe, sizeof(moe_layer));
    m->moe_stats = calloc(L, sizeof(moe_stats));
    if (!m->tensors || !m->moe || !m->moe_stats)
        return moe_error(MOE_ENOMEM, "model: cannot allocate host tables");
    // Layer 0 allocates the backward scratch and the others share it: backwards run one
    // layer at a time (its bytes count as layer 0's). With recompute, the experts' hidden
    // activations likewise: layer 0's serve all, refilled by each layer's backward.
    for (int l = 0; l < n_moe; l++) {
        const moe_layer_shape shape = {.max_tokens = max_tokens,
                                       .ep = m->ep,
                                       .max_expert_rows = cfg->dropless_max_rows,
                                       .scratch = l ? m->moe[0].bwd : NULL,
                                       .forward_only = forward_only,
                                       .recompute = cfg->recompute != MOE_RECOMPUTE_NONE,
                                       .hidden_from = l ? &m->moe[0] : NULL};
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

// The buffers of the parts a config may add (mlp_h13 ... dshared_z in model.h), for Lk layers
// of T tokens; the backward's when training.
static moe_status alloc_extras(moe_model *m, size_t Lk, size_t T, size_t fm, int training) {
    const moe_model_config *c = &m->cfg;
    const size_t d = c->d_model, hd = moe_model_head_dim(c),
                 Q = (size_t)(c->n_heads + 2 * c->n_kv_heads) * hd, R = sizeof(real),
                 sy = c->shared_d_ff ? 1 : 0, sg = c->shared_gate ? 1 : 0, tr = training ? 1 : 0;
    int nq, nk, nh;
    qk_norm_widths(c, &nq, &nk, &nh);
    buffer_spec specs[] = {
        {(void **)&m->mlp_h13, Lk * T * 2 * fm * R},
        {(void **)&m->mlp_act, Lk * T * fm * R},
        {(void **)&m->shared_y, sy * Lk * T * d * R},
        {(void **)&m->shared_z, sg * Lk * T * R},
        {(void **)&m->qkv_pre, (nh ? Lk : 0) * T * Q * R},
        {(void **)&m->rstd_qk, Lk * T * (size_t)nh * R},
        {(void **)&m->dmlp_h13, tr * T * 2 * fm * R},
        {(void **)&m->dmlp_act, tr * T * fm * R},
        {(void **)&m->dmlp_y, tr * sg * T * d * R},
        {(void **)&m->dshared_z, tr * sg * T * R},
    };
    return alloc_all(m, specs, sizeof specs / sizeof specs[0]);
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
    moe_status st = create_common(m, be, cfg, ep, max_seq, moe_model_n_moe_layers(cfg), (int)T, 0);
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
    // The layers whose activations are kept: all, or one (recompute "layer": the others are
    // recomputed from x, which every layer keeps). bf16 keeps n1, qkv and attn_out of those
    // layers in bf16, and one layer's in fp32.
    const size_t La = cfg->recompute == MOE_RECOMPUTE_LAYER ? 1 : L, Lk = m->params16 ? 1 : La,
                 fm = mlp_ff_max(cfg);
    if (m->params16) {
        const size_t B16 = sizeof(moe_bf16);
        size_t g = V > Q ? V : Q;
        g = g > d ? g : d;
        g = g > H * hd ? g : H * hd;
        g = g > 2 * fm ? g : 2 * fm;
        buffer_spec b16[] = {
            {(void **)&m->n1_16, La * T * d * B16},
            {(void **)&m->qkv16, La * T * Q * B16},
            {(void **)&m->ao16, La * T * H * hd * B16},
            {(void **)&m->xf16, T * d * B16},
            {(void **)&m->g16, T * g * B16},
            {(void **)&m->n2_16, (fm ? La : 0) * T * d * B16},
            {(void **)&m->act16, La * T * fm * B16},
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
        {(void **)&m->rstd1, La * T * R},
        {(void **)&m->qkv, Lk * T * Q * R},
        {(void **)&m->lse, La * B * H * S * R},
        {(void **)&m->attn_out, Lk * T * H * hd * R},
        {(void **)&m->h, La * T * d * R},
        {(void **)&m->n2, La * T * d * R},
        {(void **)&m->rstd2, La * T * R},
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
    if ((st = alloc_all(m, specs, sizeof specs / sizeof specs[0])) ||
        (st = alloc_extras(m, La, T, fm, 1))) {
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
    const size_t fm = mlp_ff_max(cfg);
    if ((st = alloc_all(m, specs, sizeof specs / sizeof specs[0])) ||
        (st = alloc_extras(m, 1, C, fm, 0))) {
        moe_model_destroy(m);
        return st;
    }
    if (m->params16) { // the bf16 GEMM inputs of one chunk
        size_t g = Q > d ? Q : d;
        g = g > H * hd ? g : H * hd;
        g = g > fm ? g : fm;
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
        void *bufs[] = {m->params,   m->grads,    m->rope_cos,  m->rope_sin,    m->tokens,
                        m->targets,  m->x,        m->n1,        m->rstd1,       m->qkv,
                        m->lse,      m->attn_out, m->h,         m->n2,          m->rstd2,
                        m->moe_out,  m->xf,       m->rstdf,     m->logits,      m->losses,
                        m->dx,       m->dn,       m->dattn_out, m->dqkv,        m->attn_scratch,
                        m->dlogits,  m->k_cache,  m->v_cache,   m->router_bias, m->params16,
                        m->n1_16,    m->qkv16,    m->ao16,      m->xf16,        m->g16,
                        m->n2_16,    m->act16,    m->mlp_h13,   m->mlp_act,     m->shared_y,
                        m->shared_z, m->qkv_pre,  m->rstd_qk,   m->dmlp_h13,    m->dmlp_act,
                        m->dmlp_y,   m->dshared_z};
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
    moe_model_placement_permute(m, host + (m->p.router - m->params),
                                moe_model_n_moe_layers(&m->cfg), m->cfg.d_model, to_global);
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

// Its backward: dx [T, n_in] = dy W (written, or added when acc), dW += dy^T x. fp32 reads
// x, bf16 the x16 of the forward and dy rounded once (into g16) for both GEMMs.
static void linear_backward(moe_model *m, real *dx, real *dW, const real *dy, const real *x,
                            const moe_bf16 *x16, const real *W, int T, int n_out, int n_in,
                            int acc) {
    moe_backend *be = m->be;
    if (!m->params16) {
        be->matmul(be, dx, dy, W, T, n_in, n_out, 0, 0, (real)acc);
        be->matmul(be, dW, dy, x, n_out, n_in, T, 1, 0, 1);
        return;
    }
    be->to_bf16(be, m->g16, dy, (size_t)T * n_out);
    be->matmul_bf16(be, dx, m->g16, shadow(m, W), T, n_in, n_out, 0, 0, (real)acc);
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

// ---- the parts of 2025-26 models: q/k/v biases, q/k norm, dense MLPs, shared experts ----

// After the qkv projection of T rows of layer l: + biases, then q and k RMS-normalised
// (pre keeps the values before the norm, rstd the norms' [T, nh]; both unused without it).
static void qkv_extras_forward(moe_model *m, real *qkv, real *pre, real *rstd, int l, int T) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    const int H = c->n_heads, KV = c->n_kv_heads, hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd;
    if (c->qkv_bias) be->bias_add(be, qkv, m->p.bqkv + (size_t)l * Q, T, Q);
    if (!c->qk_norm) return;
    int nq, nk, nh;
    qk_norm_widths(c, &nq, &nk, &nh);
    const int hq = c->qk_norm == MOE_QK_NORM_FULL ? 1 : H, hk = nh - hq; // segments per row
    const real eps = (real)c->rms_norm_eps;
    be->copy_on_device(be, pre, qkv, (size_t)T * Q * sizeof(real));
    be->head_rmsnorm_forward(be, qkv, rstd, pre, m->p.q_norm + (size_t)l * nq, T, Q, hq, nq, eps);
    be->head_rmsnorm_forward(be, qkv + H * hd, rstd + (size_t)T * hq, pre + H * hd,
                             m->p.k_norm + (size_t)l * nk, T, Q, hk, nk, eps);
}

// Its backward, in place on dqkv [T, Q] (the gradient after the inverse RoPE).
static void qkv_extras_backward(moe_model *m, real *dqkv, const real *pre, const real *rstd, int l,
                                int T) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    const int H = c->n_heads, KV = c->n_kv_heads, hd = moe_model_head_dim(c), Q = (H + 2 * KV) * hd;
    if (c->qk_norm) {
        int nq, nk, nh;
        qk_norm_widths(c, &nq, &nk, &nh);
        const int hq = c->qk_norm == MOE_QK_NORM_FULL ? 1 : H, hk = nh - hq;
        be->head_rmsnorm_backward(be, dqkv, m->g.q_norm + (size_t)l * nq, dqkv, pre,
                                  m->p.q_norm + (size_t)l * nq, rstd, T, Q, hq, nq);
        be->head_rmsnorm_backward(be, dqkv + H * hd, m->g.k_norm + (size_t)l * nk, dqkv + H * hd,
                                  pre + H * hd, m->p.k_norm + (size_t)l * nk, rstd + (size_t)T * hq,
                                  T, Q, hk, nk);
    }
    if (c->qkv_bias) be->bias_backward(be, m->g.bqkv + (size_t)l * Q, dqkv, T, Q);
}

// One layer's MLP buffers (model.h: mlp_h13 ...), layer `slot` of them (inference: 0); x16 and
// act16 the bf16 inputs of its GEMMs (inference: the g16 work space).
typedef struct {
    real *h13, *act, *y, *z;
    moe_bf16 *x16, *act16;
} mlp_bufs;

static real *at(real *base, size_t off) { return base ? base + off : NULL; }

static mlp_bufs mlp_bufs_of(moe_model *m, int slot, int T) {
    const size_t fm = mlp_ff_max(&m->cfg), d = m->cfg.d_model, t = (size_t)slot * T;
    const mlp_bufs b = {.h13 = at(m->mlp_h13, t * 2 * fm),
                        .act = at(m->mlp_act, t * fm),
                        .y = at(m->shared_y, t * d),
                        .z = at(m->shared_z, t),
                        .x16 = m->training ? at16(m->n2_16, t * d) : m->g16,
                        .act16 = m->training ? at16(m->act16, t * fm) : m->g16};
    return b;
}

// y [T, d] = (silu(x W1^T) * (x W3^T)) W2^T: the SwiGLU MLP of a dense layer or a shared expert,
// w13 [2f, d] (W1's rows first, as an expert's), w2 [d, f]; b keeps h13 and act.
static void mlp_forward(moe_model *m, real *y, const real *x, const mlp_bufs *b, const real *w13,
                        const real *w2, int T, int f) {
    const int d = m->cfg.d_model;
    linear_forward(m, b->h13, x, b->x16, w13, T, 2 * f, d);
    m->be->swiglu_forward(m->be, b->act, b->h13, T, f);
    linear_forward(m, y, b->act, b->act16, w2, T, d, f);
}

// Its backward: dx += dL/dx, dw13 and dw2 += their gradients, for dy = dL/dy.
static void mlp_backward(moe_model *m, real *dx, real *dw13, real *dw2, const real *dy,
                         const real *x, const mlp_bufs *b, const real *w13, const real *w2, int T,
                         int f) {
    const int d = m->cfg.d_model;
    linear_backward(m, m->dmlp_act, dw2, dy, b->act, b->act16, w2, T, d, f, 0);
    m->be->swiglu_backward(m->be, m->dmlp_h13, m->dmlp_act, b->h13, T, f);
    linear_backward(m, dx, dw13, m->dmlp_h13, x, b->x16, w13, T, 2 * f, d, 1);
}

// The weights of layer l's MLP (dense layer or shared expert) in views p; *f its width.
static void mlp_weights(const moe_model *m, const moe_model_params *p, int l, real **w13, real **w2,
                        int *f) {
    const moe_model_config *c = &m->cfg;
    const size_t d = c->d_model;
    const int moe = moe_model_layer_is_moe(c, l);
    const size_t j = (size_t)(moe ? moe_model_moe_index(c, l) : dense_index(c, l));
    *f = moe ? c->shared_d_ff : dense_ff(c);
    *w13 = (moe ? p->shared_w13 : p->dense_w13) + j * 2 * (size_t)*f * d;
    *w2 = (moe ? p->shared_w2 : p->dense_w2) + j * d * (size_t)*f;
}

// The shared expert added to the MoE output: out += g(x) MLP_s(x), g = sigmoid(x . w_g) of
// MoE layer j (shared_gate) or 1.
static void shared_forward(moe_model *m, real *out, const real *x, const mlp_bufs *b,
                           const real *w13, const real *w2, int f, size_t j, int T) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    mlp_forward(m, b->y, x, b, w13, w2, T, f);
    if (!c->shared_gate) {
        be->add(be, out, out, b->y, (size_t)T * c->d_model);
        return;
    }
    linear_forward(m, b->z, x, b->x16, m->p.shared_gate + j * c->d_model, T, 1, c->d_model);
    be->sigmoid_gate_forward(be, out, b->z, b->y, T, c->d_model);
}

// Layer l's FFN of x = n2 [T, d] into out [T, d]: the dense MLP, or the MoE layer ml plus
// g(x) MLP_s(x). The MLPs' time is the "dense" phase's (the MoE layer laps its own phases).
static moe_status ffn_forward(moe_model *m, real *out, const real *x, moe_layer *ml, int l,
                              const mlp_bufs *b, int T, int S, moe_pass pass) {
    const moe_model_config *c = &m->cfg;
    real *w13, *w2;
    int f;
    mlp_weights(m, &m->p, l, &w13, &w2, &f);
    moe_status st = MOE_OK;
    if (!moe_model_layer_is_moe(c, l)) {
        memset(&m->moe_stats[l], 0, sizeof m->moe_stats[l]); // no load: no routing
        mlp_forward(m, out, x, b, w13, w2, T, f);
    } else {
        const moe_weights w = layer_weights(m, l);
        st = moe_layer_forward(ml, out, x, &w, T, S, pass, &m->moe_stats[l]);
        if (!st && c->shared_d_ff)
            shared_forward(m, out, x, b, w13, w2, f, (size_t)moe_model_moe_index(c, l), T);
    }
    moe_lap(m->timer, MOE_T_DENSE);
    return st;
}

// The shared expert's backward (MoE layer j): dx += dL/dx, its gradients +=.
static void shared_backward(moe_model *m, real *dx, const real *dout, const real *x,
                            const mlp_bufs *b, const real *w13, const real *w2, real *gw13,
                            real *gw2, int f, size_t j, int T) {
    const moe_model_config *c = &m->cfg;
    const size_t d = c->d_model;
    const real *dy = dout;
    if (c->shared_gate) { // out += s(z) y, z = x w_g^T: dy = s dout, dx += dz w_g
        m->be->sigmoid_gate_backward(m->be, m->dmlp_y, m->dshared_z, dout, b->z, b->y, T, (int)d);
        linear_backward(m, dx, m->g.shared_gate + j * d, m->dshared_z, x, b->x16,
                        m->p.shared_gate + j * d, T, 1, (int)d, 1);
        dy = m->dmlp_y;
    }
    mlp_backward(m, dx, gw13, gw2, dy, x, b, w13, w2, T, f);
}

// Its backward: dx += dL/dx (dx zeroed by the caller), every weight gradient +=.
static moe_status ffn_backward(moe_model *m, real *dx, const real *dout, const real *x, int l,
                               const mlp_bufs *b, int T, double loss_scale) {
    const moe_model_config *c = &m->cfg;
    real *w13, *w2, *gw13, *gw2;
    int f;
    mlp_weights(m, &m->p, l, &w13, &w2, &f);
    mlp_weights(m, &m->g, l, &gw13, &gw2, &f);
    moe_status st = MOE_OK;
    if (!moe_model_layer_is_moe(c, l)) {
        mlp_backward(m, dx, gw13, gw2, dout, x, b, w13, w2, T, f);
    } else {
        const size_t j = (size_t)moe_model_moe_index(c, l);
        moe_weights w = layer_weights(m, l), gw = layer_moe_weights(&m->g, c, m->E_local, l, NULL);
        st = moe_layer_backward(&m->moe[j], dx, &gw, dout, x, &w, loss_scale);
        if (!st && c->shared_d_ff) shared_backward(m, dx, dout, x, b, w13, w2, gw13, gw2, f, j, T);
    }
    moe_lap(m->timer, MOE_T_DENSE);
    return st;
}

// Layer l's activations: its slot in the [L, ...] buffers, l, or 0 when the backward recomputes
// each layer from its input (train.recompute "layer": one layer's buffers serve all); bf16
// keeps one layer of fp32 work space (n1, qkv, attn_out) either way.
typedef struct {
    real *x, *n1, *h, *n2, *qkv, *ao, *lse, *rstd1, *rstd2, *qkv_pre, *rstd_qk;
    moe_bf16 *n1_16, *qkv16, *ao16;
    mlp_bufs mlp;
} layer_bufs;

static layer_bufs layer_bufs_of(moe_model *m, int l, int B, int S) {
    const moe_model_config *c = &m->cfg;
    const size_t T = (size_t)B * S, d = c->d_model, H = c->n_heads, hd = moe_model_head_dim(c),
                 Q = (H + 2 * (size_t)c->n_kv_heads) * hd;
    const size_t a = c->recompute == MOE_RECOMPUTE_LAYER ? 0 : (size_t)l,
                 w = m->params16 ? 0 : a; // fp32 work space
    int nq, nk, n_qk;
    qk_norm_widths(c, &nq, &nk, &n_qk);
    const layer_bufs b = {.x = m->x + (size_t)l * T * d,
                          .n1 = m->n1 + w * T * d,
                          .h = m->h + a * T * d,
                          .n2 = m->n2 + a * T * d,
                          .qkv = m->qkv + w * T * Q,
                          .ao = m->attn_out + w * T * H * hd,
                          .lse = m->lse + a * B * H * S,
                          .rstd1 = m->rstd1 + a * T,
                          .rstd2 = m->rstd2 + a * T,
                          .qkv_pre = at(m->qkv_pre, a * T * Q),
                          .rstd_qk = at(m->rstd_qk, a * T * n_qk),
                          .n1_16 = at16(m->n1_16, a * T * d),
                          .qkv16 = at16(m->qkv16, a * T * Q),
                          .ao16 = at16(m->ao16, a * T * H * hd),
                          .mlp = mlp_bufs_of(m, (int)a, (int)T)};
    return b;
}

// Layer l's attention half: h = x_l + Attn(RMSNorm(x_l)) wo^T, then n2 = RMSNorm(h), the FFN's
// input; what the forward keeps (or recompute "layer" redoes) in b.
static void attention_half_forward(moe_model *m, const layer_bufs *b, int l, int B, int S) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    const int T = B * S, d = c->d_model, H = c->n_heads, hd = moe_model_head_dim(c),
              Q = (H + 2 * c->n_kv_heads) * hd;
    const size_t Td = (size_t)T * d;
    be->rmsnorm_forward(be, b->n1, b->rstd1, b->x, m->p.attn_norm + (size_t)l * d, T, d,
                        (real)c->rms_norm_eps);
    moe_lap(m->timer, MOE_T_DENSE);
    linear_forward(m, b->qkv, b->n1, b->n1_16, m->p.wqkv + (size_t)l * Q * d, T, Q, d);
    qkv_extras_forward(m, b->qkv, b->qkv_pre, b->rstd_qk, l, T);
    be->rope(be, b->qkv, b->qkv, m->rope_cos, m->rope_sin, qkv_rope(c, T, S, 0, 0));
    if (m->params16) { // q, k, v rounded once (kept for the backward); bf16 products
        be->to_bf16(be, b->qkv16, b->qkv, (size_t)T * Q);
        be->attention_forward_bf16(be, b->ao, b->lse, b->qkv16, attention_shape(c, B, S),
                                   m->attn_scratch, m->attn_scratch_size);
    } else {
        be->attention_forward(be, b->ao, b->lse, b->qkv, attention_shape(c, B, S), m->attn_scratch,
                              m->attn_scratch_size);
    }
    linear_forward(m, b->h, b->ao, b->ao16, m->p.wo + (size_t)l * d * H * hd, T, d, H * hd);
    be->add(be, b->h, b->h, b->x, Td);
    moe_lap(m->timer, MOE_T_ATTENTION);
    be->rmsnorm_forward(be, b->n2, b->rstd2, b->h, m->p.moe_norm + (size_t)l * d, T, d,
                        (real)c->rms_norm_eps);
    moe_lap(m->timer, MOE_T_DENSE);
}

// Recompute "layer": layer l's activations again from its kept input x_l, before its
// backward: the attention half, and the dense MLP's or the shared expert's (into moe_out, a
// work buffer then); the MoE layer recomputes its experts itself (moe_layer_shape.recompute),
// from the routing and rows it kept, so nothing is exchanged or routed again.
static void recompute_layer(moe_model *m, const layer_bufs *b, int l, int B, int S) {
    const moe_model_config *c = &m->cfg;
    const int T = B * S;
    attention_half_forward(m, b, l, B, S);
    real *w13, *w2;
    int f;
    mlp_weights(m, &m->p, l, &w13, &w2, &f);
    if (!moe_model_layer_is_moe(c, l))
        mlp_forward(m, m->moe_out, b->n2, &b->mlp, w13, w2, T, f);
    else if (c->shared_d_ff)
        shared_forward(m, m->moe_out, b->n2, &b->mlp, w13, w2, f, (size_t)moe_model_moe_index(c, l),
                       T);
    moe_lap(m->timer, MOE_T_DENSE);
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
    const int T = B * S, d = c->d_model, L = c->n_layers, V = c->vocab_size;
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
        const layer_bufs b = layer_bufs_of(m, l, B, S);
        attention_half_forward(m, &b, l, B, S);
        const int j = moe_model_moe_index(c, l);
        moe_layer *ml = j >= 0 ? &m->moe[j] : NULL;
        if (ml) ml->noise_key = m->noise_key ^ (0xD1B54A32D192ED03ull * (uint64_t)(l + 1));
        st = ffn_forward(m, m->moe_out, b.n2, ml, l, &b.mlp, T, S, pass);
        if (st) return moe_error_context(st, "layer %d", l);
        be->add(be, m->x + (l + 1) * Td, b.h, m->moe_out, Td);
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

// Layer l's attention half backward: dx holds dL/dh and becomes dL/dx_l (+= through the norm).
static void attention_half_backward(moe_model *m, const layer_bufs *b, int l, int B, int S) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    const int T = B * S, d = c->d_model, H = c->n_heads, hd = moe_model_head_dim(c),
              Q = (H + 2 * c->n_kv_heads) * hd;
    // h = x_l + attn_out wo^T: dx becomes dL/dx_l
    linear_backward(m, m->dattn_out, m->g.wo + (size_t)l * d * H * hd, m->dx, b->ao, b->ao16,
                    m->p.wo + (size_t)l * d * H * hd, T, d, H * hd, 0);
    if (m->params16) { // do rounded once (g16 is free again); q, k, v and o as kept
        be->to_bf16(be, m->g16, m->dattn_out, (size_t)T * H * hd);
        be->attention_backward_bf16(be, m->dqkv, m->g16, b->qkv16, b->ao16, b->lse,
                                    attention_shape(c, B, S), m->attn_scratch,
                                    m->attn_scratch_size);
    } else {
        be->attention_backward(be, m->dqkv, m->dattn_out, b->qkv, b->ao, b->lse,
                               attention_shape(c, B, S), m->attn_scratch, m->attn_scratch_size);
    }
    be->rope(be, m->dqkv, m->dqkv, m->rope_cos, m->rope_sin, qkv_rope(c, T, S, 0, 1));
    qkv_extras_backward(m, m->dqkv, b->qkv_pre, b->rstd_qk, l, T);
    linear_backward(m, m->dn, m->g.wqkv + (size_t)l * Q * d, m->dqkv, b->n1, b->n1_16,
                    m->p.wqkv + (size_t)l * Q * d, T, Q, d, 0);
    moe_lap(m->timer, MOE_T_ATTENTION);
    be->rmsnorm_backward(be, m->dx, m->g.attn_norm + (size_t)l * d, m->dn, b->x,
                         m->p.attn_norm + (size_t)l * d, b->rstd1, T, d);
}

moe_status moe_model_backward(moe_model *m, double loss_scale) {
    const moe_model_config *c = &m->cfg;
    moe_backend *be = m->be;
    if (m->B == 0 || !m->training) return moe_error(MOE_EINVAL, "model: backward before forward");
    const int B = m->B, S = m->S, T = B * S, d = c->d_model, L = c->n_layers, V = c->vocab_size;
    const size_t Td = (size_t)T * d;

    moe_timer *tm = m->timer;
    moe_lap_start(tm);
    // logits = xf lm_head^T; CE is a mean over T tokens
    be->cross_entropy_backward(be, m->dlogits, m->logits, m->targets, T, V, (real)(loss_scale / T));
    // dxf = dlogits lm_head, dlm += dlogits^T xf
    linear_backward(m, m->dn, m->g.lm_head, m->dlogits, m->xf, m->xf16, m->p.lm_head, T, V, d, 0);
    be->zero(be, m->dx, Td * sizeof(real));
    be->rmsnorm_backward(be, m->dx, m->g.final_norm, m->dn, m->x + (size_t)L * Td, m->p.final_norm,
                         m->rstdf, T, d);

    for (int l = L - 1; l >= 0; l--) {
        const layer_bufs b = layer_bufs_of(m, l, B, S);
        if (c->recompute == MOE_RECOMPUTE_LAYER) recompute_layer(m, &b, l, B, S);
        // x_{l+1} = h + FFN(n2), n2 = RMSNorm(h): dx holds dL/dx_{l+1}, becomes dL/dh
        be->zero(be, m->dn, Td * sizeof(real));
        moe_lap(tm, MOE_T_DENSE);
        moe_status st = ffn_backward(m, m->dn, m->dx, b.n2, l, &b.mlp, T, loss_scale);
        if (st) return moe_error_context(st, "layer %d", l);
        be->rmsnorm_backward(be, m->dx, m->g.moe_norm + (size_t)l * d, m->dn, b.h,
                             m->p.moe_norm + (size_t)l * d, b.rstd2, T, d);
        moe_lap(tm, MOE_T_DENSE);
        attention_half_backward(m, &b, l, B, S);
    }
    be->embedding_backward(be, m->g.embed, m->dx, m->tokens, T, d);
    moe_lap(tm, MOE_T_DENSE);
    return MOE_OK;
}

moe_status moe_model_set_aux_counts(moe_model *m, const long *counts, long tokens) {
    const moe_model_config *c = &m->cfg;
    const int E = c->moe.n_experts;
    int *layer = malloc((size_t)E * sizeof(int));
    if (!layer) return moe_error(MOE_ENOMEM, "model: out of memory");
    moe_status st = MOE_OK;
    if (counts && (tokens < 1 || tokens > INT_MAX))
        st = moe_error(MOE_EINVAL, "model: %ld tokens for the global aux loss exceed an int",
                       tokens);
    for (int l = 0; !st && l < c->n_layers; l++) {
        const int j = moe_model_moe_index(c, l);
        if (j < 0) continue;
        for (int e = 0; counts && e < E && !st; e++) {
            const long n = counts[(size_t)l * E + e];
            if (n < 0 || n > INT_MAX)
                st = moe_error(MOE_EINVAL,
                               "model: layer %d expert %d: %ld assignments exceed an int", l, e, n);
            layer[e] = (int)n;
        }
        if (!st) moe_layer_set_aux_counts(&m->moe[j], counts ? layer : NULL, (int)tokens);
    }
    free(layer);
    return st;
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
        qkv_extras_forward(m, m->qkv, m->qkv_pre, m->rstd_qk, l, n);
        infer_attention(m, l, n, slot, pos0, slots, pos);
        linear_forward(m, m->moe_out, m->attn_out, m->g16, m->p.wo + (size_t)l * d * H * hd, n, d,
                       H * hd);
        be->add(be, m->x, m->x, m->moe_out, nd);
        // x += MoE(RMSNorm(x)), dropless: a batch's rows are routed together
        be->rmsnorm_forward(be, m->n1, m->rstd1, m->x, m->p.moe_norm + (size_t)l * d, n, d, eps);
        const mlp_bufs mb = mlp_bufs_of(m, 0, n);
        const int is_moe = moe_model_layer_is_moe(c, l);
        st = ffn_forward(m, m->moe_out, m->n1, is_moe ? &m->moe[0] : NULL, l, &mb, n, n,
                         moe_pass_infer());
        if (st) return moe_error_context(st, "layer %d", l);
        for (int e = 0; is_moe && e < c->moe.n_experts; e++)
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
