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

cJSON *moe_hf_config_json(const moe_model_config *c, const char *torch_dtype) {
    cJSON *j = cJSON_CreateObject();
    cJSON *arch = cJSON_CreateArray();
    cJSON_AddItemToArray(arch, cJSON_CreateString("MixtralForCausalLM"));
    cJSON_AddItemToObject(j, "architectures", arch);
    cJSON_AddStringToObject(j, "model_type", "mixtral");
    cJSON_AddNumberToObject(j, "vocab_size", c->vocab_size);
    cJSON_AddNumberToObject(j, "hidden_size", c->d_model);
    cJSON_AddNumberToObject(j, "intermediate_size", c->moe.d_ff);
    cJSON_AddNumberToObject(j, "num_hidden_layers", c->n_layers);
    cJSON_AddNumberToObject(j, "num_attention_heads", c->n_heads);
    cJSON_AddNumberToObject(j, "num_key_value_heads", c->n_kv_heads);
    cJSON_AddNumberToObject(j, "head_dim", moe_model_head_dim(c));
    cJSON_AddNumberToObject(j, "num_local_experts", c->moe.n_experts);
    cJSON_AddNumberToObject(j, "num_experts_per_tok", c->moe.top_k);
    add_float(j, "rms_norm_eps", c->rms_norm_eps);
    add_float(j, "rope_theta", c->rope_theta);
    cJSON_AddNumberToObject(j, "max_position_embeddings", c->max_seq_len);
    cJSON_AddBoolToObject(j, "tie_word_embeddings", c->tie_embeddings);
    // HF's router_aux_loss_coef multiplies its helper's value, which is top_k times ours
    add_float(j, "router_aux_loss_coef", c->moe.aux_coef / c->moe.top_k);
    add_float(j, "router_jitter_noise", 0.0);
    cJSON_AddStringToObject(j, "hidden_act", "silu");
    cJSON_AddNullToObject(j, "sliding_window");
    add_float(j, "attention_dropout", 0.0);
    cJSON_AddBoolToObject(j, "use_cache", 1);
    cJSON_AddStringToObject(j, "torch_dtype", torch_dtype);
    // ours, ignored by transformers: what HF's Mixtral block cannot express (DeepSeek-V3's
    // names where it has them)
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
static const char *const hf_model_fields[] = {"model_type",
                                              "vocab_size",
                                              "hidden_size",
                                              "intermediate_size",
                                              "num_hidden_layers",
                                              "num_attention_heads",
                                              "num_key_value_heads",
                                              "num_local_experts",
                                              "num_experts_per_tok",
                                              "max_position_embeddings",
                                              "head_dim",
                                              "rms_norm_eps",
                                              "rope_theta",
                                              "rope_parameters",
                                              "tie_word_embeddings",
                                              "hidden_act",
                                              "sliding_window",
                                              "architectures",
                                              "norm_topk_prob",
                                              "scoring_func",
                                              "routed_scaling_factor",
                                              "router_bias", // ours
                                              "n_group",
                                              "topk_group",
                                              NULL};
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
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(j, "architectures"), *a;
    int mixtral = !arch || cJSON_IsNull(arch);
    const cJSON *list = cJSON_IsArray(arch) ? arch : NULL;
    cJSON_ArrayForEach(a, list) mixtral |=
        cJSON_IsString(a) && !strcmp(a->valuestring, "MixtralForCausalLM");
    if (!mixtral)
        return moe_error(MOE_EINVAL, "%s: architectures does not list MixtralForCausalLM", path);
    return MOE_OK;
}

// The fields of config.json that describe the model.
static moe_status parse_hf_config(moe_model_config *out, const cJSON *j, const char *path) {
    static const char *const mixtral[] = {"mixtral", NULL},
                             *const scoring[] = {"softmax", "sigmoid", NULL},
                             *const silu[] = {"silu", NULL};
    int type = -1, act = 0, ff = 0, E = 0, k = 0, head_dim = 0, score = 0;
    moe_model_config c = {.max_seq_len = 4096, .rms_norm_eps = 1e-5, .rope_theta = 1e6};
    moe_status st;
    if ((st = check_hf_fields(j, path)) || (st = cj_enum(j, path, "model_type", mixtral, &type)))
        return st;
    if (type < 0)
        return moe_error(MOE_EINVAL, "%s: model_type is missing (expected \"mixtral\")", path);
    if ((st = cj_int(j, path, "vocab_size", 2, 1 << 24, 1, &c.vocab_size)) ||
        (st = cj_int(j, path, "hidden_size", 1, 65536, 1, &c.d_model)) ||
        (st = cj_int(j, path, "intermediate_size", 1, 1 << 20, 1, &ff)) ||
        (st = cj_int(j, path, "num_hidden_layers", 1, 1024, 1, &c.n_layers)) ||
        (st = cj_int(j, path, "num_attention_heads", 1, 4096, 1, &c.n_heads)) ||
        (st = cj_int(j, path, "num_local_experts", 1, 4096, 1, &E)) ||
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
    if (sw && !cJSON_IsNull(sw))
        return moe_error(MOE_EINVAL,
                         "%s: sliding_window must be null (sliding-window attention is "
                         "not implemented)",
                         path);
    c.moe = moe_config_default(c.d_model, ff, E, k);
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

moe_status moe_hf_config_check(const char *folder, const moe_model_config *cfg) {
    moe_model_config h;
    moe_status st = moe_hf_config_read(&h, folder);
    if (st) return st;
    char msg[1024] = "";
    size_t used = 0;
#define CHECK(hf_name, ours_name, a, b, fmt)                                                    \
    if ((a) != (b))                                                                             \
        used += (size_t)snprintf(msg + used, used < sizeof msg ? sizeof msg - used : 0,         \
                                 "%s%s = " fmt " (%s = " fmt ")", used ? "; " : "", hf_name, a, \
                                 ours_name, b);
    CHECK("vocab_size", "model.vocab_size", h.vocab_size, cfg->vocab_size, "%d")
    CHECK("hidden_size", "model.d_model", h.d_model, cfg->d_model, "%d")
    CHECK("intermediate_size", "model.d_ff", h.moe.d_ff, cfg->moe.d_ff, "%d")
    CHECK("num_hidden_layers", "model.n_layers", h.n_layers, cfg->n_layers, "%d")
    CHECK("num_attention_heads", "model.n_heads", h.n_heads, cfg->n_heads, "%d")
    CHECK("num_key_value_heads", "model.n_kv_heads", h.n_kv_heads, cfg->n_kv_heads, "%d")
    CHECK("head_dim", "model.head_dim", moe_model_head_dim(&h), moe_model_head_dim(cfg), "%d")
    CHECK("num_local_experts", "model.n_experts", h.moe.n_experts, cfg->moe.n_experts, "%d")
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
#undef CHECK
    if (used)
        return moe_error(MOE_EINVAL, "%s/config.json disagrees with the model config: %s", folder,
                         msg);
    return MOE_OK;
}
