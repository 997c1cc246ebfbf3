// The checks across keys, after each key alone is in range: the combinations (top_k <=
// n_experts, GQA, head_dim, auto capacity's keys, seq_len <= max_seq_len, ...), the sizes that
// products of values give (bounded in 64 bits: config.h's MOE_CONFIG_MAX_*), and the expert
// placement. An error names each key, its value and where it was set (or " (default)").
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "config/config_internal.h"

// "group.key = VALUE" plus " (default)" when the file does not set it, or " (at WHERE)" when
// it is set somewhere other than `here`.
static void describe(const load_ctx *c, const moe_train_config *cfg, int idx,
                     const config_setting_t *here, char *buf, size_t n) {
    const key_spec *k = &moe_cfg_specs[idx];
    const char *field = (const char *)cfg + k->off;
    char v[48];
    switch (k->kind) {
    case K_INT: snprintf(v, sizeof v, "%d", *(const int *)field); break;
    case K_INT64: snprintf(v, sizeof v, "%" PRId64, *(const int64_t *)field); break;
    case K_FLOAT: moe_cfg_fmt_double(v, sizeof v, *(const double *)field); break;
    case K_ENUM: snprintf(v, sizeof v, "\"%s\"", k->names[*(const int *)field]); break;
    case K_BOOL: snprintf(v, sizeof v, "%s", *(const int *)field ? "true" : "false"); break;
    default: snprintf(v, sizeof v, "?"); break;
    }
    char loc[MOE_PATH_MAX + 96] = "";
    if (!c->at[idx])
        snprintf(loc, sizeof loc, " (default)");
    else if (c->at[idx] != here) {
        char w[MOE_PATH_MAX + 80];
        moe_cfg_where(c, c->at[idx], w, sizeof w);
        snprintf(loc, sizeof loc, " (at %s)", w);
    }
    snprintf(buf, n, "%s.%s = %s%s", k->group, k->key, v, loc);
}

// "WHERE: <a> <relation> <b>[: why]" located at key a when the file sets it, else at b.
static moe_status inconsistent(const load_ctx *c, const moe_train_config *cfg, int a, int b,
                               const char *relation, const char *why) {
    const config_setting_t *here = c->at[a] ? c->at[a] : c->at[b];
    char loc[MOE_PATH_MAX + 96], da[MOE_PATH_MAX + 200], db[MOE_PATH_MAX + 200];
    if (here)
        moe_cfg_where(c, here, loc, sizeof loc);
    else
        snprintf(loc, sizeof loc, "%s", c->path ? c->path : "(defaults)");
    describe(c, cfg, a, here, da, sizeof da);
    describe(c, cfg, b, here, db, sizeof db);
    return moe_error(MOE_EINVAL, "%s: %s %s %s%s%s", loc, da, relation, db, why ? ": " : "",
                     why ? why : "");
}

// ---- sizes: products of values, bounded in 64 bits -------------------------------------------

// a * b for a, b >= 0, saturating at INT64_MAX (so no product below can wrap).
static int64_t mul(int64_t a, int64_t b) { return a != 0 && b > INT64_MAX / a ? INT64_MAX : a * b; }

// A product of config values that sizes a buffer (or a loop), and its bound.
typedef struct {
    const char *expr; // "train.batch_size * train.seq_len"
    int64_t value, limit;
    const char *limit_text, *why; // "2^24 tokens per micro-batch", why there is a bound
    int keys[4]; // spec indices of its keys (-1: unused), the first one set locates it
} size_bound;

// "WHERE: EXPR = VALUE exceeds LIMIT (KEY = V, KEY = V (at WHERE)): WHY", at the first key
// of the product that the file (or --set) sets.
static moe_status too_big(const load_ctx *c, const moe_train_config *cfg, const size_bound *b) {
    const config_setting_t *here = NULL;
    for (int i = 0; i < 4 && !here; i++)
        if (b->keys[i] >= 0) here = c->at[b->keys[i]];
    char loc[MOE_PATH_MAX + 96], keys[4 * (MOE_PATH_MAX + 200)] = "";
    if (here)
        moe_cfg_where(c, here, loc, sizeof loc);
    else
        snprintf(loc, sizeof loc, "%s", c->path ? c->path : "(defaults)");
    size_t len = 0;
    for (int i = 0; i < 4 && b->keys[i] >= 0; i++) {
        char d[MOE_PATH_MAX + 200];
        describe(c, cfg, b->keys[i], here, d, sizeof d);
        int w = snprintf(keys + len, sizeof keys - len, "%s%s", i ? ", " : "", d);
        if (w < 0 || (size_t)w >= sizeof keys - len) break;
        len += (size_t)w;
    }
    return moe_error(MOE_EINVAL, "%s: %s = %" PRId64 " exceeds %s (%s): %s", loc, b->expr, b->value,
                     b->limit_text, keys, b->why);
}

// What the model (layers/model.c: params_layout, moe_model_create, moe_layer_init) and the
// trainer allocate from the config: each key alone is in range, but their products could
// wrap an int (max_tokens = 0 later, with no key named) or a size_t. The bounds: config.h.
static moe_status check_sizes(const load_ctx *c, const moe_train_config *cfg) {
#define KEY(g, k) moe_cfg_spec_index(g, k)
    const int B = KEY("train", "batch_size"), S = KEY("train", "seq_len"),
              k = KEY("model", "top_k"), d = KEY("model", "d_model"), ff = KEY("model", "d_ff"),
              V = KEY("model", "vocab_size"), L = KEY("model", "n_layers"),
              E = KEY("model", "n_experts"), G = KEY("train", "grad_accum"),
              ev = KEY("train", "eval_batches"), H = KEY("model", "n_heads"),
              hd = KEY("model", "head_dim");
#undef KEY
    const moe_model_config *mc = &cfg->model;
    const int64_t T = mul(cfg->batch_size, cfg->seq_len), wide = mc->moe.d_ff > mc->d_model;
    const size_bound bounds[] = {
        {"train.batch_size * train.seq_len",
         T,
         MOE_CONFIG_MAX_TOKENS,
         "2^24 tokens per micro-batch",
         "the model counts a micro-batch's tokens in an int",
         {B, S, -1, -1}},
        {wide ? "train.batch_size * train.seq_len * model.top_k * model.d_ff"
              : "train.batch_size * train.seq_len * model.top_k * model.d_model",
         mul(mul(T, mc->moe.top_k), wide ? mc->moe.d_ff : mc->d_model),
         MOE_CONFIG_MAX_DISPATCH,
         "2^31-1",
         "the MoE layer indexes its dispatch buffers with an int",
         {B, S, k, wide ? ff : d}},
        {"train.batch_size * train.seq_len * model.vocab_size",
         mul(T, mc->vocab_size),
         MOE_CONFIG_MAX_LOGITS,
         "2^36 logits per micro-batch",
         "the model keeps the logits and their gradient",
         {B, S, V, -1}},
        {"model.n_layers * train.batch_size * train.seq_len * model.d_model",
         mul(mul(mc->n_layers, T), mc->d_model),
         MOE_CONFIG_MAX_ACTIVATIONS,
         "2^36 activations",
         "the model keeps several per layer for the backward pass",
         {L, B, S, d}},
        {"train.grad_accum * model.n_layers * model.n_experts",
         mul(mul(cfg->grad_accum, mc->n_layers), mc->moe.n_experts),
         MOE_CONFIG_MAX_COUNTS,
         "2^26 routing counts",
         "the trainer keeps every micro-batch's counts of every layer "
         "and expert",
         {G, L, E, -1}},
        {"train.eval_batches * train.batch_size * train.seq_len",
         mul(cfg->eval_batches, T),
         MOE_CONFIG_MAX_EVAL_TOKENS,
         "2^36 tokens per validation pass",
         "at a million tokens a second one pass would take most of a day",
         {ev, B, S, -1}},
        {"model.vocab_size * model.d_model",
         mul(mc->vocab_size, mc->d_model),
         MOE_CONFIG_MAX_EMBED,
         "2^32 embedding weights",
         "the embedding (and the lm_head) "
         "is one vocab_size x d_model matrix",
         {V, d, -1, -1}},
        {"model.n_layers * model.d_model^2",
         mul(mul(mc->n_layers, mc->d_model), mc->d_model),
         MOE_CONFIG_MAX_ATTN_WEIGHTS,
         "2^34 reals",
         "the attention weights are up to 4 x n_layers x d_model^2 reals",
         {L, d, -1, -1}},
        {"model.n_layers * model.d_model * model.n_heads * model.head_dim",
         mul(mul(mul(mc->n_layers, mc->d_model), mc->n_heads), moe_model_head_dim(mc)),
         MOE_CONFIG_MAX_ATTN_WEIGHTS,
         "2^34 reals",
         "the attention weights are up to 4 x n_layers x d_model x n_heads x head_dim reals",
         {L, d, H, hd}},
        {"model.n_layers * model.n_experts * 3 * model.d_ff * model.d_model",
         mul(mul(mul(mul(mc->n_layers, mc->moe.n_experts), 3), mc->moe.d_ff), mc->d_model),
         MOE_CONFIG_MAX_EXPERT_WEIGHTS,
         "2^34 expert weights",
         "w1, w2 and w3 of every expert of every layer",
         {L, E, ff, d}},
    };
    for (size_t i = 0; i < sizeof bounds / sizeof bounds[0]; i++)
        if (bounds[i].value > bounds[i].limit) return too_big(c, cfg, &bounds[i]);
    return MOE_OK;
}

// parallel.expert_placement, when not empty: n_experts entries, each expert once. Whether the
// EP group divides n_experts is the trainer's check (it knows the ranks); with one rank the
// placement only reorders the experts inside the process (same results).
moe_status moe_cfg_check_placement(const load_ctx *c, const moe_train_config *cfg) {
    const int idx = moe_cfg_spec_index("parallel", "expert_placement"),
              E = cfg->model.moe.n_experts, n = cfg->n_placement;
    if (n == 0) return MOE_OK;
    const config_setting_t *s = c->at[idx];
    const char *name = "parallel.expert_placement";
    if (n != E)
        return moe_cfg_bad(
            c, s, name,
            "has %d entries, model.n_experts = %d (a permutation of 0 .. %d, or [] for "
            "the default placement)",
            n, E, E - 1);
    unsigned char seen[MOE_MAX_EXPERTS] = {0};
    for (int i = 0; i < n; i++) {
        const int e = cfg->expert_placement[i];
        if (e >= E)
            return moe_cfg_bad(c, s, name, "entry %d is expert %d, model.n_experts = %d", i, e, E);
        if (seen[e]++)
            return moe_cfg_bad(c, s, name,
                               "expert %d is listed twice (entry %d): not a permutation", e, i);
    }
    return MOE_OK;
}

// Group-limited routing: model.n_group groups of at least two experts (a group's score is
// the sum of its two best), model.topk_group of them kept, model.top_k experts among those.
static moe_status check_groups(const load_ctx *c, const moe_train_config *cfg) {
    const int n_group = moe_cfg_spec_index("model", "n_group"),
              topk_group = moe_cfg_spec_index("model", "topk_group"),
              n_experts = moe_cfg_spec_index("model", "n_experts"),
              top_k = moe_cfg_spec_index("model", "top_k");
    const moe_config *m = &cfg->model.moe;
    const char *groups_why = "group-limited routing splits the experts into n_group groups of "
                             "at least 2 (a group's score is the sum of its two best)";
    if (m->n_experts % m->n_group)
        return inconsistent(c, cfg, n_group, n_experts, "does not divide", groups_why);
    if (m->n_group > 1 && m->n_experts / m->n_group < 2)
        return inconsistent(c, cfg, n_group, n_experts, "leaves one expert a group of", groups_why);
    if (m->topk_group > m->n_group)
        return inconsistent(c, cfg, topk_group, n_group, "exceeds",
                            "the topk_group best of the n_group groups are kept");
    if (m->n_group > 1 && m->top_k > m->topk_group * (m->n_experts / m->n_group))
        return inconsistent(c, cfg, top_k, topk_group, "exceeds the experts of",
                            "top_k picks among the topk_group * n_experts / n_group experts "
                            "of the kept groups");
    return MOE_OK;
}

moe_status moe_cfg_check_combinations(load_ctx *c, moe_train_config *cfg) {
    const int n_heads = moe_cfg_spec_index("model", "n_heads"),
              n_kv = moe_cfg_spec_index("model", "n_kv_heads"),
              d_model = moe_cfg_spec_index("model", "d_model"),
              head_dim = moe_cfg_spec_index("model", "head_dim"),
              top_k = moe_cfg_spec_index("model", "top_k"),
              n_experts = moe_cfg_spec_index("model", "n_experts"),
              max_seq = moe_cfg_spec_index("model", "max_seq_len"),
              seq_len = moe_cfg_spec_index("train", "seq_len"),
              lr = moe_cfg_spec_index("train", "lr"),
              min_lr = moe_cfg_spec_index("train", "min_lr"),
              steps = moe_cfg_spec_index("train", "steps"),
              warmup = moe_cfg_spec_index("train", "warmup_steps"),
              drop = moe_cfg_spec_index("model", "drop_policy");
    moe_model_config *m = &cfg->model;

    if (!c->at[n_kv] && !c->adopted[n_kv]) m->n_kv_heads = m->n_heads; // default: no GQA

    if (m->moe.top_k > m->moe.n_experts)
        return inconsistent(c, cfg, top_k, n_experts, "exceeds",
                            "each token is routed to top_k different experts");
    moe_status st = check_groups(c, cfg);
    if (st) return st;
    if (m->n_kv_heads > m->n_heads)
        return inconsistent(c, cfg, n_kv, n_heads, "exceeds",
                            "each KV head serves one or more query heads");
    if (m->n_heads % m->n_kv_heads != 0)
        return inconsistent(c, cfg, n_kv, n_heads, "does not divide",
                            "GQA shares each KV head among n_heads / n_kv_heads query heads");
    if (m->head_dim == 0 && m->d_model % m->n_heads != 0)
        return inconsistent(c, cfg, n_heads, d_model, "does not divide",
                            "head_dim = d_model / n_heads must be an integer (or set "
                            "model.head_dim)");
    if (moe_model_head_dim(m) % 2 != 0) {
        char why[160];
        snprintf(why, sizeof why,
                 "head_dim = %s%d is odd; RoPE rotates pairs of dimensions, so head_dim must "
                 "be even",
                 m->head_dim ? "" : "d_model / n_heads = ", moe_model_head_dim(m));
        return m->head_dim ? inconsistent(c, cfg, head_dim, n_heads, "with", why)
                           : inconsistent(c, cfg, d_model, n_heads, "with", why);
    }
    const moe_capacity_plan *cap = &cfg->capacity;
    static const char *const auto_keys[] = {"max_drop", "capacity_window", "capacity_min",
                                            "capacity_max", "capacity_max_change"};
    for (int i = 0; i < 5 && cap->mode != MOE_CAPACITY_AUTO; i++) {
        const int ki = moe_cfg_spec_index("model", auto_keys[i]);
        if (!c->at[ki]) continue;
        char loc[MOE_PATH_MAX + 96];
        moe_cfg_where(c, c->at[ki], loc, sizeof loc);
        return moe_error(MOE_EINVAL,
                         "%s: model.%s is set but model.capacity_factor is not \"auto\": it has "
                         "no effect (set capacity_factor = \"auto\", or remove it)",
                         loc, auto_keys[i]);
    }
    if (cap->mode == MOE_CAPACITY_AUTO && cap->min > cap->max)
        return inconsistent(c, cfg, moe_cfg_spec_index("model", "capacity_min"),
                            moe_cfg_spec_index("model", "capacity_max"), "exceeds",
                            "auto capacity keeps the factor within [capacity_min, capacity_max]");
    if (cap->mode == MOE_CAPACITY_AUTO) m->moe.capacity_factor = cap->max; // young router: wide
    if (c->at[drop] && m->moe.capacity_factor == 0.0) {
        char loc[MOE_PATH_MAX + 96];
        moe_cfg_where(c, c->at[drop], loc, sizeof loc);
        return moe_error(MOE_EINVAL,
                         "%s: model.drop_policy is set but model.capacity_factor = 0 (dropless): "
                         "nothing is ever dropped (set capacity_factor > 0, or remove drop_policy)",
                         loc);
    }
    if (cfg->seq_len > m->max_seq_len)
        return inconsistent(c, cfg, seq_len, max_seq, "exceeds",
                            "RoPE and the KV cache are sized for max_seq_len positions");
    if (cfg->min_lr > cfg->lr)
        return inconsistent(c, cfg, min_lr, lr, "exceeds",
                            "the schedule decays from lr down to min_lr");
    if (cfg->warmup_steps > cfg->steps)
        return inconsistent(c, cfg, warmup, steps, "exceeds", "warmup would never finish");
    if (cfg->attention == MOE_ATTENTION_CUDNN && m->dtype != MOE_DTYPE_BF16)
        return inconsistent(c, cfg, moe_cfg_spec_index("model", "attention"),
                            moe_cfg_spec_index("train", "dtype"), "with",
                            "cuDNN's fused attention runs in bf16 only (set train.dtype = "
                            "\"bf16\", or model.attention = \"native\")");
    return check_sizes(c, cfg);
}
