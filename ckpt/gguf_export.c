// moe_export_gguf (ckpt/gguf.h): a checkpoint as a GGUF file of the llama.cpp architecture of
// its family, with its tokenizer (ckpt/gguf_vocab.h). docs/checkpoints.md "GGUF for llama.cpp".
#define _GNU_SOURCE // access

#include "ckpt/gguf.h"

#include "ckpt/ckpt_internal.h"
#include "ckpt/gguf_vocab.h"
#include "ckpt/path_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

// What a llama.cpp architecture computes (its src/models/ARCH.cpp), beside what every one of
// these four does: RMSNorm, softmax attention scaled by 1/sqrt(head_dim) with RoPE on the
// whole head, and per layer a softmax router over every expert, the top k, SwiGLU experts.
// No dense layers, no selection bias, no groups, no scaling of the expert weights.
typedef struct {
    moe_family family;
    const char *name;    // general.architecture, the keys' prefix
    int rope_pairs;      // GGML's normal RoPE (neighbours 2i, 2i+1): q/k rows permuted from
                         // HF's halves; else NEOX RoPE, HF's own layout
    int norm_topk;       // the top-k weights renormalised (build_moe_ffn's norm_w), always
    moe_qk_norm qk_norm; // the q/k norm it applies (always)
    int shared;          // a shared expert gated by sigmoid(x . w) (always: required tensors)
    int biases;          // q/k/v biases (required tensors: zeros when the model has none)
    int square_attn;     // q and o are [d, d] (H hd == d), k and v [d, KV hd]
    int output_needed;   // output.weight even when the embeddings are tied
    int expert_ff_key;   // {arch}.expert_feed_forward_length
} gguf_arch;

static const gguf_arch archs[] = {
    {MOE_FAMILY_MIXTRAL, "llama", 1, 1, MOE_QK_NORM_NONE, 0, 0, 0, 0, 0},
    {MOE_FAMILY_QWEN3_MOE, "qwen3moe", 0, 1, MOE_QK_NORM_HEAD, 0, 0, 0, 0, 1},
    {MOE_FAMILY_QWEN2_MOE, "qwen2moe", 0, 0, MOE_QK_NORM_NONE, 1, 1, 1, 1, 1},
    {MOE_FAMILY_OLMOE, "olmoe", 0, 0, MOE_QK_NORM_FULL, 0, 0, 1, 1, 0},
};

static const gguf_arch *arch_of(moe_family f) {
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        if (archs[i].family == f) return &archs[i];
    return NULL;
}

// The config.json field the architecture cannot represent (and its value), NULL when none.
static const char *unsupported(const gguf_arch *a, const moe_model_config *c, char *value, size_t n,
                               const char **why) {
#define REFUSE(field, reason, ...) (snprintf(value, n, __VA_ARGS__), *why = (reason), (field))
    if (moe_model_n_moe_layers(c) < c->n_layers)
        return REFUSE("mlp_only_layers", "every layer of it is a MoE layer", "non-empty");
    if (c->qk_norm != a->qk_norm)
        return REFUSE("q_norm/k_norm",
                      a->qk_norm == MOE_QK_NORM_NONE   ? "it has no q/k norm"
                      : a->qk_norm == MOE_QK_NORM_HEAD ? "it norms q and k per head, always"
                                                       : "it norms the whole q and k, always",
                      "%s", c->qk_norm ? "present" : "absent");
    if (c->qkv_bias && !a->biases)
        return REFUSE("attention_bias", "it reads no q/k/v biases", "true");
    if (!!c->shared_d_ff != a->shared)
        return REFUSE("shared_expert_intermediate_size",
                      a->shared ? "it always has a shared expert" : "it has no shared expert", "%d",
                      c->shared_d_ff);
    if (a->shared && !c->shared_gate)
        return REFUSE("shared_expert_gate", "it always gates the shared expert by a sigmoid",
                      "absent");
    const int hd = moe_model_head_dim(c);
    if (a->square_attn && c->n_heads * hd != c->d_model)
        return REFUSE("head_dim", "its q projection is hidden_size wide", "%d", hd);
    if (a->qk_norm == MOE_QK_NORM_FULL && c->n_kv_heads != c->n_heads)
        return REFUSE("num_key_value_heads", "its k norm is hidden_size wide", "%d", c->n_kv_heads);
    if (c->moe.norm_topk_prob != a->norm_topk)
        return REFUSE("norm_topk_prob",
                      a->norm_topk ? "it always renormalises the top-k weights"
                                   : "it never renormalises the top-k weights",
                      "%s", c->moe.norm_topk_prob ? "true" : "false");
    if (c->moe.scoring != MOE_SCORE_SOFTMAX)
        return REFUSE("scoring_func", "it gates with a softmax", "\"sigmoid\"");
    if (c->moe.route_scale != 1.0)
        return REFUSE("routed_scaling_factor", "it does not scale the expert weights", "%g",
                      c->moe.route_scale);
    if (c->router_bias) return REFUSE("router_bias", "it has no selection bias", "true");
    if (c->moe.n_group > 1)
        return REFUSE("n_group", "it has no group-limited routing", "%d", c->moe.n_group);
    return NULL;
#undef REFUSE
}

static moe_status check_arch(const moe_model_config *c, const char *folder) {
    const gguf_arch *a = arch_of(c->family);
    char value[64];
    const char *why = NULL, *field = a ? unsupported(a, c, value, sizeof value, &why) : NULL;
    if (!a)
        return moe_error(MOE_EINVAL, "%s/config.json: model_type = \"%s\": no GGUF architecture",
                         folder, moe_model_family_name(c->family));
    if (field)
        return moe_error(MOE_EINVAL,
                         "%s/config.json: %s = %s: not written to GGUF: llama.cpp's %s "
                         "architecture (model_type \"%s\"): %s",
                         folder, field, value, a->name, moe_model_family_name(c->family), why);
    return MOE_OK;
}

// general.file_type: llama.cpp's LLAMA_FTYPE of the whole file.
static uint32_t file_type(moe_ggml_type t) {
    switch (t) {
    case MOE_GGML_F32: return 0;   // ALL_F32
    case MOE_GGML_F16: return 1;   // MOSTLY_F16
    case MOE_GGML_Q8_0: return 7;  // MOSTLY_Q8_0
    case MOE_GGML_BF16: return 32; // MOSTLY_BF16
    }
    return 0;
}

static moe_status arch_u32(moe_gguf_writer *w, const gguf_arch *a, const char *key, int v) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", a->name, key);
    return moe_gguf_kv_u32(w, k, (uint32_t)v);
}

static moe_status arch_f32(moe_gguf_writer *w, const gguf_arch *a, const char *key, double v) {
    char k[96];
    snprintf(k, sizeof k, "%s.%s", a->name, key);
    return moe_gguf_kv_f32(w, k, (float)v);
}

static moe_status write_keys(moe_gguf_writer *w, const moe_model_config *c, const char *name,
                             moe_ggml_type type, const moe_gguf_vocab *vocab) {
    const gguf_arch *a = arch_of(c->family);
    const int hd = moe_model_head_dim(c);
    moe_status st = moe_gguf_kv_str(w, "general.architecture", a->name);
    if (!st) st = moe_gguf_kv_str(w, "general.name", name);
    if (!st) st = moe_gguf_kv_u32(w, "general.file_type", file_type(type));
    if (!st) st = moe_gguf_kv_u32(w, "general.quantization_version", 2);
    if (!st) st = moe_gguf_kv_u32(w, "general.alignment", MOE_GGUF_ALIGNMENT);
    if (!st) st = arch_u32(w, a, "vocab_size", vocab->n_tokens);
    if (!st) st = arch_u32(w, a, "context_length", c->max_seq_len);
    if (!st) st = arch_u32(w, a, "embedding_length", c->d_model);
    if (!st) st = arch_u32(w, a, "block_count", c->n_layers);
    if (!st) st = arch_u32(w, a, "feed_forward_length", c->moe.d_ff);
    if (!st && a->expert_ff_key) st = arch_u32(w, a, "expert_feed_forward_length", c->moe.d_ff);
    if (!st && a->shared) st = arch_u32(w, a, "expert_shared_feed_forward_length", c->shared_d_ff);
    if (!st) st = arch_u32(w, a, "attention.head_count", c->n_heads);
    if (!st) st = arch_u32(w, a, "attention.head_count_kv", c->n_kv_heads);
    if (!st && hd * c->n_heads != c->d_model) {
        st = arch_u32(w, a, "attention.key_length", hd);
        if (!st) st = arch_u32(w, a, "attention.value_length", hd);
    }
    if (!st) st = arch_u32(w, a, "rope.dimension_count", hd);
    if (!st) st = arch_f32(w, a, "rope.freq_base", c->rope_theta);
    if (!st) st = arch_f32(w, a, "attention.layer_norm_rms_epsilon", c->rms_norm_eps);
    if (!st) st = arch_u32(w, a, "expert_count", c->moe.n_experts);
    if (!st) st = arch_u32(w, a, "expert_used_count", c->moe.top_k);
    return st ? st : moe_gguf_vocab_write(w, vocab);
}

// One GGUF tensor and where its values come from in the checkpoint's host image.
typedef enum {
    SRC_COPY,    // one HF tensor as it is (a [1, n] one as a vector), then extra_rows zero rows
    SRC_ROPE,    // q_proj/k_proj with each head's rows permuted to GGML's RoPE pairs
    SRC_EXPERTS, // the experts' HF tensors of a layer (expert_fmt) stacked
    SRC_ZEROS,   // zeros (q/k/v biases llama.cpp requires of a model without them)
} src_kind;

typedef struct {
    char name[64];
    src_kind kind;
    const moe_model_tensor *src; // SRC_COPY, SRC_ROPE
    int heads, extra_rows;       // SRC_ROPE: heads of src; SRC_COPY: zero rows after src
    int layer;                   // SRC_EXPERTS
    char expert_fmt[64];         // SRC_EXPERTS: "...experts.%d.gate_proj.weight" after the layer
    int n_dims;
    int64_t ne[3];
    moe_ggml_type type;
} gguf_item;

typedef struct {
    const moe_model_tensor *tab;
    int n_tab;
    const real *host;
    const moe_model_config *cfg;
    const gguf_arch *arch;
    moe_ggml_type type;
    int extra_rows; // the vocabulary's tokens beyond the model's (zero rows)
    gguf_item *items;
    int n_items;
} export_plan;

static const moe_model_tensor *find(const export_plan *p, const char *name) {
    for (int i = 0; i < p->n_tab; i++)
        if (!strcmp(p->tab[i].name, name)) return &p->tab[i];
    return NULL;
}

// The item's type: vectors and the router stay f32 (llama.cpp's converter keeps them so);
// a q8_0 tensor whose rows are not whole blocks is f16 (the converter's fallback).
static moe_ggml_type item_type(const export_plan *p, const gguf_item *it, int is_router) {
    if (it->n_dims == 1 || is_router) return MOE_GGML_F32;
    if (p->type == MOE_GGML_Q8_0 && it->ne[0] % MOE_GGML_QK8_0) return MOE_GGML_F16;
    return p->type;
}

static gguf_item *new_item(export_plan *p, src_kind kind, const char *fmt, int l) {
    gguf_item *it = &p->items[p->n_items++];
    memset(it, 0, sizeof *it);
    snprintf(it->name, sizeof it->name, fmt, l);
    it->kind = kind, it->layer = l;
    return it;
}

// A tensor from one HF tensor (hf_fmt with the layer): its shape, [1, n] as a vector.
static moe_status add_copy(export_plan *p, const char *gguf_fmt, src_kind kind, const char *hf_fmt,
                           int l, int heads, int extra_rows, int is_router) {
    char hf[128];
    snprintf(hf, sizeof hf, hf_fmt, l);
    gguf_item *it = new_item(p, kind, gguf_fmt, l);
    if (!(it->src = find(p, hf))) return moe_error(MOE_EIO, "GGUF export: no tensor '%s'", hf);
    it->heads = heads, it->extra_rows = extra_rows;
    const int rows = it->src->rows, cols = it->src->cols;
    it->n_dims = cols ? 2 : 1;
    it->ne[0] = cols ? cols : rows, it->ne[1] = rows + extra_rows;
    it->type = item_type(p, it, is_router);
    return MOE_OK;
}

static void add_zeros(export_plan *p, const char *gguf_fmt, int l, int n) {
    gguf_item *it = new_item(p, SRC_ZEROS, gguf_fmt, l);
    it->n_dims = 1, it->ne[0] = n, it->type = MOE_GGML_F32;
}

// A layer's experts' projection (HF hf_fmt after "model.layers.L.") stacked: [E, rows, cols].
static moe_status add_experts(export_plan *p, const char *gguf_fmt, const char *hf_fmt, int l) {
    gguf_item *it = new_item(p, SRC_EXPERTS, gguf_fmt, l);
    snprintf(it->expert_fmt, sizeof it->expert_fmt, "%s", hf_fmt);
    char first[128];
    const int u = snprintf(first, sizeof first, "model.layers.%d.", l);
    snprintf(first + u, sizeof first - (size_t)u, hf_fmt, 0);
    const moe_model_tensor *e0 = find(p, first);
    if (!e0) return moe_error(MOE_EIO, "GGUF export: no tensor '%s'", first);
    it->n_dims = 3;
    it->ne[0] = e0->cols, it->ne[1] = e0->rows, it->ne[2] = p->cfg->moe.n_experts;
    it->type = item_type(p, it, 0);
    return MOE_OK;
}

// Layer l's attention: norm, q k v (biases, norms), o.
static moe_status add_attention(export_plan *p, int l) {
    const moe_model_config *c = p->cfg;
    const gguf_arch *a = p->arch;
    const src_kind qk = a->rope_pairs ? SRC_ROPE : SRC_COPY;
    const int hd = moe_model_head_dim(c), kv_rows = c->n_kv_heads * hd;
    moe_status st = add_copy(p, "blk.%d.attn_norm.weight", SRC_COPY,
                             "model.layers.%d.input_layernorm.weight", l, 0, 0, 0);
    if (!st)
        st = add_copy(p, "blk.%d.attn_q.weight", qk, "model.layers.%d.self_attn.q_proj.weight", l,
                      c->n_heads, 0, 0);
    if (!st)
        st = add_copy(p, "blk.%d.attn_k.weight", qk, "model.layers.%d.self_attn.k_proj.weight", l,
                      c->n_kv_heads, 0, 0);
    if (!st)
        st = add_copy(p, "blk.%d.attn_v.weight", SRC_COPY,
                      "model.layers.%d.self_attn.v_proj.weight", l, 0, 0, 0);
    if (!st && a->biases && c->qkv_bias) {
        static const char *const proj[3][2] = {
            {"blk.%d.attn_q.bias", "model.layers.%d.self_attn.q_proj.bias"},
            {"blk.%d.attn_k.bias", "model.layers.%d.self_attn.k_proj.bias"},
            {"blk.%d.attn_v.bias", "model.layers.%d.self_attn.v_proj.bias"}};
        for (int i = 0; i < 3 && !st; i++)
            st = add_copy(p, proj[i][0], SRC_COPY, proj[i][1], l, 0, 0, 0);
    } else if (!st && a->biases) {
        add_zeros(p, "blk.%d.attn_q.bias", l, c->n_heads * hd);
        add_zeros(p, "blk.%d.attn_k.bias", l, kv_rows);
        add_zeros(p, "blk.%d.attn_v.bias", l, kv_rows);
    }
    if (!st && c->qk_norm) {
        st = add_copy(p, "blk.%d.attn_q_norm.weight", SRC_COPY,
                      "model.layers.%d.self_attn.q_norm.weight", l, 0, 0, 0);
        if (!st)
            st = add_copy(p, "blk.%d.attn_k_norm.weight", SRC_COPY,
                          "model.layers.%d.self_attn.k_norm.weight", l, 0, 0, 0);
    }
    if (!st)
        st = add_copy(p, "blk.%d.attn_output.weight", SRC_COPY,
                      "model.layers.%d.self_attn.o_proj.weight", l, 0, 0, 0);
    return st;
}

// Layer l's MoE: norm, router, experts (ne [d, ff, E] for gate and up, [ff, d, E] for down),
// the shared expert and its gate.
static moe_status add_moe(export_plan *p, int l) {
    const int mixtral = p->cfg->family == MOE_FAMILY_MIXTRAL;
    const char *router = mixtral ? "model.layers.%d.block_sparse_moe.gate.weight"
                                 : "model.layers.%d.mlp.gate.weight";
    static const char *const gguf[3] = {"blk.%d.ffn_gate_exps.weight",
                                        "blk.%d.ffn_down_exps.weight", "blk.%d.ffn_up_exps.weight"},
                             *hf_mixtral[3] = {"block_sparse_moe.experts.%d.w1.weight",
                                               "block_sparse_moe.experts.%d.w2.weight",
                                               "block_sparse_moe.experts.%d.w3.weight"},
                             *hf_qwen[3] = {"mlp.experts.%d.gate_proj.weight",
                                            "mlp.experts.%d.down_proj.weight",
                                            "mlp.experts.%d.up_proj.weight"};
    moe_status st = add_copy(p, "blk.%d.ffn_norm.weight", SRC_COPY,
                             "model.layers.%d.post_attention_layernorm.weight", l, 0, 0, 0);
    if (!st) st = add_copy(p, "blk.%d.ffn_gate_inp.weight", SRC_COPY, router, l, 0, 0, 1);
    for (int i = 0; i < 3 && !st; i++)
        st = add_experts(p, gguf[i], (mixtral ? hf_mixtral : hf_qwen)[i], l);
    if (!st && p->arch->shared) {
        static const char *const sh[4][2] = {
            {"blk.%d.ffn_gate_inp_shexp.weight", "model.layers.%d.mlp.shared_expert_gate.weight"},
            {"blk.%d.ffn_gate_shexp.weight", "model.layers.%d.mlp.shared_expert.gate_proj.weight"},
            {"blk.%d.ffn_down_shexp.weight", "model.layers.%d.mlp.shared_expert.down_proj.weight"},
            {"blk.%d.ffn_up_shexp.weight", "model.layers.%d.mlp.shared_expert.up_proj.weight"}};
        for (int i = 0; i < 4 && !st; i++)
            st = add_copy(p, sh[i][0], SRC_COPY, sh[i][1], l, 0, 0, 0);
        gguf_item *gate = &p->items[p->n_items - 4]; // HF's [1, d] as llama.cpp's vector [d]
        if (!st) gate->n_dims = 1, gate->type = MOE_GGML_F32;
    }
    return st;
}

// llama.cpp's tensors of the model.
static moe_status plan_items(export_plan *p) {
    const moe_model_config *c = p->cfg;
    p->items = calloc((size_t)(3 + 24 * c->n_layers), sizeof *p->items);
    if (!p->items) return moe_error(MOE_ENOMEM, "GGUF export: out of memory");
    moe_status st = add_copy(p, "token_embd.weight", SRC_COPY, "model.embed_tokens.weight", -1, 0,
                             p->extra_rows, 0);
    for (int l = 0; l < c->n_layers && !st; l++) {
        st = add_attention(p, l);
        if (!st) st = add_moe(p, l);
    }
    if (!st) st = add_copy(p, "output_norm.weight", SRC_COPY, "model.norm.weight", -1, 0, 0, 0);
    // tied embeddings: no output.weight where llama.cpp then uses token_embd, else its copy
    if (!st && (!c->tie_embeddings || p->arch->output_needed))
        st = add_copy(p, "output.weight", SRC_COPY,
                      c->tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight", -1, 0,
                      p->extra_rows, 0);
    return st;
}

static uint64_t item_values(const gguf_item *it) {
    uint64_t n = 1;
    for (int d = 0; d < it->n_dims; d++) n *= (uint64_t)it->ne[d];
    return n;
}

// The item's values (ne[0] fastest) into dst.
static moe_status fill_item(const export_plan *p, const gguf_item *it, float *dst) {
    if (it->kind == SRC_ZEROS) {
        memset(dst, 0, (size_t)item_values(it) * sizeof *dst);
        return MOE_OK;
    }
    if (it->kind == SRC_EXPERTS) {
        const size_t per = (size_t)it->ne[0] * (size_t)it->ne[1];
        for (int e = 0; e < p->cfg->moe.n_experts; e++) {
            char name[128];
            int u = snprintf(name, sizeof name, "model.layers.%d.", it->layer);
            snprintf(name + u, sizeof name - (size_t)u, it->expert_fmt, e);
            const moe_model_tensor *t = find(p, name);
            if (!t) return moe_error(MOE_EIO, "GGUF export: no tensor '%s'", name);
            memcpy(dst + e * per, p->host + t->offset, per * sizeof *dst);
        }
        return MOE_OK;
    }
    const moe_model_tensor *t = it->src;
    const size_t cols = t->cols ? (size_t)t->cols : 1, n = (size_t)t->rows * cols;
    const real *src = p->host + t->offset;
    if (it->kind == SRC_COPY) {
        memcpy(dst, src, n * sizeof *dst);
        memset(dst + n, 0, (size_t)it->extra_rows * cols * sizeof *dst);
        return MOE_OK;
    }
    // SRC_ROPE: HF rotates halves (pairs i, i + hd/2 of a head), GGML's normal RoPE rotates
    // neighbours (2i, 2i + 1): row 2i + j of a head in the file is its HF row j hd/2 + i,
    // as llama.cpp's converter permutes q and k for the llama architecture
    const int hd = t->rows / it->heads, half = hd / 2;
    for (int hh = 0; hh < it->heads; hh++)
        for (int i = 0; i < half; i++)
            for (int j = 0; j < 2; j++)
                memcpy(dst + ((size_t)hh * hd + 2 * i + j) * cols,
                       src + ((size_t)hh * hd + (size_t)j * half + i) * cols, cols * sizeof *dst);
    return MOE_OK;
}

// A folder named step_NNNNNNNN or holding trainer_state.json is a moe.c checkpoint (as
// moe_hf_load_weights decides): verified before it is read.
static moe_status verify_if_checkpoint(const char *folder) {
    char path[PATH_BUF];
    long long step;
    path_fmt(path, sizeof path, "%s/trainer_state.json", folder);
    const int has_state = access(path, F_OK) == 0;
    if (!has_state && !ckpt_folder_step(folder, &step)) return MOE_OK;
    if (!has_state)
        return moe_error(MOE_EIO,
                         "%s: a moe.c checkpoint folder without its trainer_state.json "
                         "(damaged or incomplete; an HF folder must not be named step_N)",
                         folder);
    return moe_checkpoint_verify(folder);
}

// general.name: the folder's name, or RUN/step_N for RUN/ckpt/step_N.
static void model_name(char *out, size_t n, const char *folder) {
    char f[PATH_BUF];
    path_fmt(f, sizeof f, "%s", folder);
    size_t len = strlen(f);
    while (len > 1 && f[len - 1] == '/') f[--len] = '\0';
    char *base = strrchr(f, '/');
    long long step;
    if (base && ckpt_folder_step(f, &step)) {
        *base = '\0';
        char *parent = strrchr(f, '/');
        parent = parent ? parent + 1 : f;
        if (!strcmp(parent, "ckpt") && parent > f + 1) {
            parent[-1] = '\0';
            char *run = strrchr(f, '/');
            snprintf(out, n, "%s/%s", run ? run + 1 : f, base + 1);
            return;
        }
        snprintf(out, n, "%s", base + 1);
        return;
    }
    snprintf(out, n, "%s", base ? base + 1 : f);
}

moe_status moe_export_gguf(const char *ckpt_folder, const char *out_path, const char *type_name) {
    char folder[PATH_BUF], name[256];
    moe_ggml_type type = MOE_GGML_F32;
    moe_model_config cfg;
    struct stat sb;
    moe_status st = moe_ggml_type_parse(type_name, &type);
    if (!st && check_path_arg(out_path)) st = MOE_EINVAL;
    if (!st) st = moe_checkpoint_resolve(folder, sizeof folder, ckpt_folder);
    if (!st) st = moe_hf_config_read(&cfg, folder);
    if (!st) st = check_arch(&cfg, folder);
    if (st) return st;
    moe_gguf_vocab vocab;
    if ((st = moe_gguf_vocab_read(&vocab, folder, cfg.vocab_size))) return st;
    if (stat(out_path, &sb) == 0)
        st = moe_error(MOE_EINVAL, "%s: already exists (export never overwrites)", out_path);
    if (!st) st = moe_hf_check_sizes(folder, &cfg);
    if (!st) st = verify_if_checkpoint(folder);

    export_plan p = {.cfg = &cfg, .arch = arch_of(cfg.family), .type = type};
    p.extra_rows = vocab.n_tokens - cfg.vocab_size;
    p.n_tab = (int)moe_model_tensor_count(&cfg);
    p.tab = st ? NULL : moe_model_tensor_table(&cfg);
    real *host = st ? NULL : malloc(moe_model_param_count(&cfg) * sizeof(real));
    p.host = host;
    float *scratch = NULL;
    moe_gguf_writer *w = NULL;
    if (!st && (!p.tab || !host)) st = moe_error(MOE_ENOMEM, "GGUF export: out of memory");
    if (!st) st = ckpt_load_tensors(host, p.tab, p.n_tab, folder, NULL, NULL);
    if (!st) st = plan_items(&p);
    uint64_t most = 0;
    for (int i = 0; i < p.n_items; i++)
        most = item_values(&p.items[i]) > most ? item_values(&p.items[i]) : most;
    if (!st && !(scratch = malloc((size_t)most * sizeof *scratch)))
        st = moe_error(MOE_ENOMEM, "GGUF export: out of memory");
    if (!st) st = moe_gguf_writer_create(&w, out_path);
    if (!st) model_name(name, sizeof name, folder), st = write_keys(w, &cfg, name, type, &vocab);
    for (int i = 0; i < p.n_items && !st; i++)
        st = moe_gguf_add_tensor(w, p.items[i].name, p.items[i].n_dims, p.items[i].ne,
                                 p.items[i].type);
    for (int i = 0; i < p.n_items && !st; i++) {
        st = fill_item(&p, &p.items[i], scratch);
        if (!st) st = moe_gguf_write_tensor(w, scratch);
    }
    if (!st) st = moe_gguf_finish(w);
    moe_gguf_writer_free(w);
    moe_gguf_vocab_free(&vocab);
    free(scratch), free(p.items), free(host), free((void *)p.tab);
    return st;
}
