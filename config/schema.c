// The schema: every key of the training config (its group, kind, field and range), in one
// table that the reading, the checks and the writer are driven by; and lookups in it.
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <string.h>

#include "layers/backend.h" // moe_drop_policy: drop_policy's ints are its values
#include "config/config_internal.h"

_Static_assert(MOE_DROP_PROBS == 0 && MOE_DROP_POSITION == 1,
               "model.drop_policy maps \"probs\" -> 0 and \"position\" -> 1");

const char *const moe_cfg_drop_names[] = {"probs", "position", NULL};
static const char *const optimizer_names[] = {"adamw", "sgd", NULL};
static const char *const schedule_names[] = {"cosine", "constant", NULL};
static const char *const scoring_names[] = {"softmax", "sigmoid", NULL};
static const char *const alert_action_names[] = {"warn", "stop", NULL};
static const char *const dtype_names[] = {"fp32", "bf16", NULL};     // moe_dtype's order
static const char *const exchange_names[] = {"dedup", "rows", NULL}; // moe_exchange's order
static const char *const transport_names[] = {"mpi", "nccl", NULL};  // moe_transport's order
static const char *const recompute_names[] = {"none", "moe", "layer", NULL}; // moe_recompute's
// moe_family's order: the HF model_type of each
static const char *const family_names[] = {"mixtral", "qwen3_moe", "qwen2_moe", "olmoe", NULL};
static const char *const qk_norm_names[] = {"none", "head", "full", NULL}; // moe_qk_norm's order
static const char *const aux_scope_names[] = {"micro", "global", NULL};    // moe_aux_scope's order
static const char *const attention_names[] = {"native", "cudnn", NULL};    // moe_attention_impl's

#define ENUM_FITS_INT(T) _Static_assert(sizeof(T) == sizeof(int), #T " is written as an int")
ENUM_FITS_INT(moe_attention_impl);
ENUM_FITS_INT(moe_drop_policy);
ENUM_FITS_INT(moe_scoring);
ENUM_FITS_INT(optim_kind);
ENUM_FITS_INT(moe_schedule_kind);
ENUM_FITS_INT(moe_alert_action);
ENUM_FITS_INT(moe_dtype);
_Static_assert(MOE_DTYPE_F32 == 0 && MOE_DTYPE_BF16 == 1, "train.dtype: fp32 -> 0, bf16 -> 1");
ENUM_FITS_INT(moe_exchange);
ENUM_FITS_INT(moe_transport);
ENUM_FITS_INT(moe_family);
ENUM_FITS_INT(moe_qk_norm);
ENUM_FITS_INT(moe_aux_scope);
_Static_assert(MOE_AUX_MICRO == 0 && MOE_AUX_GLOBAL == 1, "model.aux_scope: aux_scope_names");
_Static_assert(MOE_FAMILY_MIXTRAL == 0 && MOE_FAMILY_OLMOE == 3, "model.family: family_names");
_Static_assert(MOE_QK_NORM_NONE == 0 && MOE_QK_NORM_FULL == 2, "model.qk_norm: qk_norm_names");
_Static_assert(MOE_EXCHANGE_DEDUP == 0 && MOE_EXCHANGE_ROWS == 1,
               "parallel.exchange: dedup -> 0, rows -> 1");

const char *const moe_cfg_group_names[] = {"model", "train",      "data",
                                           "log",   "checkpoint", "parallel"};
_Static_assert(sizeof moe_cfg_group_names / sizeof moe_cfg_group_names[0] == CFG_N_GROUPS,
               "CFG_N_GROUPS counts the groups");

// In the order `moe_train_config_write` writes (config.h lists the fields in it).
const key_spec moe_cfg_specs[] = {
    KINT("model", "vocab_size", model.vocab_size, 2, 1 << 24),
    KINT("model", "d_model", model.d_model, 1, 65536),
    KINT("model", "n_layers", model.n_layers, 1, 1024),
    KINT("model", "n_heads", model.n_heads, 1, 4096),
    KINT("model", "head_dim", model.head_dim, 0, 4096),     // 0: d_model / n_heads; even
    KINT("model", "n_kv_heads", model.n_kv_heads, 1, 4096), // and <= n_heads, divides it
    KINT("model", "d_ff", model.moe.d_ff, 1, 1 << 20),
    // the layers of 2025-26 models (DESIGN.md §2.1), all off by default
    KENUM("model", "family", model.family, moe_family, family_names),
    KINT("model", "first_k_dense", model.first_k_dense, 0, 1024), // dense layers 0..k-1
    KINT("model", "sparse_step", model.sparse_step, 1, 1024),     // MoE where (l+1) % step == 0
    KINT("model", "dense_d_ff", model.dense_d_ff, 0, 1 << 20),    // 0: d_ff
    KINT("model", "shared_d_ff", model.shared_d_ff, 0, 1 << 20),  // 0: no shared expert
    KBOOL("model", "shared_gate", model.shared_gate),
    KENUM("model", "qk_norm", model.qk_norm, moe_qk_norm, qk_norm_names),
    KBOOL("model", "qkv_bias", model.qkv_bias),
    KINT("model", "n_experts", model.moe.n_experts, 1, 4096),
    KINT("model", "top_k", model.moe.top_k, 1, 4096), // and <= n_experts
    KINT("model", "max_seq_len", model.max_seq_len, 1, 1 << 20),
    KFLT("model", "rope_theta", model.rope_theta, 0, OPEN, 1e12, CLOSED), // config.json's bound
    KFLT("model", "rms_norm_eps", model.rms_norm_eps, 0, OPEN, 1, OPEN),
    KBOOL("model", "tie_embeddings", model.tie_embeddings),
    KBOOL("model", "norm_topk_prob", model.moe.norm_topk_prob),
    {.group = "model",
     .key = "capacity_factor",
     .kind = K_CAPACITY,
     .off = OFF(capacity, moe_capacity_plan)},
    KINT("model", "dropless_max_rows", model.dropless_max_rows, 0, 1 << 30), // 0: no cap
    KFLT("model", "max_drop", capacity.max_drop, 0, OPEN, 1, OPEN),
    KI64("model", "capacity_window", capacity.window, 1, INT64_C(1000000000)),
    KFLT("model", "capacity_min", capacity.min, 0, OPEN, INFINITY, OPEN),
    KFLT("model", "capacity_max", capacity.max, 0, OPEN, INFINITY, OPEN),
    KFLT("model", "capacity_max_change", capacity.max_change, 1, CLOSED, INFINITY, OPEN),
    KENUM("model", "drop_policy", model.moe.drop_policy, moe_drop_policy, moe_cfg_drop_names),
    KFLT("model", "aux_coef", model.moe.aux_coef, 0, CLOSED, INFINITY, OPEN),
    KENUM("model", "aux_scope", model.aux_scope, moe_aux_scope, aux_scope_names),
    KFLT("model", "z_coef", model.moe.z_coef, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "init_std", init_std, 0, OPEN, INFINITY, OPEN),
    KENUM("model", "scoring", model.moe.scoring, moe_scoring, scoring_names),
    KFLT("model", "route_scale", model.moe.route_scale, 0, OPEN, 1e6, CLOSED), // config.json's
    KINT("model", "n_group", model.moe.n_group, 1, 64),       // and divides n_experts
    KINT("model", "topk_group", model.moe.topk_group, 1, 64), // and <= n_group
    KFLT("model", "bias_rate", bias_rate, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "seq_aux_coef", model.moe.seq_aux_coef, 0, CLOSED, INFINITY, OPEN),
    KFLT("model", "router_jitter", model.moe.jitter_eps, 0, CLOSED, 1, OPEN),
    KSTR("model", "device", device, 1),
    KBOOL("model", "tf32", tf32),
    KENUM("model", "attention", attention, moe_attention_impl, attention_names),

    KI64("train", "seed", seed, 0, INT64_MAX),
    KI64("train", "steps", steps, 1, INT64_C(1000000000000)),
    KINT("train", "batch_size", batch_size, 1, 1 << 20),
    KINT("train", "seq_len", seq_len, 1, 1 << 20), // and <= model.max_seq_len
    KINT("train", "grad_accum", grad_accum, 1, 1 << 20),
    KENUM("train", "optimizer", optimizer, optim_kind, optimizer_names),
    KFLT("train", "lr", lr, 0, CLOSED, INFINITY, OPEN),
    KFLT("train", "min_lr", min_lr, 0, CLOSED, INFINITY, OPEN),             // and <= lr
    KI64("train", "warmup_steps", warmup_steps, 0, INT64_C(1000000000000)), // and <= steps
    KENUM("train", "schedule", schedule, moe_schedule_kind, schedule_names),
    KFLT("train", "beta1", beta1, 0, CLOSED, 1, OPEN),
    KFLT("train", "beta2", beta2, 0, CLOSED, 1, OPEN),
    KFLT("train", "eps", eps, 0, OPEN, INFINITY, OPEN),
    KFLT("train", "weight_decay", weight_decay, 0, CLOSED, INFINITY, OPEN),
    KBOOL("train", "decay_norms", decay_norms),
    KFLT("train", "grad_clip", grad_clip, 0, CLOSED, INFINITY, OPEN),
    KINT("train", "max_skipped", max_skipped, 1, INT_MAX),
    KINT("train", "threads", threads, 0, 1024),
    KENUM("train", "dtype", model.dtype, moe_dtype, dtype_names),
    KENUM("train", "recompute", model.recompute, moe_recompute, recompute_names),
    KI64("train", "eval_interval", eval_interval, 0, INT64_MAX),
    KINT("train", "eval_batches", eval_batches, 1, 1 << 20),
    KENUM("train", "load_alert_action", load_alert_action, moe_alert_action, alert_action_names),
    KSTR("train", "init_from", init_from, 0),

    KSTR("data", "train", train_path, 0),
    KSTR("data", "val", val_path, 0),
    KSTR("data", "dir", dir, 1),
    {.group = "data",
     .key = "text",
     .kind = K_STRLIST,
     .off = offsetof(moe_train_config, text),
     .count_off = OFF(n_text, int)},
    KFLT("data", "val_fraction", val_fraction, 0, OPEN, 0.5, CLOSED),
    KSTR("data", "tokenizer", tokenizer, 0),

    KSTR("log", "dir", run_dir, 1),
    KI64("log", "interval", interval, 1, INT64_MAX),
    KFLT("log", "load_alert", load_alert, 1, CLOSED, INFINITY, OPEN),
    KI64("log", "alert_after", alert_after, 0, INT64_C(1000000000000)),
    KI64("log", "alert_window", alert_window, 1, 10000),
    KBOOL("log", "timing", timing),
    KBOOL("log", "coactivation", coactivation),

    KI64("checkpoint", "interval", ckpt_interval, 0, INT64_MAX),
    KINT("checkpoint", "keep", ckpt_keep, 1, INT_MAX),

    KINT("parallel", "ep_size", ep_size, 0, 4096), // and divides the ranks and n_experts
    KENUM("parallel", "exchange", model.moe.exchange, moe_exchange, exchange_names),
    KINT("parallel", "overlap_chunks", model.moe.overlap_chunks, 1, MOE_OVERLAP_MAX), // <= E_local
    {.group = "parallel",
     .key = "expert_placement",
     .kind = K_INTLIST,
     .off = offsetof(moe_train_config, expert_placement),
     .count_off = OFF(n_placement, int)}, // a permutation of 0 .. n_experts-1, or empty
    KENUM("parallel", "transport", transport, moe_transport, transport_names),
    KBOOL("parallel", "shard_optimizer", shard_optimizer),
};
_Static_assert(sizeof moe_cfg_specs / sizeof moe_cfg_specs[0] == CFG_N_SPECS,
               "CFG_N_SPECS counts the keys");

int moe_cfg_spec_index(const char *group, const char *key) {
    for (int i = 0; i < CFG_N_SPECS; i++)
        if (strcmp(moe_cfg_specs[i].group, group) == 0 && strcmp(moe_cfg_specs[i].key, key) == 0)
            return i;
    return -1;
}

int moe_cfg_is_group(const char *name) {
    for (int g = 0; g < CFG_N_GROUPS; g++)
        if (strcmp(moe_cfg_group_names[g], name) == 0) return 1;
    return 0;
}
