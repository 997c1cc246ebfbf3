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
#include "layers/exchange.h"
#include "layers/moe_stats.h"
#include "layers/status.h"

// How expert parallelism moves rows (DESIGN.md §4, README "Expert parallelism"):
//   dedup (default): one packet per (token, destination rank), carrying the token's row once
//     and its combine weights; the destination sums its experts' weighted outputs of the
//     token into one row that travels back (DeepEP's dispatch/combine). A token whose k
//     experts share a rank crosses once each way, not k times.
//   rows: one row per kept assignment each way; the combine weights stay home and the
//     combine runs on the token's rank.
typedef enum { MOE_EXCHANGE_DEDUP = 0, MOE_EXCHANGE_ROWS = 1 } moe_exchange;

// The most chunks an exchange is overlapped in (moe_config.overlap_chunks): each chunk takes
// two transfer slots of the group's communicator per pass (MOE_EXCHANGE_SLOTS).
enum { MOE_OVERLAP_MAX = 16 };

typedef struct {
    int d_model;            // d
    int d_ff;               // ff, the expert hidden size
    int n_experts;          // E
    int top_k;              // k, 1 <= k <= E
    int norm_topk_prob;     // 1: combine weights renormalised over the k selected (Mixtral)
    double capacity_factor; // <= 0: dropless; else C = ceil((T*k/E) * capacity_factor)
    moe_drop_policy drop_policy;
    double aux_coef;       // load-balancing loss coefficient (>= 0)
    double z_coef;         // router z-loss coefficient (>= 0)
    moe_scoring scoring;   // softmax (Mixtral) or sigmoid (DeepSeek-V3)
    double route_scale;    // > 0, multiplies the combine weights (DeepSeek-V3's scaling)
    double seq_aux_coef;   // >= 0, sequence-level aux loss (DeepSeek-V3), 0 = off
    double jitter_eps;     // [0, 1): router input x * U(1-eps, 1+eps) in training, 0 = off
    moe_dtype dtype;       // GEMM precision (DESIGN.md §5b): fp32 (default) or bf16 operands
                           // with fp32 accumulation; routing, losses and SwiGLU stay fp32
    moe_exchange exchange; // expert parallelism's row exchange (no effect on one rank)
    int overlap_chunks;    // expert parallelism (either exchange): each exchange in this many
                           // chunks of the local experts, chunk i+1's rows travelling while the
                           // experts compute chunk i (0 or 1: one exchange; <= E_local, <= 16)
    int n_group;           // group-limited routing (DeepSeek-V3): E experts in n_group groups,
    int topk_group;        // top-k among the topk_group best (sum of a group's two best scores);
                           // n_group <= 1: off. 1 < n_group <= 64, E % n_group == 0, E/n_group
                           // >= 2, 1 <= topk_group <= n_group, k <= topk_group E / n_group
} moe_config;

// Defaults: Mixtral routing, dropless, aux 0.01, z 0.001.
moe_config moe_config_default(int d_model, int d_ff, int n_experts, int top_k);

// Checks every field against its contract; MOE_EINVAL with a message naming the field.
moe_status moe_config_check(const moe_config *cfg);

// The expert capacity per group of T tokens, 0 meaning "no limit" (dropless), for this
// step's capacity_factor (cfg gives k and E; cfg->capacity_factor is the configured one).
// C = ceil((T*k / E) * capacity_factor), evaluated in double in that order (Megatron).
int moe_capacity(const moe_config *cfg, int T, double capacity_factor);

// How one forward runs. Training drops over capacity at this step's capacity_factor (a
// schedule or "auto" moves it step by step: train/capacity.h) and jitters the router's
// input; inference never drops and never jitters.
typedef struct {
    int training;           // 1: training, 0: inference
    double capacity_factor; // training only: <= 0 dropless, else C = ceil((T*k/E) * factor)
} moe_pass;

static inline moe_pass moe_pass_train(double capacity_factor) {
    moe_pass p = {1, capacity_factor};
    return p;
}
static inline moe_pass moe_pass_infer(void) {
    moe_pass p = {0, 0.0};
    return p;
}

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
    // bf16 copies of gate, w13 and w2, same shapes (dtype bf16: what the GEMMs read; the
    // owner refreshes them from the fp32 weights); NULL in fp32 and in gradient views
    const moe_bf16 *gate16, *w13_16, *w2_16;
} moe_weights;

// Number of reals in one layer's weights, in the order gate, w13, w2.
size_t moe_weights_count(const moe_config *cfg);
// Points w at consecutive slices of buf (moe_weights_count(cfg) reals); w->bias = NULL.
void moe_weights_view(moe_weights *w, real *buf, const moe_config *cfg);
// The same for a layer holding E_local of the experts: gate [E, d], w13 [E_local, 2ff, d],
// w2 [E_local, d, ff].
size_t moe_weights_count_local(const moe_config *cfg, int E_local);
void moe_weights_view_local(moe_weights *w, real *buf, const moe_config *cfg, int E_local);

// moe_stats (a forward's load statistics) and the host-side helpers over per-expert counts
// are layers/moe_stats.h's.


// The backward's work space: what one layer's backward writes and the next layer's backward
// (the layer below) overwrites, so a model needs one for all its layers (layers run their
// backward one after the other). Sized for T tokens, N_send = T*k rows sent and N_exp rows
// computed by the local experts (device memory).
typedef struct {
    moe_backend *be;
    real *dlogits;   // [T, E]
    real *dweights;  // [T, k]
    real *dye;       // [N_send, d]  gradient of the rows that came back to the combine
    real *dye_e;     // [N_exp, d]   the same rows at their experts (one rank: == dye)
    real *dstage;    // [N_exp, d]   exchange staging (expert parallelism only, else NULL)
    real *dact;      // [N_exp, ff]
    real *dh13;      // [N_exp, 2ff]  (bf16: holds the rounded dh13_16 [N_exp, 2ff] bf16)
    real *dxe;       // [N_exp, d]   gradient of the experts' input rows
    real *dxp;       // [N_send, d]  the same, back on the sending side (== dxe with one rank)
    moe_bf16 *g16;   // bf16: [max(T E, N_exp d)] an output gradient, rounded to bf16
                     // as the operand of the next two GEMMs (NULL in fp32)
    real *h13_stage; // bf16: [N_exp, 2ff] fp32 h13 of the layer being computed (the forward's
                     // GEMM output, read by SwiGLU only): dh13's memory (NULL in fp32)
    size_t bytes;
} moe_backward_scratch;

// How a layer is laid out: tokens per call, which experts it holds, how many rows they may
// compute, and whether it shares a backward scratch. Zero fields mean the single-rank layout.
// Under expert parallelism (ep with size R > 1) rank r of the EP group holds experts
// [r E/R, (r+1) E/R): n_local_experts and first_expert follow from ep (0 or those values).
typedef struct {
    int max_tokens;                // T per call (required, >= 1)
    moe_comm *ep;                  // the expert-parallel group (NULL: one rank)
    int n_local_experts;           // E_local: the experts whose weights this layer holds (0: all E)
    int first_expert;              // global index of the first local expert (the HF name's J)
    int max_expert_rows;           // rows the local experts compute per call; 0 (or more): the
                                   // exact bound, R * T * min(k, E_local) (every rank's every
                                   // token picks only experts of this rank; T*k with one rank).
                                   // Less: a cap (the dropless memory plan): a forward whose
                                   // routing gives some rank's experts more rows (or, dedup, more
                                   // packets) stops with MOE_EINVAL naming the rank, its rows and
                                   // its hottest expert, on every rank of the group together,
                                   // before any row moves
    moe_backward_scratch *scratch; // shared backward scratch (NULL: the layer allocates one)
    int forward_only; // inference: no backward scratch at all (moe_layer_backward refuses)
    // Activation recompute (train.recompute): the forward keeps the layer's routing, its
    // experts' input rows (xe, bf16 xe16) and the combined rows (ye), not the experts' hidden
    // activations (h13, act, their bf16 copies, EP's ye_local), which the backward recomputes
    // from the kept rows (the same GEMMs on the same operands: bit-identical, and no exchange
    // again). Those buffers are then one set for all the layers: hidden_from's (NULL: this
    // layer allocates the set).
    int recompute;
    const struct moe_layer *hidden_from;
} moe_layer_shape;

// Bytes per expert row of a layer's buffers: `forward` is kept per layer for the backward
// (permuted input, w1/w3 outputs, SwiGLU output, expert output), `backward` is the shared
// scratch's (their gradients). What `moe stats --capacity` plans memory with.
void moe_row_bytes(const moe_config *cfg, size_t *forward, size_t *backward);

// The most rows a layer of this shape's local experts can compute per call, whatever the
// routing: R T min(k, E_local) (the memory of a dropless layer at the worst routing).
size_t moe_layer_rows_bound(const moe_config *cfg, const moe_layer_shape *shape);

typedef struct moe_layer {
    moe_config cfg;
    moe_backend *be;
    int max_tokens;
    int recompute;        // the backward recomputes h13, act (bf16: h13_16, act16) and ye_local
    int owns_hidden;      // those buffers are this layer's (0: another layer's, shape.hidden_from)
    int E_local, expert0; // local experts: global indices expert0 .. expert0 + E_local - 1
    int max_expert_rows;  // N_exp, rows the local experts' buffers hold
    int rows_bound;       // the exact bound: max_expert_rows below it is a cap, checked per forward
    moe_comm *ep;         // the expert-parallel group, NULL with one rank
    int ep_size;          // R (1 without expert parallelism)
    // the last forward's exchange plan (host; R > 1 only), reused by the backward
    int *send_rows, *recv_rows;           // [R] rows to / from each rank of the group
    int *send_counts, *recv_counts;       // [R, E_local] per (rank, local expert)
    moe_row_chunk *to_expert, *to_source; // [R * E_local] the reorder and its inverse
    int *local_offsets;                   // [E_local + 1] grouped rows of the local experts
    // the exchanges in C chunks (cfg.overlap_chunks; 1: one exchange): chunk c is the local
    // experts [chunk_expert[c], chunk_expert[c+1]); per (chunk, rank) the rows (packets) that
    // travel and where they start: on the tokens' side (tok_*), on the experts' side (exp_*),
    // which receives them chunk by chunk ([chunk][source rank]...). What comes back travels in
    // the same blocks (rows) or in the combine's chunks (dedup: tokb_*, expb_*, below)
    int chunks;
    int *chunk_expert;                              // [C + 1]
    int *tok_rows, *tok_at, *exp_rows, *exp_at;     // [C, R] each
    int *tokb_rows, *tokb_at, *expb_rows, *expb_at; // [C, R] each (rows: tok_*, exp_*)
    const int *expert_offsets; // the experts' row offsets of the last forward (host)
    // the dedup exchange's plan (cfg.exchange dedup): a packet is one (token, destination
    // rank) pair; send_rows/recv_rows then count packets. A packet travels out in the chunk of
    // its first local expert's group (g_min: its experts can start once it is there) and
    // back in the chunk of its last (g_max: its sum is complete then). Sent, packets are in
    // [destination][g_min][token] order (the "dispatch" order) and return into
    // [destination][g_max][token] (the "combine" order); received, [g_min][source][token]
    // and [g_max][source][token]; with one chunk both are the destination (source), then the
    // token. Host arrays, with device copies (d_*) of those the kernels read.
    // P_send = T min(k, R), P_recv = R T.
    int *pk_token;    // [P_send]       the token of each packet sent (dispatch order)
    int *pk_home;     // [T, R]         the combine-order packet of (token, rank), -1 none
    int *pk_slots;    // [P_send, 1+k]  the token, then per slot its local expert at the
                      //                packet's rank (-1 when dropped or elsewhere)
    int *pk_slots_in; // [P_recv, 1+k]  the same as received (source, g_min, token order)
    int *pk_expand;   // [N_exp]        the received packet (dispatch order) of each expert row
    int *pk_assign;   // [P_recv, k]    the expert row of each received slot, -1 none
    int *pk_assign_b; // [P_recv, k]    the same in the combine order
    int *pk_perm_b;   // [P_recv]       the dispatch-order index of each combine-order packet
    int *pk_order;    // [P_recv]       the received packets by source, then token
    int *d_pk_token, *d_pk_home, *d_pk_expand, *d_pk_assign, *d_pk_assign_b, *d_pk_perm_b;
    int pk_sent, pk_received; // packets of the last forward
    real *w_send, *w_recv;    // [P_send, k], [P_recv, k] the packets' combine weights (device)
    real *w_recv_b;           // [P_recv, k] the same in the combine order (then dw's)
    real *dw_recv, *dw_send;  // [P_recv, k], [P_send, k] their gradients, back home
    int expert_rows;          // rows the local experts computed
    // the exchanges since moe_layer_exchange_reset (host): bytes this rank sent to each rank
    // of the group (itself included), rows its experts received, seconds spent in them
    long *sent_bytes; // [R]
    long received_rows;
    double exchange_s;
    // timing (layers/timing.h): the laps of the model's timer (NULL: off), and this layer's
    // experts' seconds since moe_layer_exchange_reset
    struct moe_timer *timer;
    double experts_s;
    // co-activations (set coactivation = 1 to count): coact[i E + j], i < j, the tokens whose
    // top-k held both experts, summed over forwards until the caller zeroes it (host [E, E];
    // the top-k choices then come back in the forward's one device-to-host copy)
    int coactivation;
    long *coact;
    int last_tokens; // T of the last forward
    // forward activations (device memory of the backend), shapes for T tokens, N = T*k rows
    // sent and N_exp rows computed by the local experts (one rank: the same rows)
    real *logits;    // [T, E]
    real *scores;    // [T, E]  softmax p or sigmoid s
    real *probs;     // [T, E]  the distribution s' of the balancing losses
    int *seq_counts; // [T, E]  (at most T sequences) per-sequence routed counts
    real *jitter;    // [T, d]  router input noise u (training with jitter_eps > 0)
    real *router_in; // [T, d]  inp * u, what the router saw
    real *lse;       // [T]
    int *topk_idx;   // [T, k]
    real *weights;   // [T, k]  combine weights before dropping
    int *keep;       // [T, k]
    int *assign_row; // [T, k]  row of each assignment in the grouped order, -1 if dropped
    int *row_token;  // [T*k]   token of each grouped row
    int *scratch;    // [2*T*k] capacity-decision scratch
    // The one device-to-host copy per forward: routed counts [E], row offsets [E+1] and the
    // router losses [MOE_LOSS_SLOTS] (layers/backend.h moe_loss_slot), in one buffer.
    void *readback; // counts, offsets, losses
    int *counts;    // [2E+1]  the readback's counts, then offsets
    real *losses;   // [MOE_LOSS_SLOTS] the readback's losses
    real *xp;       // [N, d]  dispatch: the permuted inputs, the rows this rank sends
    real *xr;       // [N_exp, d] rows received, [source rank][local expert] order (EP only)
    real *xe;       // [N_exp, d] the local experts' input rows (one rank: == xp)
    real *h13;      // [N_exp, 2ff] w1 and w3 projections: h1 = h13[:, :ff], h3 = h13[:, ff:]
    real *act;      // [N_exp, ff] silu(h1) * h3
    real *ye_local; // [N_exp, d] the local experts' outputs (one rank: == ye)
    real *ye;       // [N, d]  the expert outputs of this rank's rows, back for the combine
    // bf16 (cfg.dtype): the GEMM inputs saved for the weight gradients, rounded to bf16
    moe_bf16 *router_in16; // [T, d]       what the router saw
    moe_bf16 *xe16;        // [N_exp, d]   the experts' input rows
    moe_bf16 *act16;       // [N_exp, ff]  silu(h1) * h3
    moe_bf16 *h13_16;      // [N_exp, 2ff] SwiGLU's input, for its backward (training layers)
    // backward scratch: views of the (possibly shared) moe_backward_scratch
    moe_backward_scratch *bwd;
    int owns_bwd;
    int staged_in_bwd; // bf16 with a backward scratch: xp, xe, act and h13 (fp32 only between
                       // a kernel and its bf16 rounding) live in bwd's dxp, dxe, dact, h13_stage
    real *dlogits, *dweights, *dye, *dact, *dh13, *dxp;
    // host copies
    void *host_readback; // the readback, copied once per forward
    int *host_counts;    // [2E+1]  routed counts, then row offsets (views of host_readback)
    real *host_losses;   // [MOE_LOSS_SLOTS]
    int *host_kept;      // [E]
    moe_stats stats;
    int last_seq_len; // seq_len of the last forward
    size_t bytes;     // device memory of the buffers above (a shared scratch: its owner's)
    // Global-batch balancing (moe_layer_set_aux_counts): L_aux's f from these counts [E]
    // (device) over aux_tokens tokens instead of the forward's own; aux_tokens 0: off
    int *aux_counts;
    int aux_tokens;
    int jittered;                // the last forward used router_in
    uint64_t noise_key;          // set by the caller before a training forward: the jitter
                                 // noise is a function of it (resumable, backend-independent)
    const real *jitter_override; // test-only: this noise [T, d] (backend memory) instead of
                                 // drawing it
} moe_layer;

// Allocates a backward scratch for layers of this config and shape (shape->scratch ignored).
moe_status moe_backward_scratch_init(moe_backward_scratch *s, moe_backend *be,
                                     const moe_config *cfg, const moe_layer_shape *shape);
void moe_backward_scratch_free(moe_backward_scratch *s);

// Allocates a layer of this shape. E_local < E needs an exchange (expert parallelism), which
// this build's layer does not have yet: MOE_EINVAL.
moe_status moe_layer_create(moe_layer *L, moe_backend *be, const moe_config *cfg,
                            const moe_layer_shape *shape);

// moe_layer_create with the single-rank shape: all E experts, up to max_tokens tokens per
// call, its own backward scratch.
moe_status moe_layer_init(moe_layer *L, moe_backend *be, const moe_config *cfg, int max_tokens);
void moe_layer_free(moe_layer *L);

// out [T, d] = MoE(inp [T, d]). The T tokens are T / seq_len sequences of seq_len
// consecutive tokens (for the sequence-level aux loss; seq_len <= 0 means one sequence).
// pass: training (dropping at pass.capacity_factor, jitter) or inference (moe_pass_infer).
// If stats is not NULL it receives the load statistics of this call.
moe_status moe_layer_forward(moe_layer *L, real *out, const real *inp, const moe_weights *w, int T,
                             int seq_len, moe_pass pass, moe_stats *stats);

// Global-batch balancing (DESIGN.md §3.6): the next forwards and backwards take L_aux's f from
// counts [E] (host, slot order: the step's routed counts summed over its micro-batches and
// ranks) over `tokens` tokens, f_e = counts[e] / (k tokens), P from their own tokens; the
// gradient is the same formula's. counts NULL: back to the forward's own counts.
void moe_layer_set_aux_counts(moe_layer *L, const int *counts, int tokens);

// Backward of the last forward (same inp and w).
// dinp [T, d] += dL/dinp, grads += dL/dweights, where
// L = sum(out * dout) + dloss * (L_aux + L_seq + L_z); dloss scales the router losses
// (1 for a single micro-batch, 1/n under gradient accumulation over n).
// Zeroes the exchange statistics (sent_bytes, received_rows, exchange_s) and experts_s, e.g.
// per step.
void moe_layer_exchange_reset(moe_layer *L);

moe_status moe_layer_backward(moe_layer *L, real *dinp, const moe_weights *grads, const real *dout,
                              const real *inp, const moe_weights *w, double dloss);

#endif
