// The training configuration: a libconfig file -> a validated struct.
//
// Groups: model, train, data, log, checkpoint. Every key has a type, a default (or is
// required), and a range; unknown keys, wrong types, out-of-range values, integers that
// overflow, and inconsistent combinations are rejected with file, line and key.
// `--set group.key=value` overrides a key from the command line (applied to the parsed
// tree before validation, so it is checked exactly like a value from the file).
#ifndef MOE_TRAIN_CONFIG_H
#define MOE_TRAIN_CONFIG_H

#include <stdint.h>
#include <stdio.h>

#include "layers/model.h"
#include "layers/status.h"
#include "optim/optimizer.h"

#define MOE_PATH_MAX 1024
#define MOE_CAPACITY_MAX_POINTS 64
#define MOE_MAX_EXPERTS 4096 // model.n_experts' bound

// How model.capacity_factor moves during training (train/capacity.h applies it).
// model.attention (moe_cfg_specs' attention_names order)
typedef enum { MOE_ATTENTION_NATIVE = 0, MOE_ATTENTION_CUDNN = 1 } moe_attention_impl;

typedef enum {
    MOE_CAPACITY_FIXED = 0,    // one number
    MOE_CAPACITY_SCHEDULE = 1, // (step, factor) points, linear in between, held outside
    MOE_CAPACITY_AUTO = 2,     // follows the router: the P99 step's need over each window
} moe_capacity_mode;

// parallel.transport
typedef enum { MOE_TRANSPORT_MPI = 0, MOE_TRANSPORT_NCCL = 1 } moe_transport;

typedef struct {
    moe_capacity_mode mode;
    int n_points;                           // SCHEDULE: [1, MOE_CAPACITY_MAX_POINTS]
    int64_t step[MOE_CAPACITY_MAX_POINTS];  // strictly increasing, >= 0
    double factor[MOE_CAPACITY_MAX_POINTS]; // > 0, finite
    double max_drop;                        // AUTO (and its keys' defaults otherwise)
    int64_t window;
    double min, max, max_change;
} moe_capacity_plan;
#define MOE_MAX_TEXT_SOURCES 32

// What a config may read (issue 8). The config file and every file it @includes must be a
// regular file (not a FIFO, which would block, nor a device such as /dev/zero, which never
// ends) of at most MOE_CONFIG_MAX_BYTES, without NUL bytes; @includes nest at most
// MOE_CONFIG_MAX_INCLUDE_DEPTH deep (libconfig 1.5's own limit) and the config with its
// @includes expanded (a file counted each time it is included) is at most
// MOE_CONFIG_MAX_BYTES too. A --set value cannot @include.
#define MOE_CONFIG_MAX_BYTES (16 << 20)
#define MOE_CONFIG_MAX_INCLUDE_DEPTH 10

// Bounds on the products of values that size the model's and the trainer's buffers, checked
// in 64 bits once every key is in range (each key alone is; together they could wrap an int
// or a size_t). Counts of elements (reals, ints or longs), not bytes.
// batch_size * seq_len: tokens per micro-batch (the model takes an int)
#define MOE_CONFIG_MAX_TOKENS (INT64_C(1) << 24)
// batch_size * seq_len * top_k * max(d_model, d_ff): MoE rows, int-indexed
#define MOE_CONFIG_MAX_DISPATCH INT64_C(2147483647)
// (no batch_size * n_heads * seq_len^2 bound: attention keeps one log-sum-exp per query row,
// not the scores, and its scratch is O(threads * seq_len))
// batch_size * seq_len * vocab_size
#define MOE_CONFIG_MAX_LOGITS (INT64_C(1) << 36)
// n_layers * batch_size * seq_len * d_model
#define MOE_CONFIG_MAX_ACTIVATIONS (INT64_C(1) << 36)
// grad_accum * n_layers * n_experts: the trainer's per-micro-batch counts
#define MOE_CONFIG_MAX_COUNTS (INT64_C(1) << 26)
// eval_batches * batch_size * seq_len
#define MOE_CONFIG_MAX_EVAL_TOKENS (INT64_C(1) << 36)
// vocab_size * d_model (embedding, lm_head)
#define MOE_CONFIG_MAX_EMBED (INT64_C(1) << 32)
// n_layers * d_model^2 (the attention weights are at most 4x this)
#define MOE_CONFIG_MAX_ATTN_WEIGHTS (INT64_C(1) << 34)
// n_layers * n_experts * 3 * d_ff * d_model (w1, w2, w3 of every expert)
#define MOE_CONFIG_MAX_EXPERT_WEIGHTS (INT64_C(1) << 34)

// train.load_alert_action: what a load alert does (README "Load alerts").
typedef enum { MOE_ALERT_WARN = 0, MOE_ALERT_STOP = 1 } moe_alert_action;

// Every field's default is in moe_train_config_default (config.c); the comments say the ranges.
typedef struct {
    // ---- model { } ------------------------------------------------------------
    // The model's keys are fields of `model` (layers/model.h; the MoE layer's in model.moe,
    // layers/moe.h); model.moe.d_model and model.router_bias follow from d_model and
    // bias_rate (moe_trainer_model_config). Key: field, range:
    //   vocab_size      model.vocab_size          [2, 1<<24]
    //   d_model         model.d_model             [1, 65536]
    //   n_layers        model.n_layers            [1, 1024]
    //   n_heads         model.n_heads             [1, 4096]; d_model % n_heads == 0
    //   n_kv_heads      model.n_kv_heads          [1, n_heads]; n_heads % n_kv_heads == 0;
    //                                             unset: = n_heads
    //   d_ff            model.moe.d_ff            [1, 1<<20], expert hidden size
    //   n_experts       model.moe.n_experts       [1, 4096]
    //   top_k           model.moe.top_k           [1, n_experts]
    //   max_seq_len     model.max_seq_len         [1, 1<<20] (HF max_position_embeddings)
    //   rope_theta      model.rope_theta          (0, 1e12] (config.json's bound)
    //   rms_norm_eps    model.rms_norm_eps        (0, 1)
    //   tie_embeddings  model.tie_embeddings      bool
    //   norm_topk_prob  model.moe.norm_topk_prob  bool
    //   capacity_factor model.moe.capacity_factor >= 0, finite (0: dropless); or a schedule
    //                   ((step, factor), ...) (capacity.mode MOE_CAPACITY_SCHEDULE: steps >= 0
    //                   increasing, factors > 0); or "auto" (MOE_CAPACITY_AUTO, the keys below)
    //   dropless_max_rows model.dropless_max_rows [0, 2^30]: rows each MoE layer's local
    //                   experts may compute per call (0: the worst routing's; a forward that
    //                   needs more stops naming the rank and expert: docs/training.md)
    //   max_drop        capacity.max_drop         (0, 1): auto's drop bound on the P99 step
    //   capacity_window capacity.window           [1, 1e9] steps per auto decision
    //   capacity_min    capacity.min              (0, inf): auto's lower bound
    //   capacity_max    capacity.max              [capacity_min, inf): its upper bound and
    //                                             the factor it starts from
    //   capacity_max_change capacity.max_change   [1, inf): the most one decision multiplies
    //                                             or divides the factor by
    //   drop_policy     model.moe.drop_policy     "probs" | "position"; DESIGN.md §3.3
    //   aux_coef        model.moe.aux_coef        >= 0
    //   z_coef          model.moe.z_coef          >= 0
    //   scoring         model.moe.scoring         "softmax" | "sigmoid" (DeepSeek-V3)
    //   route_scale     model.moe.route_scale     (0, 1e6]: multiplies the combine weights
    //   seq_aux_coef    model.moe.seq_aux_coef    >= 0 (0: off), sequence-level aux loss
    //   router_jitter   model.moe.jitter_eps      [0, 1) (0: off), router input noise U(1-j, 1+j)
    moe_model_config model;
    // model.capacity_factor beyond one number: a schedule of (step, factor) points or "auto"
    // (train/capacity.h); model.moe.capacity_factor then holds the factor of step 0
    moe_capacity_plan capacity;
    double init_std;  // > 0
    double bias_rate; // >= 0 (0: off): aux-loss-free bias balancing rate
    // the backend the run computes on, by name (layers/backend.h moe_backend_names: "cpu";
    // "cpu-strict" is the test-only strict-memory CPU); --device NAME sets it
    char device[MOE_PATH_MAX];
    int tf32; // GPU backends: TF32 tensor-core math in the GEMMs (default false: strict fp32)
    // model.attention: "native" (moe.c's own kernels, every backend and dtype) or "cudnn"
    // (cuDNN's fused attention on the cuda backend, bf16 only: docs/gpu.md)
    moe_attention_impl attention;

    // ---- train { } ------------------------------------------------------------
    int64_t seed;               // >= 0
    int64_t steps;              // [1, 1e12]
    int batch_size;             // sequences per micro-batch, [1, 1<<20]
    int seq_len;                // [1, model.max_seq_len]
    int grad_accum;             // micro-batches per step, [1, 1<<20]
    optim_kind optimizer;       // "adamw" | "sgd" (optim/optimizer.h)
    double lr;                  // >= 0, finite
    double min_lr;              // [0, lr]: the cosine schedule ends here
    int64_t warmup_steps;       // [0, steps]
    moe_schedule_kind schedule; // "cosine" | "constant" (optim/optimizer.h)
    double beta1;               // [0, 1)
    double beta2;               // [0, 1)
    double eps;                 // > 0
    double weight_decay;        // >= 0
    int decay_norms;            // bool; false: RMSNorm weights get no weight decay
    double grad_clip;           // >= 0 (0 = off)
    int max_skipped;            // consecutive non-finite steps before stopping, >= 1
    int threads;                // [0, 1024] (0 = OpenMP's default)
    // train.recompute, "none" (default) | "moe" | "layer": stored in model.recompute (model.h)
    // train.dtype, "fp32" (default) | "bf16": the GEMM precision, stored in model.dtype (the model's)
    // (bf16 operands, fp32 accumulation, fp32 master weights and optimizer; DESIGN.md §5b)
    int64_t eval_interval;              // steps, >= 0 (0 = never)
    int eval_batches;                   // micro-batches of validation, [1, 1<<20]
    moe_alert_action load_alert_action; // "warn" | "stop": what a load alert does
    char init_from[MOE_PATH_MAX];       // "" or an HF checkpoint folder (issue #4)

    // ---- data { } -------------------------------------------------------------
    char train_path[MOE_PATH_MAX]; // "" -> "<dir>/train.bin"
    char val_path[MOE_PATH_MAX];   // "" -> "<dir>/val.bin"
    char dir[MOE_PATH_MAX];        // where prepared files go, not ""
    // text sources (files or folders) prepared with the run's tokenizer (below) when the
    // token files are missing; list of strings
    int n_text;
    char text[MOE_MAX_TEXT_SOURCES][MOE_PATH_MAX];
    double val_fraction; // (0, 0.5]
    // a Hugging Face tokenizer folder (its tokenizer.json) that prepares data.text and travels
    // with the checkpoints; "" = the byte tokenizer, or train.init_from's tokenizer
    // when that folder has one (data/tokenizer.h moe_tokenizer_for_run)
    char tokenizer[MOE_PATH_MAX];

    // ---- log { } --------------------------------------------------------------
    char run_dir[MOE_PATH_MAX]; // key "dir", not ""
    int64_t interval;           // steps between console lines, >= 1
    // The load alert (README "Load alerts"): after a warm-up grace of alert_after steps, a
    // layer alerts when the median of its per-step max/mean load over the last alert_window
    // steps exceeds load_alert, or an expert got no token in all of them. Defaults measured
    // on configs/default.cfg (1200 steps) and shakespeare.cfg (2000): a fresh model routes
    // byte tokens by identity, so its per-step max/mean reaches 3.95 of the 4.0 possible at
    // top-2 of 8, and the 50-step median is 2.42 and 2.34 over the first 50 steps; after step
    // 150 it is at most 1.63 and 1.66 (per-step: median 1.2-1.3, P95 1.6-1.7, max 2.6), so
    // 2.0 clears it by 17%. A 20-step window would not: a 10-step skew of 2.0-2.4x in
    // shakespeare's layer 0 (steps 936-945) takes its median to 1.98. A collapsed router sits
    // at E/top_k (4.0 at top-2 of 8, 8.0 at top-1).
    double load_alert;    // >= 1 (2.0: an expert with twice its share)
    int64_t alert_after;  // steps of warm-up grace, [0, 1e12]
    int64_t alert_window; // steps, [1, 10000]: fewer than W/2 never fire
    int timing;           // bool (default true): metrics.jsonl's "time" breakdown per step
    int coactivation;     // bool (default true): expert_load.jsonl's "coactivation" every
                          // log.interval steps

    // ---- checkpoint { } (issue #4) --------------------------------------------
    int64_t ckpt_interval; // key "interval", >= 0 (0 = only at the end)
    int ckpt_keep;         // key "keep", >= 1

    // ---- parallel { } (expert parallelism, DESIGN.md §4) ----------------------
    // ranks per expert-parallel group: each holds n_experts / ep_size experts; 0 = all the
    // ranks of the run (mpirun -np R). Must divide R and n_experts; the R / ep_size groups
    // hold replicas of the same experts (expert data parallelism). [0, 4096]
    int ep_size;
    // expert_placement: the experts in rank order, a permutation of 0 .. n_experts-1 (rank j
    // of each EP group holds experts expert_placement[j El .. (j+1) El - 1], El = n_experts /
    // ep_size, in every layer); n_placement 0 (an empty list, the default): identity.
    int expert_placement[MOE_MAX_EXPERTS];
    int n_placement;
    // transport: what moves expert parallelism's rows and the gradient all-reduce: "mpi"
    // (default; device memory staged through the host) or "nccl" (the device's own, on the
    // cuda backend built with NCCL: one GPU per rank)
    moe_transport transport;
    // shard_optimizer (ZeRO-1, docs/expert-parallelism.md): each of the D data-parallel replicas
    // of the dense parameters keeps the optimizer state of 1/D of them; gradients are
    // reduce-scattered and the updated parameters all-gathered. Default false.
    int shard_optimizer;

    // where the config came from (for messages)
    char source[MOE_PATH_MAX];
} moe_train_config;

// Every field at its default.
void moe_train_config_default(moe_train_config *cfg);

// Parses `path`, applies `n_set` overrides of the form "group.key=value" (value in
// libconfig syntax: 3, 3L, 0.5, true, "text"), validates. On error returns MOE_EINVAL
// (or MOE_EIO if a file cannot be read, or is not a regular file of at most
// MOE_CONFIG_MAX_BYTES) with a message
// "<file>:<line>: <group>.<key>: <what is wrong>" (for an override: "--set group.key").
// No key is required: every key has a default, so an empty file is a valid config.
// path NULL: no file (defaults + overrides; source ""). @include "x" is relative to the
// config's folder (as libconfig 1.5 resolves it: "<folder>/x" even when x is absolute; x
// itself when the path has no folder), within the limits above. A "\x00" escape in a
// string (which libconfig drops) is refused, and so is a product of values beyond its
// MOE_CONFIG_MAX_* bound. Integers are taken as written in the source, not as libconfig 1.5
// reads them (it wraps 3000000000 to -1294967296 without an L suffix); a literal beyond 64
// bits is rejected. data.text also accepts a single string (a list of one). A combination that
// is inconsistent is reported at the line of the key named first (or, when that key is at
// its default, of the other one), naming both. On error *cfg is left untouched.
moe_status moe_train_config_load(moe_train_config *cfg, const char *path, int n_set,
                                 char *const *sets);

// train.init_from's model keys (DESIGN.md §2.1): with a reader set, moe_train_config_load
// reads the model of the folder train.init_from names (a checkpoint or an HF folder) and takes
// each model key the config leaves at its default from it; a key the config sets must agree
// (an error names both values). Without one (the default) the keys stay as configured and are
// compared with the folder when its weights load. The reader fills *out from the folder's
// config.json (the checkpoint library's moe_checkpoint_model_config).
typedef moe_status (*moe_cfg_model_reader)(const char *init_from, moe_model_config *out);
void moe_train_config_set_model_reader(moe_cfg_model_reader reader);

// Writes the resolved config (every key, defaults included) in libconfig syntax, so that
// loading it gives the same struct: doubles in the shortest form that reads back exactly,
// int64 with an L suffix outside the 32-bit range, strings escaped. When capacity_factor
// is 0 (dropless), drop_policy is written as a comment (set, it would be rejected).
// MOE_EINVAL (nothing written) for a struct that would not load back (NaN, bad enum).
moe_status moe_train_config_write(const moe_train_config *cfg, FILE *f);

#endif
