// config.json of Hugging Face Mixtral folders (see hf_config.h).
#include "ckpt/hf_config.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/files.h"
#include "ckpt/path_internal.h"
#include "ckpt/json_fields.h"

// ---- writing config.json ----------------------------------------------------------

// A float field written as a JSON float ("0.0", "1e-05"): cJSON prints 0.0 as 0, which
// transformers 5.x's typed config refuses for a float field.
static void add_float(cJSON *obj, const char *key, double v) {
    char num[40];
    if (v == floor(v) && fabs(v) < 1e15) { // integral: 10000.0, not 1e+04
        snprintf(num, sizeof num, "%.1f", v);
    } else {
        for (int p = 1; p <= 17; p++) { // the shortest form that reads back exactly
            snprintf(num, sizeof num, "%.*g", p, v);
            if (strtod(num, NULL) == v) break;
        }
        if (!strpbrk(num, ".eEn")) strcat(num, ".0"); // ("n": nan, inf)
    }
    cJSON_AddRawToObject(obj, key, num);
}

// HF's class of each family (moe_family's order).
static const char *const hf_class[] = {"MixtralForCausalLM", "Qwen3MoeForCausalLM",
                                       "Qwen2MoeForCausalLM", "OlmoeForCausalLM"};

// The dense layers as Qwen's mlp_only_layers: every layer that is dense for another reason
// than decoder_sparse_step (first_k_dense's and the listed ones).
static cJSON *mlp_only_layers(const moe_model_config *c) {
    cJSON *a = cJSON_CreateArray();
    for (int l = 0; l < c->n_layers; l++)
        if (l < c->first_k_dense || moe_model_dense_layer_listed(c, l))
            cJSON_AddItemToArray(a, cJSON_CreateNumber(l));
    return a;
}

cJSON *moe_hf_config_json(const moe_model_config *c, const char *torch_dtype) {
    const moe_family f = c->family;
    const int mixtral = f == MOE_FAMILY_MIXTRAL,
              qwen = f == MOE_FAMILY_QWEN3_MOE || f == MOE_FAMILY_QWEN2_MOE;
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString(hf_class[f]));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", moe_model_family_name(f));
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c->d_model);
    // the experts' width: Mixtral's and OLMoE's intermediate_size, Qwen's moe_intermediate_size
    // (its intermediate_size is the dense layers' MLP)
    if (qwen) {
        cJSON_AddNumberToObject(j, "intermediate_size",
                                c->dense_d_ff > 0 ? c->dense_d_ff : c->moe.d_ff);
        cJSON_AddNumberToObject(j, "moe_intermediate_size", c->moe.d_ff);
        cJSON_AddNumberToObject(j, "decoder_sparse_step", c->sparse_step > 0 ? c->sparse_step : 1);
        cJSON_AddItemToObject(j, "mlp_only_layers", mlp_only_layers(c));
        cJSON_AddBoolToObject(j, "use_sliding_window", 0);
        cJSON_AddNullToObject(j, "sliding_window");
    } else {
        cJSON_AddNumberToObject(j, "intermediate_size", c->moe.d_ff);
    }
    if (f == MOE_FAMILY_QWEN2_MOE) {
        cJSON_AddNumberToObject(j, "shared_expert_intermediate_size", c->shared_d_ff);
        cJSON_AddBoolToObject(j, "qkv_bias", c->qkv_bias);
    }
    if (f == MOE_FAMILY_QWEN3_MOE || f == MOE_FAMILY_OLMOE)
        cJSON_AddBoolToObject(j, "attention_bias", 0);
    if (f == MOE_FAMILY_OLMOE) cJSON_AddNullToObject(j, "clip_qkv");
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", moe_model_head_dim(c));
    cJSON_AddNumberToObject(j, mixtral ? "num_local_experts" : "num_experts", c->moe.n_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", c->moe.top_k);
    add_float(j, "rms_norm_eps", c->rms_norm_eps);
    add_float(j, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_seq_len);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    // HF's router_aux_loss_coef multiplies its helper's value, which is top_k times ours
    add_float(j, "router_aux_loss_coef", c->moe.aux_coef / c->moe.top_k);
    if (mixtral) {
        add_float(j, "router_jitter_noise", 0.0);
        cJSON_AddNullToObject(j, "sliding_window");
    }
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    add_float(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype);
    // norm_topk_prob: the Qwen and OLMoE classes' own field; for Mixtral (always renormalised)
    // ours, like the rest below, which transformers ignores: what HF's blocks cannot express
    // (DeepSeek-V3's names where it has them)
    cJSON_AddBoolToObject(j, "norm_topk_prob", c->moe.norm_topk_prob);
    cJSON_AddStringToObject(j, "scoring_func",
                            c->moe.scoring == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax");
    add_float(j, "routed_scaling_factor", c->moe.route_scale);
    cJSON_AddBoolToObject(j, "router_bias", c->router_bias);
    if (c->moe.n_group > 1) { // group-limited routing, DeepSeek-V3's names
        cJSON_AddNumberToObject(j, "n_group", c->moe.n_group);
        cJSON_AddNumberToObject(j, "topk_group", c->moe.topk_group);
    }
    return j;
}

// ---- reading config.json: every field we use is checked for type and range ----------
//
// The limits are the training schema's (config/config.h), so whatever moe.c trains it loads,
// and a small file cannot make us allocate absurd sizes: with them the parameter count fits
// in 64 bits (L*E*2ff*d <= 2^59), and it is compared with the safetensors headers before
// anything is allocated (moe_hf_check_sizes).

// An integer field in [lo, hi]. Absent: MOE_OK with *out untouched, unless required.
static moe_status cj_int(const cJSON *j, const char *path, const char *key, int64_t lo, int64_t hi,
                         int required, int *out) {
    if (!ckpt_json_field(j, key) && !required) return MOE_OK;
    int64_t x = 0;
    moe_status st = ckpt_json_integer(j, path, key, lo, hi, MOE_EINVAL, &x);
    if (!st) *out = (int)x;
    return st;
}

// cj_int, where null means absent (transformers 5.x writes "head_dim": null).
static moe_status cj_int_or_null(const cJSON *j, const char *path, const char *key, int64_t lo,
                                 int64_t hi, int *out) {
    return cJSON_IsNull(ckpt_json_field(j, key)) ? MOE_OK : cj_int(j, path, key, lo, hi, 0, out);
}

// A finite number in (lo, hi]. Absent: MOE_OK with *out untouched.
static moe_status cj_num(const cJSON *j, const char *path, const char *key, double lo, double hi,
                         double *out) {
    const cJSON *v = ckpt_json_field(j, key);
    if (!v) return MOE_OK;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return moe_error(MOE_EINVAL, "%s: %s must be a finite number", path, key);
    if (!(v->valuedouble > lo && v->valuedouble <= hi))
        return moe_error(MOE_EINVAL, "%s: %s = %g is outside (%g, %g]", path, key, v->valuedouble,
                         lo, hi);
    *out = v->valuedouble;
    return MOE_OK;
}

// A boolean field. Absent: MOE_OK with *out untouched.
static moe_status cj_bool(const cJSON *j, const char *path, const char *key, int *out) {
    const cJSON *v = ckpt_json_field(j, key);
    if (!v) return MOE_OK;
    if (!cJSON_IsBool(v)) return moe_error(MOE_EINVAL, "%s: %s must be true or false", path, key);
    *out = cJSON_IsTrue(v);
    return MOE_OK;
}

// A string field equal to one of `allowed` (NULL-terminated); *out its index. Absent: MOE_OK.
static moe_status cj_enum(const cJSON *j, const char *path, const char *key,
                          const char *const *allowed, int *out) {
    const cJSON *v = ckpt_json_field(j, key);
    if (!v) return MOE_OK;
    for (int i = 0; allowed[i] && cJSON_IsString(v); i++)
        if (!strcmp(v->valuestring, allowed[i])) {
            *out = i;
            return MOE_OK;
        }
    char list[128] = "";
    for (int i = 0, u = 0; allowed[i] && u < (int)sizeof list; i++)
        u += snprintf(list + u, sizeof list - (size_t)u, "%s\"%s\"", i ? ", " : "", allowed[i]);
    return moe_error(MOE_EINVAL, "%s: %s must be one of %s", path, key, list);
}

// rope_theta: top-level (transformers 4.x), or rope_parameters.rope_theta (transformers 5.x);
// only the plain RoPE (rope_type "default") is implemented.
static moe_status cj_rope(const cJSON *j, const char *path, double *theta) {
    moe_status st = cj_num(j, path, "rope_theta", 0, 1e12, theta);
    const cJSON *rp = cJSON_GetObjectItemCaseSensitive(j, "rope_parameters");
    if (st || !rp || cJSON_IsNull(rp)) return st;
    if (!cJSON_IsObject(rp))
        return moe_error(MOE_EINVAL, "%s: rope_parameters must be an object", path);
    static const char *const types[] = {"default", NULL};
    int type = 0;
    double t = *theta;
    if ((st = cj_enum(rp, path, "rope_parameters.rope_type", types, &type)) ||
        (st = cj_num(rp, path, "rope_parameters.rope_theta", 0, 1e12, &t)))
        return st;
    if (cJSON_GetObjectItemCaseSensitive(j, "rope_theta") && t != *theta)
        return moe_error(MOE_EINVAL,
                         "%s: rope_theta = %g and rope_parameters.rope_theta = %g differ", path,
                         *theta, t);
    *theta = t;
    return MOE_OK;
}

// Every field of config.json must be one we understand: one that shapes the model (read
// below), or one that cannot change what the weights compute here. A field we do not know
// (a quantization_config, a rope_scaling, ...) may change the model, so it is an error naming
// it, never silently ignored.
static const char *const hf_model_fields[] = {
    "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
    "num_attention_heads", "num_key_value_heads", "num_local_experts", "num_experts_per_tok",
    "max_position_embeddings", "head_dim", "rms_norm_eps", "rope_theta", "rope_parameters",
    "tie_word_embeddings", "hidden_act", "sliding_window", "architectures", "norm_topk_prob",
    "scoring_func", "routed_scaling_factor",
    "router_bias", // ours
    "n_group", "topk_group",
    // the Qwen and OLMoE classes'
    "num_experts", "moe_intermediate_size", "shared_expert_intermediate_size",
    "decoder_sparse_step", "mlp_only_layers", "use_sliding_window", "layer_types", "attention_bias",
    "clip_qkv", "qkv_bias", NULL};
// Accepted and not used: training-only hyperparameters (the train config sets training),
// token ids (tokenizer metadata), storage and bookkeeping fields.
static const char *const hf_ignored_fields[] = {"attention_dropout",
                                                "router_aux_loss_coef",
                                                "router_jitter_noise",
                                                "output_router_logits",
                                                "initializer_range",
                                                "bos_token_id",
                                                "eos_token_id",
                                                "pad_token_id",
                                                "torch_dtype",
                                                "dtype",
                                                "transformers_version",
                                                "use_cache",
                                                "_name_or_path",
                                                "output_attentions",
                                                "output_hidden_states",
                                                "return_dict",
                                                "max_window_layers", // (no sliding window)
                                                NULL};

static int in_list(const char *const *list, const char *s) {
    for (; *list; list++)
        if (!strcmp(*list, s)) return 1;
    return 0;
}

static moe_status check_hf_fields(const cJSON *j, const char *path) {
    const cJSON *f;
    cJSON_ArrayForEach(f, j) {
        if (in_list(hf_model_fields, f->string)) continue;
        if (!in_list(hf_ignored_fields, f->string))
            return moe_error(MOE_EINVAL,
                             "%s: field \"%s\" is not understood by moe.c (it may change "
                             "the model; remove it if it does not apply)",
                             path, f->string);
        if (cJSON_IsObject(f) || cJSON_IsArray(f))
            return moe_error(MOE_EINVAL, "%s: %s must be a number, a string, a boolean or null",
                             path, f->string);
    }
    return MOE_OK;
}

// architectures, when present, lists the family's class.
static moe_status check_architectures(const cJSON *j, const char *path, moe_family f) {
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures"), *a;
    int ok = !arch || cJSON_IsNull(arch);
    const cJSON *list = cJSON_IsArray(arch) ? arch : NULL;
    cJSON_ArrayForEach(a, list) ok |= cJSON_IsString(a) && !strcmp(a->valuestring, hf_class[f]);
    if (!ok)
        return moe_error(MOE_EINVAL, "%s: architectures does not list %s (model_type \"%s\")", path,
                         hf_class[f], moe_model_family_name(f));
    return MOE_OK;
}

// Qwen's dense layers: mlp_only_layers, a list of layer indices (a prefix 0..k-1 becomes
// first_k_dense = k, as DeepSeek's first_k_dense_replace).
static moe_status cj_mlp_only_layers(const cJSON *j, const char *path, moe_model_config *c) {
    const cJSON *v = ckpt_json_field(j, "mlp_only_layers"), *x;
    if (!v || cJSON_IsNull(v)) return MOE_OK;
    if (!cJSON_IsArray(v))
        return moe_error(MOE_EINVAL, "%s: mlp_only_layers must be a list of layer indices", path);
    int prefix = 1, n = 0;
    cJSON_ArrayForEach(x, v) {
        if (!cJSON_IsNumber(x) || x->valuedouble != floor(x->valuedouble) || x->valuedouble < 0 ||
            x->valuedouble >= c->n_layers)
            return moe_error(MOE_EINVAL,
                             "%s: mlp_only_layers must list layer indices in [0, %d) "
                             "(num_hidden_layers)",
                             path, c->n_layers);
        const int l = (int)x->valuedouble;
        prefix &= l == n++;
        moe_model_set_dense_layer(c, l);
    }
    if (prefix) { // 0, 1, ..., n-1
        memset(c->dense_layers, 0, sizeof c->dense_layers);
        c->first_k_dense = n;
    }
    return MOE_OK;
}

// Attention variants the families' classes have and moe.c does not: refused by name.
static moe_status check_attention_fields(const cJSON *j, const char *path) {
    int on = 0;
    moe_status st = cj_bool(j, path, "use_sliding_window", &on);
    if (!st && on)
        return moe_error(MOE_EINVAL,
                         "%s: use_sliding_window = true (sliding-window attention is not "
                         "implemented)",
                         path);
    if (!st && (st = cj_bool(j, path, "attention_bias", &on)) == MOE_OK && on)
        return moe_error(MOE_EINVAL,
                         "%s: attention_bias = true (biases of q, k, v and o_proj) is not "
                         "implemented",
                         path);
    const cJSON *clip = ckpt_json_field(j, "clip_qkv"), *lt = ckpt_json_field(j, "layer_types"), *x;
    if (!st && clip && !cJSON_IsNull(clip))
        return moe_error(MOE_EINVAL, "%s: clip_qkv must be null (clipping is not implemented)",
                         path);
    if (!st && lt && !cJSON_IsNull(lt) && !cJSON_IsArray(lt))
        return moe_error(MOE_EINVAL, "%s: layer_types must be a list", path);
    int full = 1;
    const cJSON *types = cJSON_IsArray(lt) ? lt : NULL;
    cJSON_ArrayForEach(x, types) {
        full &= cJSON_IsString(x) && !strcmp(x->valuestring, "full_attention");
    }
    if (!st && !full)
        return moe_error(MOE_EINVAL,
                         "%s: layer_types must all be \"full_attention\" (sliding-window "
                         "attention is not implemented)",
                         path);
    return st;
}

// The family's own fields: the experts' count and width, the dense layers, the shared
// expert, q/k norm and biases (what each class always has).
static moe_status parse_family(moe_model_config *c, const cJSON *j, const char *path, int *ff,
                               int *E) {
    const moe_family f = c->family;
    const int qwen = f == MOE_FAMILY_QWEN3_MOE || f == MOE_FAMILY_QWEN2_MOE;
    // the experts' count: num_local_experts (Mixtral, and Qwen3-MoE since transformers 5) or
    // num_experts (the others; transformers maps either name to the other)
    int E2 = 0;
    const int local = ckpt_json_field(j, "num_local_experts") != NULL;
    moe_status st = cj_int(j, path, local ? "num_local_experts" : "num_experts", 1, 4096, 1, E);
    if (!st && local && (st = cj_int(j, path, "num_experts", 1, 4096, 0, &E2)) == MOE_OK && E2 &&
        E2 != *E)
        return moe_error(MOE_EINVAL, "%s: num_local_experts = %d and num_experts = %d differ", path,
                         *E, E2);
    if (!st && qwen) { // intermediate_size: the dense MLP; moe_intermediate_size: the experts
        c->dense_d_ff = *ff, c->sparse_step = 1;
        if ((st = cj_int(j, path, "moe_intermediate_size", 1, 1 << 20, 1, ff)) ||
            (st = cj_int(j, path, "decoder_sparse_step", 1, 1024, 0, &c->sparse_step)) ||
            (st = cj_mlp_only_layers(j, path, c)))
            return st;
        if (c->dense_d_ff == *ff) c->dense_d_ff = 0; // (0: the experts')
    }
    if (!st && f == MOE_FAMILY_QWEN2_MOE) {  // a gated shared expert always; q/k/v biases by
        c->qkv_bias = 1, c->shared_gate = 1; // default (qkv_bias: transformers 5's field)
        if (!(st = cj_int(j, path, "shared_expert_intermediate_size", 1, 1 << 20, 1,
                          &c->shared_d_ff)))
            st = cj_bool(j, path, "qkv_bias", &c->qkv_bias);
    }
    if (f == MOE_FAMILY_QWEN3_MOE) c->qk_norm = MOE_QK_NORM_HEAD;
    if (f == MOE_FAMILY_OLMOE) c->qk_norm = MOE_QK_NORM_FULL;
    return st ? st : check_attention_fields(j, path);
}

// The fields of config.json that describe the model.
static moe_status parse_hf_config(moe_model_config *out, const cJSON *j, const char *path) {
    static const char *const scoring[] = {"softmax", "sigmoid", NULL}, *const silu[] = {"silu",
                                                                                        NULL};
    const char *families[MOE_FAMILY_OLMOE + 2] = {NULL};
    for (int f = 0; f <= MOE_FAMILY_OLMOE; f++) families[f] = moe_model_family_name(f);
    int type = -1, act = 0, ff = 0, E = 0, k = 0, head_dim = 0, score = 0;
    moe_model_config c = {.max_seq_len = 4096, .rms_norm_eps = 1e-5, .rope_theta = 1e6};
    moe_status st;
    if ((st = check_hf_fields(j, path)) || (st = cj_enum(j, path, "model_type", families, &type)))
        return st;
    if (type < 0)
        return moe_error(MOE_EINVAL,
                         "%s: model_type is missing (expected \"mixtral\", \"qwen3_moe\", "
                         "\"qwen2_moe\" or \"olmoe\")",
                         path);
    c.family = (moe_family)type;
    if ((st = check_architectures(j, path, c.family)) ||
        (st = cj_int(j, path, "vocab_size", 2, 1 << 24, 1, &c.vocab_size)) ||
        (st = cj_int(j, path, "hidden_size", 1, 65536, 1, &c.d_model)) ||
        (st = cj_int(j, path, "intermediate_size", 1, 1 << 20, 1, &ff)) ||
        (st = cj_int(j, path, "num_hidden_layers", 1, 1024, 1, &c.n_layers)) ||
        (st = cj_int(j, path, "num_attention_heads", 1, 4096, 1, &c.n_heads)) ||
        (st = parse_family(&c, j, path, &ff, &E)) ||
        (st = cj_int(j, path, "num_experts_per_tok", 1, 4096, 1, &k)))
        return st;
    c.n_kv_heads = c.n_heads;
    if ((st = cj_int(j, path, "num_key_value_heads", 1, 4096, 0, &c.n_kv_heads)) ||
        (st = cj_int(j, path, "max_position_embeddings", 1, 1 << 20, 0, &c.max_seq_len)) ||
        (st = cj_int_or_null(j, path, "head_dim", 1, 4096, &head_dim)) ||
        (st = cj_num(j, path, "rms_norm_eps", 0, 1, &c.rms_norm_eps)) ||
        (st = cj_rope(j, path, &c.rope_theta)) ||
        (st = cj_bool(j, path, "tie_word_embeddings", &c.tie_embeddings)) ||
        (st = cj_enum(j, path, "hidden_act", silu, &act)))
        return st;
    // a head_dim other than hidden_size / num_attention_heads is the model's own (0: that)
    if (head_dim && (int64_t)head_dim * c.n_heads != c.d_model) c.head_dim = head_dim;
    const cJSON *sw = cJSON_GetObjectItemCaseSensitive(j, "sliding_window");
    if (c.family == MOE_FAMILY_MIXTRAL && sw && !cJSON_IsNull(sw)) // (Qwen: use_sliding_window)
        return moe_error(MOE_EINVAL,
                         "%s: sliding_window must be null (sliding-window attention is "
                         "not implemented)",
                         path);
    c.moe = moe_config_default(c.d_model, ff, E, k);
    // Mixtral always renormalises the top-k weights; the others' classes default to not
    if (c.family != MOE_FAMILY_MIXTRAL) c.moe.norm_topk_prob = 0;
    if ((st = cj_bool(j, path, "norm_topk_prob", &c.moe.norm_topk_prob)) ||
        (st = cj_enum(j, path, "scoring_func", scoring, &score)) ||
        (st = cj_num(j, path, "routed_scaling_factor", 0, 1e6, &c.moe.route_scale)) ||
        (st = cj_bool(j, path, "router_bias", &c.router_bias)) ||
        (st = cj_int(j, path, "n_group", 1, 64, 0, &c.moe.n_group)) ||
        (st = cj_int(j, path, "topk_group", 1, 64, 0, &c.moe.topk_group)))
        return st;
    c.moe.scoring = score ? MOE_SCORE_SIGMOID : MOE_SCORE_SOFTMAX;
    if ((st = moe_model_config_check(&c))) return moe_error_context(st, "%s", path);
    *out = c;
    return MOE_OK;
}

moe_status moe_hf_config_read(moe_model_config *cfg, const char *folder) {
    if (check_path_arg(folder)) return MOE_EINVAL;
    char path[PATH_BUF];
    path_fmt(path, sizeof path, "%s/config.json", folder);
    cJSON *j;
    moe_status st = moe_file_read_json_object(path, SMALL_FILE_MAX, &j);
    if (st) return st;
    st = parse_hf_config(cfg, j, path); // every message is formatted before j is freed
    cJSON_Delete(j);
    return st;
}

// The dense layers' MLP width, 0 in a model without dense layers.
static int dense_width(const moe_model_config *c) {
    if (moe_model_n_moe_layers(c) == c->n_layers) return 0;
    return c->dense_d_ff > 0 ? c->dense_d_ff : c->moe.d_ff;
}

moe_status moe_hf_config_check(const char *folder, const moe_model_config *cfg) {
    moe_model_config h;
    moe_status st = moe_hf_config_read(&h, folder);
    if (st) return st;
    char msg[1024] = "";
    size_t used = 0;
    // the folder family's names of the experts' width and count
    const int qwen = h.family == MOE_FAMILY_QWEN3_MOE || h.family == MOE_FAMILY_QWEN2_MOE;
    const char *ff_name = qwen ? "moe_intermediate_size" : "intermediate_size",
               *experts_name = h.family == MOE_FAMILY_MIXTRAL ? "num_local_experts" : "num_experts";
#define CHECK(hf_name, ours_name, a, b, fmt)                                                    \
    if ((a) != (b))                                                                             \
        used += (size_t)snprintf(msg + used, used < sizeof msg ? sizeof msg - used : 0,         \
                                 "%s%s = " fmt " (%s = " fmt ")", used ? "; " : "", hf_name, a, \
                                 ours_name, b);
    CHECK("vocab_size", "model.vocab_size", h.vocab_size, cfg->vocab_size, "%d")
    CHECK("hidden_size", "model.d_model", h.d_model, cfg->d_model, "%d")
    CHECK(ff_name, "model.d_ff", h.moe.d_ff, cfg->moe.d_ff, "%d")
    CHECK("num_hidden_layers", "model.n_layers", h.n_layers, cfg->n_layers, "%d")
    CHECK("num_attention_heads", "model.n_heads", h.n_heads, cfg->n_heads, "%d")
    CHECK("num_key_value_heads", "model.n_kv_heads", h.n_kv_heads, cfg->n_kv_heads, "%d")
    CHECK("head_dim", "model.head_dim", moe_model_head_dim(&h), moe_model_head_dim(cfg), "%d")
    CHECK(experts_name, "model.n_experts", h.moe.n_experts, cfg->moe.n_experts, "%d")
    CHECK("num_experts_per_tok", "model.top_k", h.moe.top_k, cfg->moe.top_k, "%d")
    CHECK("tie_word_embeddings", "model.tie_embeddings", h.tie_embeddings, cfg->tie_embeddings,
          "%d")
    CHECK("rms_norm_eps", "model.rms_norm_eps", h.rms_norm_eps, cfg->rms_norm_eps, "%g")
    CHECK("rope_theta", "model.rope_theta", h.rope_theta, cfg->rope_theta, "%g")
    CHECK("scoring_func (1 = sigmoid)", "model.scoring", (int)h.moe.scoring, (int)cfg->moe.scoring,
          "%d")
    CHECK("routed_scaling_factor", "model.route_scale", h.moe.route_scale, cfg->moe.route_scale,
          "%g")
    CHECK("n_group", "model.n_group", h.moe.n_group, cfg->moe.n_group, "%d")
    CHECK("topk_group", "model.topk_group", h.moe.topk_group, cfg->moe.topk_group, "%d")
    CHECK("model_type", "model.family", moe_model_family_name(h.family),
          moe_model_family_name(cfg->family), "\"%s\"")
    CHECK("norm_topk_prob", "model.norm_topk_prob", h.moe.norm_topk_prob, cfg->moe.norm_topk_prob,
          "%d")
    CHECK("intermediate_size (dense layers)", "model.dense_d_ff", dense_width(&h), dense_width(cfg),
          "%d")
    CHECK("shared_expert_intermediate_size", "model.shared_d_ff", h.shared_d_ff, cfg->shared_d_ff,
          "%d")
    CHECK("qkv_bias", "model.qkv_bias", h.qkv_bias, cfg->qkv_bias, "%d")
    int l = 0; // the first layer dense in one and MoE in the other
    while (l < cfg->n_layers && l < h.n_layers &&
           moe_model_layer_is_moe(&h, l) == moe_model_layer_is_moe(cfg, l))
        l++;
    if (l < cfg->n_layers && l < h.n_layers)
        CHECK("layer dense (mlp_only_layers, decoder_sparse_step)",
              "model.first_k_dense, model.sparse_step", !moe_model_layer_is_moe(&h, l),
              !moe_model_layer_is_moe(cfg, l), "%d")
#undef CHECK
    if (used)
        return moe_error(MOE_EINVAL, "%s/config.json disagrees with the model config: %s", folder,
                         msg);
    return MOE_OK;
}
