// The Mixtral-style decoder (DESIGN.md §2), forward and backward.
//
//   x0 = embed[tokens]
//   per layer l:  h = x_l + Attn(RMSNorm(x_l));  x_{l+1} = h + MoE(RMSNorm(h))
//   logits = RMSNorm(x_L) lm_head^T;  loss = CE + sum_l (L_aux + L_z)
//
// Parameters, gradients and activations live in flat buffers (one allocation each)
// reached through structs of named pointers. Tensors of the same kind are stacked over
// layers (all layers' wqkv together, ...), and the expert weights come last, so the
// expert part of the parameters is one contiguous region (expert parallelism reduces it
// differently from the dense part).
#ifndef MOE_MODEL_H
#define MOE_MODEL_H

#include <stdint.h>

#include <float.h>
#include <math.h>

#include "layers/moe.h"

// A cross-entropy (nats per token) is a result when its perplexity exp(ce) is a finite double:
// ce <= ln(DBL_MAX) = 709.78. Beyond it the model gives the data a probability below e^-709 per
// token, which only damaged weights do (a norm weight of 1e30 gives 1.7e29): training skips
// such a step like a NaN one, eval refuses such a mean.
static inline int moe_model_ce_is_result(double ce) { return !(ce > log(DBL_MAX)); }

// The Hugging Face class a model is a folder of (DESIGN.md §2.1): its config.json fields and
// tensor names, and what it can express (moe_model_config_check refuses the rest).
// train.recompute: what the forward keeps for the backward (moe_model_config.recompute).
typedef enum {
    MOE_RECOMPUTE_NONE = 0,
    MOE_RECOMPUTE_MOE = 1,
    MOE_RECOMPUTE_LAYER = 2
} moe_recompute;

typedef enum {
    MOE_FAMILY_MIXTRAL = 0, // MixtralForCausalLM: every layer MoE, no shared expert, no q/k norm
    MOE_FAMILY_QWEN3_MOE,   // Qwen3MoeForCausalLM: q/k norm per head, dense layers
    MOE_FAMILY_QWEN2_MOE,   // Qwen2MoeForCausalLM: q/k/v biases, gated shared expert, dense layers
    MOE_FAMILY_OLMOE,       // OlmoeForCausalLM: q/k norm over the whole projection
} moe_family;

// q/k normalisation: an RMSNorm of q and of k after the projection, before RoPE.
typedef enum {
    MOE_QK_NORM_NONE = 0,
    MOE_QK_NORM_HEAD, // each head's hd values, weights q_norm [hd], k_norm [hd] (Qwen3-MoE)
    MOE_QK_NORM_FULL, // the whole projection, q_norm [H hd], k_norm [KV hd] (OLMoE)
} moe_qk_norm;

// The tokens the load-balancing loss counts its f over (DESIGN.md §3.6).
typedef enum {
    MOE_AUX_MICRO = 0, // each micro-batch's own counts (Switch, Mixtral)
    MOE_AUX_GLOBAL,    // the step's: every micro-batch of every rank (Megatron's global_aux_loss,
                       // Qwen's global-batch balancing): moe_model_set_aux_counts
} moe_aux_scope;

#define MOE_MODEL_MAX_LAYERS 1024

typedef struct {
    moe_family family;  // the HF class of its folders
    int vocab_size;     // V
    int d_model;        // d
    int n_layers;       // L
    int n_heads;        // H
    int n_kv_heads;     // KV (GQA: H % KV == 0)
    int head_dim;       // hd, even; 0: d_model / n_heads (Mixtral). Qwen3-MoE's and OLMoE's
                        // folders set it: q, k, v are H*hd, KV*hd wide, o_proj maps H*hd -> d
    int max_seq_len;    // longest sequence (RoPE table size)
    int tie_embeddings; // lm_head is embed
    double rope_theta;
    double rms_norm_eps;
    int router_bias; // keep a per-layer selection bias [L, E] (aux-loss-free balancing)
    // Dense layers (moe_model_layer_is_moe): layer l's FFN is one SwiGLU MLP of dense_d_ff
    // instead of the MoE when l < first_k_dense (DeepSeek's first_k_dense_replace), when its
    // bit is set in dense_layers (Qwen's mlp_only_layers), or when (l + 1) % sparse_step != 0
    // (Qwen's decoder_sparse_step; 1: none). moe.d_ff is the experts' width.
    int first_k_dense, sparse_step;
    uint64_t dense_layers[MOE_MODEL_MAX_LAYERS / 64];
    int dense_d_ff; // the dense layers' MLP width (HF intermediate_size beside moe_intermediate_size)
    // Shared expert: every MoE layer adds g(x) MLP_s(x) to its output, MLP_s one SwiGLU of
    // shared_d_ff (0: none), g = sigmoid(x . w_g) per token when shared_gate (Qwen2-MoE), else 1
    int shared_d_ff, shared_gate;
    moe_qk_norm qk_norm;     // q/k RMSNorm before RoPE
    int qkv_bias;            // q, k and v projections have biases (Qwen2-MoE)
    moe_aux_scope aux_scope; // L_aux's counts: the micro-batch's, or the step's (the trainer)
    // The dropless memory plan: rows each MoE layer's local experts may compute per call (their
    // buffers' rows; 0: the worst routing's R T min(k, E_local), buffers for any routing). A
    // forward whose routing needs more stops with an error naming the rank and its hottest
    // expert (moe_layer_shape.max_expert_rows). Training's: not in config.json.
    int dropless_max_rows;
    // Activation recompute (train.recompute, docs/training.md "Memory plan"): what the forward
    // keeps for the backward. NONE: everything. MOE: each MoE layer keeps its input, its routing
    // and the rows its experts received, and the backward recomputes the experts' hidden
    // activations (one layer's buffers serve all). LAYER: each layer keeps its input (and its
    // MoE routing), the backward recomputes the whole layer. Gradients are bit-identical.
    moe_recompute recompute;
    moe_dtype dtype; // the whole model's GEMM precision (fp32, or bf16 operands with fp32
                     // accumulation: DESIGN §5b); its MoE layers take it from here
    moe_config moe;  // d_model, d_ff, experts, top_k, capacity, losses, scoring (its dtype is
                     // the model's: moe_model_create sets it)
} moe_model_config;

moe_status moe_model_config_check(const moe_model_config *cfg);

// Whether layer l is a MoE layer (else dense: see first_k_dense); the MoE layers; the MoE
// layer number of layer l (the MoE layers before it: the index of its router, experts and
// bias among the Lm MoE layers'), -1 when l is dense.
int moe_model_layer_is_moe(const moe_model_config *c, int l);
int moe_model_n_moe_layers(const moe_model_config *c);
int moe_model_moe_index(const moe_model_config *c, int l);
static inline void moe_model_set_dense_layer(moe_model_config *c, int l) {
    c->dense_layers[l / 64] |= (uint64_t)1 << (l % 64);
}
static inline int moe_model_dense_layer_listed(const moe_model_config *c, int l) {
    return (int)((c->dense_layers[l / 64] >> (l % 64)) & 1);
}
// The family's name in config.json's model_type ("mixtral", "qwen3_moe", ...).
const char *moe_model_family_name(moe_family f);

// hd: head_dim, or d_model / n_heads when it is 0.
static inline int moe_model_head_dim(const moe_model_config *c) {
    return c->head_dim > 0 ? c->head_dim : c->d_model / c->n_heads;
}

// Reals in the parameter buffer of a model of this config (nothing allocated).
size_t moe_model_param_count(const moe_model_config *cfg);

// Views into the flat parameter (or gradient) buffer. hd = moe_model_head_dim, Q = (H + 2 KV) * hd;
// Lm MoE layers and Ld = L - Lm dense ones (moe_model_moe_index); nq, nk: hd, hd (q/k norm per
// head) or H hd, KV hd (the whole projection). A view of a part the config does not have is
// NULL. HF names are Mixtral's (the other families': mlp.gate, mlp.experts.J.gate_proj, ...).
typedef struct {
    real *embed;       // [V, d]
    real *attn_norm;   // [L, d]          input_layernorm
    real *wqkv;        // [L, Q, d]        q_proj, k_proj, v_proj stacked by rows
    real *bqkv;        // [L, Q]           their biases (qkv_bias)
    real *q_norm;      // [L, nq]          self_attn.q_norm (qk_norm)
    real *k_norm;      // [L, nk]          self_attn.k_norm
    real *wo;          // [L, d, H*hd]     o_proj
    real *moe_norm;    // [L, d]          post_attention_layernorm
    real *router;      // [Lm, E, d]       block_sparse_moe.gate
    real *shared_gate; // [Lm, d]          mlp.shared_expert_gate (shared_gate)
    real *shared_w13;  // [Lm, 2 sff, d]   mlp.shared_expert.gate_proj (rows 0..sff-1), up_proj
    real *shared_w2;   // [Lm, d, sff]     mlp.shared_expert.down_proj
    real *dense_w13;   // [Ld, 2 dff, d]   mlp.gate_proj, mlp.up_proj of the dense layers
    real *dense_w2;    // [Ld, d, dff]     mlp.down_proj
    real *final_norm;  // [d]             model.norm
    real *lm_head;     // [V, d]           (== embed when tied)
    real *w13;         // [Lm, E_local, 2ff, d]   experts.J.w1 (rows 0..ff-1) and w3 (ff..2ff-1)
    real *w2;          // [Lm, E_local, d, ff]    experts.J.w2 (E_local = E with one rank)
} moe_model_params;

// One named contiguous tensor of the parameter buffer, as Hugging Face names it
// (the q/k/v and w1/w3 slices of our stacked matrices are tensors of their own).
typedef struct {
    char name[96];
    size_t offset;   // in reals, from the start of the buffer
    int rows, cols;  // cols == 0 for a vector
    int layer;       // -1 for embed, final norm, lm_head
    int is_norm;     // RMSNorm weight (no weight decay by default)
    int is_bias;     // a linear bias (no weight decay by default; initialised to 0)
    int is_residual; // a projection into the residual stream (o_proj, down_proj: the init's
                     // 1/sqrt(2L) scale)
    int is_expert;   // expert weight
    int expert;      // its global expert index (the one in the HF name); -1 when dense
} moe_model_tensor;

// The tensor table of a model of this config: moe_model_tensor_count entries in HF order
// (malloc'd; NULL when out of memory), as m->tensors of a model made from it.
int64_t moe_model_tensor_count(const moe_model_config *cfg);
moe_model_tensor *moe_model_tensor_table(const moe_model_config *cfg);

typedef struct {
    moe_model_config cfg;
    moe_backend *be;
    int training; // 1: moe_model_create (forward + backward); 0: moe_model_create_inference
    int max_batch, max_seq; // activation buffers sized for max_batch x max_seq tokens
                            // (inference: max_batch 1, max_seq = the longest chunk)
    int max_pos;            // inference: positions the KV cache holds, per sequence
    int n_seqs;             // inference: sequences the KV cache holds (batched decoding)
    int B, S;               // shape of the last forward
    moe_comm *ep;           // expert parallelism: the EP group (NULL: one rank)
    int E_local, expert0;   // the experts this model holds: slots expert0 .. expert0 + E_local - 1
    // expert placement (moe_model_set_expert_placement): slot s holds global expert placement[s];
    // every [E]-shaped buffer (router rows, bias, counts) is in slot order; slot_of the
    // inverse. NULL: the identity (slot = global expert)
    int *placement, *slot_of;

    size_t n_params;      // reals in the parameter buffer
    size_t n_dense;       // the first n_dense reals are dense, the rest expert weights
    real *params, *grads; // device buffers, n_params each
    // dtype bf16 (cfg.dtype): the parameters rounded to bf16 [n_params], what every GEMM
    // reads; refreshed from params at each training forward (unless params16_current) and at
    // the start of each inference sequence (pos0 = 0) (NULL in fp32)
    moe_bf16 *params16;
    // set by moe_model_bf16_for_update, cleared by the next training forward, which then skips
    // its refresh: an optimizer has just written params16 with its update
    int params16_current;
    moe_model_params p, g; // views
    int n_tensors;
    moe_model_tensor *tensors; // host table, HF names

    real *rope_cos, *rope_sin; // [positions, hd/2]
    real *router_bias;         // [L, E] selection bias (cfg.router_bias), else NULL; not trained
    uint64_t noise_key;        // set before a training forward: keys the router jitter noise

    // activations, T = B*S tokens. [L, ...] below is every layer's with train.recompute "none"
    // or "moe", one layer's ([T, ...], refilled by each layer's backward) with "layer"; x is
    // always every layer's (what "layer" recomputes from).
    int *tokens, *targets; // [T]
    real *x;               // [L+1, T, d]  residual stream entering each layer; x[L] final
    real *n1, *rstd1;      // [L, T, d], [L, T]   attention RMSNorm
    real *qkv;             // [L, T, Q]   after RoPE
    real *lse;             // [L, B, H, S]  log-sum-exp of each query row's attention scores
    real *attn_out;        // [L, T, H*hd]
    // bf16: n1, qkv and attn_out are kept in bf16 instead (the fp32 buffers above hold one
    // layer, [T, ...], the work space of the layer being computed):
    moe_bf16 *n1_16, *qkv16, *ao16; // [L, T, d], [L, T, Q], [L, T, H*hd]
    moe_bf16 *xf16;                 // [T, d]   the lm_head's input
    moe_bf16 *g16;    // bf16 work space: training, an output gradient rounded for its two GEMMs
                      // [T max(V, Q, d, H*hd)]; inference, a GEMM input [chunk max(Q, d, H*hd)]
    real *h;          // [L, T, d]   after the attention residual
    real *n2, *rstd2; // [L, T, d], [L, T]   MoE RMSNorm
    real *moe_out;    // [T, d]
    // the MLPs outside the experts (dense layers, shared expert; fm: the widest, see
    // moe_model_config), kept for the backward (inference: one layer's, [chunk, ...]):
    real *mlp_h13, *mlp_act; // [L, T, 2 fm], [L, T, fm]   gate|up projections, silu(gate) * up
    real *shared_y;          // [L, T, d]   MLP_s(n2), before the gate (shared_gate)
    real *shared_z;          // [L, T]      the gate's logit x . w_g
    moe_bf16 *n2_16, *act16; // bf16: the MLP GEMMs' inputs [L, T, d], [L, T, fm]
    real *qkv_pre;           // [L, T, Q]   qk_norm: q, k, v before the norm (and RoPE)
    real *rstd_qk;           // [L, T, nh]  their norms' rstd (nh = H + KV per head, 2 full)
    real *dmlp_h13, *dmlp_act, *dmlp_y, *dshared_z; // backward [T, 2 fm], [T, fm], [T, d], [T]
    real *xf, *rstdf;                               // [T, d], [T]
    real *logits;                                   // [T, V]
    real *losses;                                   // [T]
    moe_layer *moe; // [n_moe]: L for training, 1 shared by every layer for inference
    int n_moe;
    moe_stats *moe_stats; // [L] of the last forward
    // backward scratch
    real *dx, *dn, *dattn_out, *dqkv, *dlogits;
    // attention work space, shared by the layers: attention_scratch_size(max_seq, hd) reals in
    // training; inference: the scores [H, chunk, max_pos] of attention_cached_forward
    real *attn_scratch;
    size_t attn_scratch_size; // reals
    // inference: KV cache [L, n_seqs, max_pos, KV*hd] each
    real *k_cache, *v_cache;
    long *expert_hits;   // inference: [L, E] routed assignments summed over moe_model_infer calls
    long *step_hits;     // inference: [L, E] those of the last moe_model_infer call (the layers
                         // share one MoE layer, so moe_stats[l].routed is the last layer's)
    size_t buffer_bytes; // device memory of the buffers of this struct (params, grads, ...)

    // timing (layers/timing.h): laps by phase of the forwards and backwards, NULL: off
    // (moe_model_set_timer)
    struct moe_timer *timer;

    // loss parts of the last forward (means over its tokens)
    double ce, aux, z; // summed over layers; aux = L_aux + L_seq
} moe_model;

// Allocates parameters, gradients and activations for training; parameters are zero until
// moe_model_init_weights or a load.
moe_status moe_model_create(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                            int max_batch, int max_seq);

// The same under expert parallelism: the model holds the E/R experts of rank r of the EP group
// ep (R ranks; NULL: one rank, all E), its tensor table lists them under their global HF
// names, and its MoE layers exchange rows over ep. Dense weights are whole on every rank.
moe_status moe_model_create_parallel(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                                     int max_batch, int max_seq, moe_comm *ep);

// Allocates parameters, a KV cache of max_pos positions and the buffers of one chunk of at
// most max_chunk tokens (one layer's worth, reused by every layer): no gradients and no
// activations kept for a backward.
moe_status moe_model_create_inference(moe_model *m, moe_backend *be, const moe_model_config *cfg,
                                      int max_pos, int max_chunk);
// The same holding the experts of rank r of the EP group ep (as moe_model_create_parallel): the
// ranks of ep must make the same moe_model_infer calls (each on its own tokens).
moe_status moe_model_create_inference_parallel(moe_model *m, moe_backend *be,
                                               const moe_model_config *cfg, int max_pos,
                                               int max_chunk, moe_comm *ep);
// The same with a KV cache of n_seqs sequences (moe_model_infer_slot, moe_model_decode_batch).
moe_status moe_model_create_inference_batch(moe_model *m, moe_backend *be,
                                            const moe_model_config *cfg, int max_pos, int max_chunk,
                                            int n_seqs, moe_comm *ep);

// Expert placement (DESIGN.md §4): placement [E] lists the global experts in slot order (a
// permutation; NULL: the identity), so rank r of the EP group holds global experts
// placement[r El .. (r+1) El - 1]. Internally everything per expert stays in slot order (the
// gate rows, the bias, the exchange, the counts of moe_stats); the tensor table names each
// slot's tensors by its global expert, in HF order. Call it before the weights are set
// (moe_model_init_weights then gives every global expert the weights of the default placement).
// MOE_EINVAL when placement is not a permutation of 0 .. E-1.
moe_status moe_model_set_expert_placement(moe_model *m, const int *placement);
// The global expert in a slot; whether m holds global expert e.
int moe_model_expert_global(const moe_model *m, int slot);
int moe_model_holds_expert(const moe_model *m, int expert);
// Reorders v, n blocks of [E, width] (host), from slot order to global expert order
// (to_global = 1) or back (0): the router's rows (width d), the bias [L, E] (width 1).
void moe_model_placement_permute(const moe_model *m, real *v, int n, int width, int to_global);
// The same on a host image laid out like m->params (parameters, moments): its gate rows.
void moe_model_placement_image(const moe_model *m, real *host, int to_global);

// Inference on one sequence: tokens (host [n]) sit at positions pos0..pos0+n-1; their k/v are
// appended to the KV cache, which must already hold positions 0..pos0-1. Dropless MoE.
// Leaves the logits of the n tokens in m->logits [n, V] and the load of each layer in
// m->moe_stats. Same kernels as training.
moe_status moe_model_infer(moe_model *m, const int *tokens, int n, int pos0);
// The same for sequence `slot` of a KV cache of several (moe_model_create_inference_batch).
moe_status moe_model_infer_slot(moe_model *m, int slot, const int *tokens, int n, int pos0);
// Batched decoding: n rows, row i the next token of the sequence in slot slots[i] at position
// pos[i] (host arrays [n]; the caches hold its positions before): one forward, the MoE layers
// routing all n tokens together. Leaves the logits in m->logits [n, V].
moe_status moe_model_decode_batch(moe_model *m, const int *tokens, int n, const int *slots,
                                  const int *pos);
void moe_model_destroy(moe_model *m);

// Normal(0, std) matrices, residual projections (o_proj, w2) scaled by 1/sqrt(2L),
// norms at 1. Deterministic in seed (host RNG, then copied to the device).
void moe_model_init_weights(moe_model *m, uint64_t seed, double std);

// Forward of B sequences of S tokens (host arrays [B*S]); targets may be NULL (no loss).
// pass: moe_pass_train(the step's capacity factor) or moe_pass_infer() (the MoE layers never
// drop; the eval of a training model). Returns the loss parts in m->ce/aux/z.
moe_status moe_model_forward(moe_model *m, const int *tokens, const int *targets, int B, int S,
                             moe_pass pass);

// Backward of the last forward, accumulating into m->grads the gradient of
// loss_scale * (CE + sum aux + z) (loss_scale = 1/n under accumulation over n micro-batches).
moe_status moe_model_backward(moe_model *m, double loss_scale);

// Global-batch balancing (aux_scope "global", DESIGN.md §3.6): the following forwards and
// backwards take each MoE layer's L_aux f from counts [L, E] (host, by model layer, slot order:
// the step's routed counts summed over its micro-batches and every rank; dense layers' rows
// unread) over `tokens` tokens (micro-batches x ranks x T). counts NULL: each forward's own.
// MOE_EINVAL when a count or tokens does not fit an int.
moe_status moe_model_set_aux_counts(moe_model *m, const long *counts, long tokens);

void moe_model_zero_grads(moe_model *m);

// Times the forwards and backwards by phase into t (layers/timing.h; NULL: off): the model's
// and its MoE layers' laps accumulate into t->s until the caller resets it.
void moe_model_set_timer(moe_model *m, struct moe_timer *t);

// Expert parallelism, after the backward of a step's micro-batches: the dense gradients summed
// over all ranks (world), the expert gradients over the ranks that hold the same experts
// (edp; NULL or one rank: nothing). SUM only: the loss scale already divides by the ranks.
void moe_model_reduce_grads(moe_model *m, moe_comm *world, moe_comm *edp);
// sum of squares of the model's whole gradient, every dense and expert parameter once: the
// dense part is whole on every rank (after moe_model_reduce_grads), the experts' summed over the
// EP group. Collective over m->ep.
double moe_model_grad_sum_squares(moe_model *m);

// dtype bf16: params16 = bf16(params) (moe_model_forward and moe_model_infer at pos0 = 0 do it
// themselves; exposed for tests and benchmarks). No-op in fp32.
void moe_model_refresh_bf16(moe_model *m);
// The bf16 weights for an optimizer step to write (moe_optimizer_step's params16), NULL in fp32.
// The caller promises params16 = bf16(params) once its update is done and no other write to
// params before the next training forward, which then uses params16 as it is instead of
// refreshing it (AdamW is bound by memory: one pass over params instead of two). Any later
// forward refreshes again.
moe_bf16 *moe_model_bf16_for_update(moe_model *m);

// Device memory: parameters (with their bf16 copy in bf16), gradients, and everything else (activations, MoE buffers,
// scratch, KV cache, RoPE tables), in bytes.
void moe_model_memory(const moe_model *m, size_t *params, size_t *grads, size_t *activations);

#endif
