// The MoE layer (DESIGN.md §3): router -> capacity/drop -> permute -> experts (SwiGLU)
// -> combine, with the load-balancing aux loss and the router z-loss.
//
// The layer is host-side orchestration: it calls the kernels of a moe_backend and
// never loops over floats itself, so the same code runs on every backend.
//
//   out = moe_layer_forward(inp)            inp, out [T, d]
//   loss contribution of the layer = L_aux + L_z (returned in moe_stats)
//   moe_layer_backward accumulates (+=) into dinp and every weight gradient.
#ifndef MOE_LAYER_H
#define MOE_LAYER_H

#include "layers/backend.h"
#include "layers/status.h"

typedef struct {
    int d_model;            // d
    int d_ff;               // ff, the expert hidden size
    int n_experts;          // E
    int top_k;              // k, 1 <= k <= E
    int norm_topk_prob;     // 1: combine weights renormalised over the k selected (Mixtral)
    double capacity_factor; // <= 0: dropless; else C = ceil((T*k/E) * capacity_factor)
    moe_drop_policy drop_policy;
    double aux_coef;        // load-balancing loss coefficient (>= 0)
    double z_coef;          // router z-loss coefficient (>= 0)
    moe_scoring scoring;    // softmax (Mixtral) or sigmoid (DeepSeek-V3)
    double route_scale;     // > 0, multiplies the combine weights (DeepSeek-V3's scaling)
    double seq_aux_coef;    // >= 0, sequence-level aux loss (DeepSeek-V3), 0 = off
    double jitter_eps;      // [0, 1): router input x * U(1-eps, 1+eps) in training, 0 = off
} moe_config;

// Defaults: Mixtral routing, dropless, aux 0.01, z 0.001.
moe_config moe_config_default(int d_model, int d_ff, int n_experts, int top_k);

// Checks every field against its contract; MOE_EINVAL with a message naming the field.
moe_status moe_config_check(const moe_config *cfg);

// The expert capacity per group of T tokens, 0 meaning "no limit" (dropless).
// C = ceil((T*k / E) * capacity_factor), evaluated in double in that order (Megatron).
int moe_capacity(const moe_config *cfg, int T);

// Views of one MoE layer's weights (or of their gradients) in a flat buffer.
// w1 and w3 of an expert are stored as one [2ff, d] matrix (rows 0..ff-1 are w1, rows
// ff..2ff-1 are w3), so that both projections are one GEMM over the expert's rows, as in
// Megatron-Core's fused fc1. HF names: experts.J.w1.weight = w13[J][0:ff],
// experts.J.w3.weight = w13[J][ff:2ff], experts.J.w2.weight = w2[J].
typedef struct {
    real *gate; // [E, d]        router
    real *w13;  // [E, 2*ff, d]  gate (w1) and up (w3) projections, stacked
    real *w2;   // [E, d, ff]    down projection
    real *bias; // [E] or NULL   aux-loss-free balancing bias: selection only, not trained
} moe_weights;

// Number of reals in one layer's weights, in the order gate, w13, w2.
size_t moe_weights_count(const moe_config *cfg);
// Points w at consecutive slices of buf (moe_weights_count(cfg) reals); w->bias = NULL.
void moe_weights_view(moe_weights *w, real *buf, const moe_config *cfg);

// Load statistics of the last forward (host memory, owned by the layer).
typedef struct {
    int tokens;           // T
    int capacity;         // C, 0 when dropless
    const int *routed;    // [E] top-k assignments per expert, before dropping
    const int *kept;      // [E] assignments per expert after dropping
    long dropped;         // assignments dropped in all
    double max_over_mean; // max_e routed / mean_e routed
    double cv;            // std_e routed / mean_e routed (population std)
    double entropy;       // mean over tokens of the router entropy -sum_e p log p (nats)
    double aux;           // L_aux (already times aux_coef; HF's helper reports k times this)
    double seq_aux;       // L_seq (already times seq_aux_coef), 0 when off
    double z;             // L_z (already times z_coef)
    double logit_mean, logit_std, logit_max_abs, lse_mean; // router logit distribution
} moe_stats;

// Aux-loss-free balancing (DeepSeek-V3, DESIGN.md §3.9), after each optimizer step:
// bias[e] += rate * sign(mean(c) - c[e]) with c the step's routed counts (host arrays).
void moe_router_bias_update(real *bias, const long *counts, int E, double rate);

// max/mean and CV (std / mean) of E per-expert counts (summed over steps or micro-batches,
// hence long), 0 when every count is 0; *hot receives the first expert with the most.
void moe_load_summary(const long *counts, int E, double *max_over_mean, double *cv, int *hot);

// Host-side summary of per-expert counts; shared by every backend.
void moe_stats_from_counts(moe_stats *st, const int *routed, const int *kept, int E, int T,
                           int capacity);

typedef struct {
    moe_config cfg;
    moe_backend *be;
    int max_tokens;
    int last_tokens; // T of the last forward
    // forward activations (device memory of the backend), shapes for T tokens, N <= T*k rows
    real *logits;     // [T, E]
    real *scores;     // [T, E]  softmax p or sigmoid s
    real *probs;      // [T, E]  the distribution s' of the balancing losses
    int *seq_counts;  // [T, E]  (at most T sequences) per-sequence routed counts
    real *jitter;     // [T, d]  router input noise u (training with jitter_eps > 0)
    real *router_in;  // [T, d]  inp * u, what the router saw
    real *lse;        // [T]
    int *topk_idx;    // [T, k]
    real *weights;    // [T, k]  combine weights before dropping
    int *keep;        // [T, k]
    int *assign_row;  // [T, k]  row of each assignment in the grouped order, -1 if dropped
    int *row_token;   // [T*k]   token of each grouped row
    int *scratch;     // [2*T*k] capacity-decision scratch
    int *counts;      // [2E+1]  routed counts [E], then row offsets [E+1]
    real *xp;         // [N, d]  permuted inputs
    real *h13;        // [N, 2ff] w1 and w3 projections: h1 = h13[:, :ff], h3 = h13[:, ff:]
    real *act;        // [N, ff] silu(h1) * h3
    real *ye;         // [N, d]  expert outputs
    real *losses;     // [8]     aux, z, entropy, seq_aux, logit mean/std/max|.|, mean lse
    // backward scratch
    real *dlogits;    // [T, E]
    real *dweights;   // [T, k]
    real *dye;        // [N, d]
    real *dact;       // [N, ff]
    real *dh13;       // [N, 2ff]
    real *dxp;        // [N, d]
    // host copies
    int *host_counts; // [2E+1]  routed counts, then row offsets
    int *host_kept;   // [E]
    moe_stats stats;
    int last_seq_len; // seq_len of the last forward
    size_t bytes;     // device memory of the buffers above
    int jittered;     // the last forward used router_in
    uint64_t noise_key;          // set by the caller before a training forward: the jitter
                                 // noise is a function of it (resumable, backend-independent)
    const real *jitter_override; // test-only: this noise [T, d] (backend memory) instead of
                                 // drawing it
} moe_layer;

// Allocates the activation buffers for up to max_tokens tokens per call.
moe_status moe_layer_init(moe_layer *L, moe_backend *be, const moe_config *cfg,
                          int max_tokens);
void moe_layer_free(moe_layer *L);

// out [T, d] = MoE(inp [T, d]). The T tokens are T / seq_len sequences of seq_len
// consecutive tokens (for the sequence-level aux loss; seq_len <= 0 means one sequence).
// training=0 is inference: never drops, no jitter.
// If stats is not NULL it receives the load statistics of this call.
moe_status moe_layer_forward(moe_layer *L, real *out, const real *inp, const moe_weights *w,
                             int T, int seq_len, int training, moe_stats *stats);

// Backward of the last forward (same inp and w).
// dinp [T, d] += dL/dinp, grads += dL/dweights, where
// L = sum(out * dout) + dloss * (L_aux + L_seq + L_z); dloss scales the router losses
// (1 for a single micro-batch, 1/n under gradient accumulation over n).
moe_status moe_layer_backward(moe_layer *L, real *dinp, const moe_weights *grads,
                              const real *dout, const real *inp, const moe_weights *w,
                              double dloss);

#endif
