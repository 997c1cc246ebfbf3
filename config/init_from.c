// train.init_from's model (DESIGN.md §2.1): a config that starts from a Hugging Face folder (or
// a checkpoint) takes the model keys it leaves at their defaults from the folder's config.json,
// and the ones it sets must agree with it: a user fine-tunes an HF model without retyping its
// shape, and a typo in one key is an error naming both values, not a model the weights do not
// fit. The folder is read by the program's reader (moe_train_config_set_model_reader: the
// checkpoint library's), so this library does not depend on that one.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "config/config_internal.h"

static moe_cfg_model_reader model_reader;

void moe_train_config_set_model_reader(moe_cfg_model_reader reader) { model_reader = reader; }

// The model group's keys that config.json describes (the rest, capacity, losses, balancing,
// max_seq_len, device, are the run's own).
static const char *const folder_keys[] = {
    "family",      "vocab_size",   "d_model",        "n_layers",       "n_heads",
    "head_dim",    "n_kv_heads",   "d_ff",           "n_experts",      "top_k",
    "rope_theta",  "rms_norm_eps", "tie_embeddings", "norm_topk_prob", "scoring",
    "route_scale", "n_group",      "topk_group",     "first_k_dense",  "sparse_step",
    "dense_d_ff",  "shared_d_ff",  "shared_gate",    "qk_norm",        "qkv_bias",
    NULL};

// A key's value as the config writes it: 12, 1e-05, true, "qwen3_moe".
static void format_value(const key_spec *k, const moe_train_config *cfg, char *buf, size_t n) {
    const char *field = (const char *)cfg + k->off;
    switch (k->kind) {
    case K_FLOAT: moe_cfg_fmt_double(buf, n, *(const double *)field); break;
    case K_BOOL: snprintf(buf, n, "%s", *(const int *)field ? "true" : "false"); break;
    case K_ENUM: snprintf(buf, n, "\"%s\"", k->names[*(const int *)field]); break;
    default: snprintf(buf, n, "%d", *(const int *)field); break;
    }
}

static size_t field_size(const key_spec *k) {
    return k->kind == K_FLOAT ? sizeof(double) : sizeof(int); // K_INT, K_BOOL, K_ENUM
}

moe_status moe_cfg_merge_init_from(load_ctx *c, moe_train_config *cfg) {
    if (!model_reader || !cfg->init_from[0]) return MOE_OK;
    moe_train_config *from = malloc(sizeof *from);
    if (!from) return moe_error(MOE_ENOMEM, "config: out of memory");
    memcpy(from, cfg, sizeof *from);
    const int at_init = moe_cfg_spec_index("train", "init_from");
    moe_status st = model_reader(cfg->init_from, &from->model);
    if (st) {
        char where[MOE_PATH_MAX + 96];
        moe_cfg_where(c, c->at[at_init], where, sizeof where);
        char why[1024]; // (moe_error formats into the buffer moe_last_error reads)
        snprintf(why, sizeof why, "%s", moe_last_error());
        st = moe_error(st, "%s: train.init_from = '%s': %s", where, cfg->init_from, why);
    }
    for (int i = 0; !st && folder_keys[i]; i++) {
        const int idx = moe_cfg_spec_index("model", folder_keys[i]);
        const key_spec *k = &moe_cfg_specs[idx];
        char *mine = (char *)cfg + k->off;
        const char *theirs = (const char *)from + k->off;
        const int same = !strcmp(k->key, "head_dim") // (0 is d_model / n_heads)
                             ? moe_model_head_dim(&cfg->model) == moe_model_head_dim(&from->model)
                             : !memcmp(mine, theirs, field_size(k));
        if (!c->at[idx]) { // the default: the folder's
            memcpy(mine, theirs, field_size(k));
            c->adopted[idx] = 1;
        } else if (!same) {
            char a[64], b[64];
            format_value(k, cfg, a, sizeof a);
            format_value(k, from, b, sizeof b);
            char name[64];
            snprintf(name, sizeof name, "model.%s", k->key);
            st = moe_cfg_bad(c, c->at[idx], name,
                             "%s, but train.init_from (%s) has %s (leave the key out to take the "
                             "folder's)",
                             a, cfg->init_from, b);
        }
    }
    // the dense layers a Qwen folder lists beyond a prefix (no key of their own)
    if (!st)
        memcpy(cfg->model.dense_layers, from->model.dense_layers, sizeof from->model.dense_layers);
    free(from);
    return st;
}
