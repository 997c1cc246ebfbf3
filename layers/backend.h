// The kernel interface: one backend object, a table of function pointers plus the backend's
// own state, that every layer calls.
//
// The CPU implementation (layers/cpu/, OpenMP + OpenBLAS) is the reference; a CUDA
// implementation (cuda/) fills the same table with kernels of the same names and
// argument order, and is tested op by op against the CPU one. The two are mirrored file by
// file: the twin of the kernel in layers/cpu/X.c is in cuda/X.cu.
//
// Shape of a call: ggml-style `be->fn(be, ...)`. Every kernel receives the backend object it
// was called through, first. Why: a kernel needs its backend's state (CPU: the thread count
// and the strict-memory registry; CUDA: its stream, cuBLAS handle and workspace), and passing
// it explicitly means no global state: two backends live side by side in one process (the
// twin tests run CPU and CUDA on the same inputs), and a kernel can never reach another
// backend's stream. A separate context argument beside a const table would carry the same
// information in two pointers that must always travel together; here it is one.
//
// Backends are found by name (moe_backend_create("cpu", ...)), chosen by the config key
// model.device or --device; nothing above layers/ names a backend's implementation.
//
// Conventions (llm.c style): outputs first, then inputs, then sizes.
// Matrices are row-major. `y = x W^T` with W stored [out, in].
// All pointers are device pointers of the backend unless the comment says "host"; the host
// never dereferences a device pointer (the CPU backend's strict mode, "cpu-strict", makes
// every such access fault). Memory moves between host and device only through the three
// typed copies.
// Integer index arrays are `int` (32-bit); sizes fit comfortably (T*k*d < 2^31).
// "+=" in a comment means the kernel accumulates into its output.
#ifndef MOE_BACKEND_H
#define MOE_BACKEND_H

#include <stddef.h>
#include <stdint.h>

#include "layers/real.h"
#include "layers/status.h"

// How an expert that receives more than `capacity` assignments picks the ones it keeps.
typedef enum {
    MOE_DROP_PROBS = 0,    // keep the largest combine weights (ties: earlier token)
    MOE_DROP_POSITION = 1, // keep the first ones in token order
} moe_drop_policy;

// How router logits become scores.
typedef enum {
    MOE_SCORE_SOFTMAX = 0, // p = softmax(z) (Mixtral)
    MOE_SCORE_SIGMOID = 1, // s = sigmoid(z) (DeepSeek-V3)
} moe_scoring;

typedef struct moe_backend moe_backend;
struct moe_comm; // layers/exchange.h

// bf16 storage (DESIGN.md §5b): the upper 16 bits of an IEEE fp32 (1 sign, 8 exponent, 7
// mantissa bits). Only the conversion kernels and the *_bf16 GEMMs read or write it.
typedef uint16_t moe_bf16;

// The precision of a model's GEMMs: fp32, or bf16 operands with fp32 accumulation.
typedef enum {
    MOE_DTYPE_F32 = 0,
    MOE_DTYPE_BF16 = 1,
} moe_dtype;

// One block of rows for moe_copy_chunks.
typedef struct {
    int src, dst, rows;
} moe_row_chunk;

// The slots of router_losses' output (in this order), read back once per MoE forward.
typedef enum {
    MOE_LOSS_AUX = 0,       // L_aux = aux_coef * E * sum_e f_e P_e
    MOE_LOSS_Z,             // L_z = z_coef * mean_t lse(t)^2
    MOE_LOSS_ENTROPY,       // mean router entropy, mean_t -sum_e s'_e log s'_e
    MOE_LOSS_SEQ_AUX,       // L_seq = seq_aux_coef * mean_b E sum_e f_{b,e} P_{b,e}
    MOE_LOSS_LOGIT_MEAN,    // mean of the logits
    MOE_LOSS_LOGIT_STD,     // their (population) std
    MOE_LOSS_LOGIT_MAX_ABS, // max |logit|
    MOE_LOSS_LSE_MEAN,      // mean lse
    MOE_LOSS_SLOTS
} moe_loss_slot;

// ---- argument structs ---------------------------------------------------------------------
// The entries that take many sizes and hyper-parameters take them as one of these structs,
// by value (the CUDA wrappers hand them to their kernels as they are): a kernel that needs
// one more (shared experts, group routing, q/k norms) gets a field, not a position in five
// signatures. Unused fields of a call are not read.

// The shape of a router call (router_topk, router_losses, router_backward).
typedef struct {
    int T;       // tokens: rows of logits [T, E]
    int E;       // experts
    int k;       // experts chosen per token, 1 <= k <= E
    int seq_len; // tokens per sequence: the T tokens are T / seq_len sequences of seq_len
                 // consecutive ones (the sequence aux loss; router_topk does not read it)
} moe_router_shape;

// The router's hyper-parameters: how scores become choices and combine weights (router_topk,
// router_backward) and the loss coefficients (router_losses, router_backward).
typedef struct {
    moe_scoring scoring; // softmax or sigmoid scores
    int norm_topk_prob;  // 1: weights = route_scale * s_sel / sum(s_sel); 0: route_scale * s_sel
    real route_scale;    // > 0, the combine weights' factor
    real aux_coef;       // L_aux's coefficient
    real seq_aux_coef;   // L_seq's coefficient (0: off, seq_counts is not read)
    real z_coef;         // L_z's coefficient
    int n_group;         // group-limited routing (DeepSeek-V3): E experts in n_group groups of
    int topk_group;      // E/n_group; the topk_group groups of the largest sum of their two
                         // best s + bias are kept, top-k picks among those. n_group <= 1: off
    int aux_tokens;      // the tokens L_aux's counts were taken over: f_e = counts[e] / (k
                         // aux_tokens); 0: T, the call's own (global-batch balancing passes the
                         // step's counts over every micro-batch and rank, DESIGN.md §3.6)
} moe_router_hparams;

// One rope call: rows of n_heads heads of size hd, the first n_rot of them rotated.
typedef struct {
    int T;       // rows of out, inp [T, n_heads*hd]
    int S;       // rows per sequence: row t has position pos0 + t % S
    int pos0;    // position of each sequence's first row (inference: the cache's length)
    int n_rot;   // heads rotated (the q and k heads of a qkv row); the others are copied
    int n_heads; // heads per row
    int hd;      // head size (even): dimension i pairs with i + hd/2
    int inverse; // 1: rotate by -angle (the backward)
} moe_rope_args;

// The shape of a training attention call (attention_forward, attention_backward, their bf16
// twins): rows qkv [T = B*S, (H + 2KV)*hd] = [q | k | v].
typedef struct {
    int B;  // sequences
    int S;  // tokens per sequence (causal within each)
    int H;  // query heads
    int KV; // key/value heads, H % KV == 0: query head h reads kv head h / (H/KV)
    int hd; // head size
} moe_attention_shape;

// One AdamW step's hyper-parameters (adamw_update's formula).
typedef struct {
    real lr;           // learning rate
    real beta1, beta2; // the moments' decay rates
    real eps;          // added to sqrt(v / bc2)
    real weight_decay; // decoupled: p -= lr * weight_decay * p (0 for unregularised regions)
    real bc1, bc2;     // bias corrections of this step t: 1 - beta1^t, 1 - beta2^t
    real grad_scale;   // g = grad_scale * grads (gradient clipping, loss scaling)
} moe_adamw_hparams;

// Options of moe_backend_create; zero-initialised means "the defaults".
typedef struct {
    int procs_per_node; // processes sharing this node's cores (mpirun ranks): the automatic
                        // thread count is divided among them (0 or 1: none)
    int threads; // CPU: worker threads, 0 = automatic (OMP_NUM_THREADS, else cores capped by the
                 // cgroup CPU quota); other backends ignore it
    int tf32;    // GPU: TF32 tensor-core math in the GEMMs (model.tf32); the CPU ignores it
    int attention_cudnn; // cuda: the bf16 attention calls through cuDNN's fused attention
                         // (model.attention = "cudnn"); a backend without it refuses it
    int row_invariant;   // CPU: every kernel computes each output row independently of how many
                         // rows the call has (GEMMs as plain loops, each output one sum in k
                         // order; the cached attention one query row at a time), so a row's
                         // logits are the same bits in any batch: for `--deterministic` serving
                         // and parity tests; slow. Also MOE_ROW_INVARIANT=1. Other backends
                         // refuse it (MOE_EINVAL)
} moe_backend_options;

struct moe_backend {
    const char *name; // the name it was created by: "cpu", "cpu-strict", "cuda"
    void *state;      // the backend's own (CPU: struct cpu_state of layers/cpu/cpu_backend.h)
    int host_memory;  // 1: backend pointers are plain host memory the host may pass to a
                      // library (MPI) directly (the CPU); 0: only through the typed copies
    void (*destroy)(moe_backend *be); // frees the state and the object (moe_backend_destroy)
    // One line for logs: the implementation, its kernels and its parallelism, e.g.
    // "BLAS: OpenBLAS 0.3.21 ... (kernels Zen); threads: 2". Host string owned by the backend.
    const char *(*describe)(moe_backend *be);

    // ---- memory ---------------------------------------------------------
    void *(*alloc)(moe_backend *be, size_t bytes); // zero-filled; NULL on failure
    void (*free)(moe_backend *be, void *ptr);
    // The three typed copies: host -> device, device -> host, device -> device.
    void (*copy_to_device)(moe_backend *be, void *dst, const void *host_src, size_t bytes);
    void (*copy_to_host)(moe_backend *be, void *host_dst, const void *src, size_t bytes);
    void (*copy_on_device)(moe_backend *be, void *dst, const void *src, size_t bytes);
    void (*zero)(moe_backend *be, void *ptr, size_t bytes);
    // Waits until every kernel called so far has finished (layers/timing.h's laps). NULL: the
    // kernels are synchronous (the CPU).
    void (*synchronize)(moe_backend *be);
    // The device's own transport for expert parallelism (NCCL on cuda; NULL where there is
    // none, as on the CPU, whose rows MPI moves directly): *out is a communicator of host's
    // ranks whose backend-memory operations (alltoallv_rows, allreduce_sum_real) run on the
    // device, the host-memory ones through host. *out owns host (its destroy destroys host),
    // and its split splits both. Collective over host.
    moe_status (*device_comm)(moe_backend *be, struct moe_comm *host, struct moe_comm **out);

    // ---- dense GEMM -----------------------------------------------------
    // c[m,n] = op(a) @ op(b) + beta * c, op(a) is [m,kd], op(b) is [kd,n].
    // a is stored [m,kd] (or [kd,m] if trans_a); b is stored [kd,n] (or [n,kd] if trans_b).
    void (*matmul)(moe_backend *be, real *c, const real *a, const real *b, int m, int n, int kd,
                   int trans_a, int trans_b, real beta);

    // ---- grouped expert GEMMs --------------------------------------------
    // Rows are grouped by expert: expert e owns rows [offsets[e], offsets[e+1]).
    // `offsets` is a HOST array of n_experts+1 ints. weight is [E, n_out, n_in].
    // out[r,:] = inp[r,:] @ weight[e]^T            out [N, n_out], inp [N, n_in]
    void (*expert_matmul_forward)(moe_backend *be, real *out, const real *inp, const real *weight,
                                  const int *offsets, int n_experts, int n_out, int n_in);
    // dinp[r,:] (= or +=) dout[r,:] @ weight[e]     dinp [N, n_in], dout [N, n_out]
    void (*expert_matmul_backward_input)(moe_backend *be, real *dinp, const real *dout,
                                         const real *weight, const int *offsets, int n_experts,
                                         int n_out, int n_in, int accumulate);
    // dweight[e] += dout[rows_e]^T @ inp[rows_e]    dweight [E, n_out, n_in]
    void (*expert_matmul_backward_weight)(moe_backend *be, real *dweight, const real *dout,
                                          const real *inp, const int *offsets, int n_experts,
                                          int n_out, int n_in);

    // ---- bf16 mixed precision (DESIGN.md §5b) -------------------------------
    // Twins of the four GEMMs above, same arguments and shapes, with the operands in bf16 and
    // the output (and beta's accumulation, dweight's +=) in fp32: every product of two bf16
    // values is exact in fp32 and the sums run in fp32 (cuBLAS: cublasGemmEx with
    // CUDA_R_16BF inputs, CUDA_R_32F output and CUBLAS_COMPUTE_32F). The reduction order over
    // kd is the library's (OpenBLAS blocks kd; a GPU splits it over tiles), so results agree
    // with an fp32 GEMM on the same bf16 values to fp32 rounding of a kd-term sum, and with
    // the fp32 GEMM on the unrounded values to bf16 rounding of the operands (~2^-9 relative).
    //   c [m,n] fp32; a [m,kd] (or [kd,m]) bf16; b [kd,n] (or [n,kd]) bf16
    void (*matmul_bf16)(moe_backend *be, real *c, const moe_bf16 *a, const moe_bf16 *b, int m,
                        int n, int kd, int trans_a, int trans_b, real beta);
    // out [N, n_out] fp32; inp [N, n_in] bf16; weight [E, n_out, n_in] bf16
    void (*expert_matmul_forward_bf16)(moe_backend *be, real *out, const moe_bf16 *inp,
                                       const moe_bf16 *weight, const int *offsets, int n_experts,
                                       int n_out, int n_in);
    // dinp [N, n_in] fp32 (= or +=); dout [N, n_out] bf16; weight [E, n_out, n_in] bf16
    void (*expert_matmul_backward_input_bf16)(moe_backend *be, real *dinp, const moe_bf16 *dout,
                                              const moe_bf16 *weight, const int *offsets,
                                              int n_experts, int n_out, int n_in, int accumulate);
    // dweight [E, n_out, n_in] fp32 +=; dout [N, n_out] bf16; inp [N, n_in] bf16
    void (*expert_matmul_backward_weight_bf16)(moe_backend *be, real *dweight, const moe_bf16 *dout,
                                               const moe_bf16 *inp, const int *offsets,
                                               int n_experts, int n_out, int n_in);
    // out[i] = bf16(in[i]), round to nearest, ties to even; NaN stays NaN (quiet, sign kept),
    // +-Inf stay, finite values beyond bf16's range round to +-Inf, fp32 subnormals round
    // like any other value (to bf16 subnormals or zero).      out [n] bf16; in [n] fp32
    void (*to_bf16)(moe_backend *be, moe_bf16 *out, const real *in, size_t n);
    // out[i] = in[i] widened to fp32 (exact).                   out [n] fp32; in [n] bf16
    void (*from_bf16)(moe_backend *be, real *out, const moe_bf16 *in, size_t n);

    // ---- router ----------------------------------------------------------
    // Scores: softmax p = softmax(z), or sigmoid s = sigmoid(z); probs s' = the per-token
    // expert distribution the balancing losses use (p, or s / sum_e s_e); lse = logsumexp(z).
    // Top-k of s + bias (bias may be NULL; ties: lower expert index), in descending order,
    // among the experts of the hp.topk_group best of hp.n_group groups (a group's score: the
    // sum of its two best s + bias; n_group <= 1: all experts);
    // weights = route_scale * s_sel / sum(s_sel) when norm_topk_prob, else route_scale * s_sel
    // (shape.T, E, k; hp.scoring, norm_topk_prob, route_scale, n_group, topk_group).
    // scores, probs [T,E]; lse [T]; topk_idx, weights [T,k]; logits [T,E]; bias [E]
    void (*router_topk)(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                        real *weights, const real *logits, const real *bias, moe_router_shape shape,
                        moe_router_hparams hp);

    // counts[e] = number of top-k assignments to expert e.   counts [E]; topk_idx [T,k]
    void (*moe_dispatch_counts)(moe_backend *be, int *counts, const int *topk_idx, int T, int k,
                                int E);
    // The same per sequence: tokens are T / seq_len sequences of seq_len consecutive tokens.
    // seq_counts [T/seq_len, E]
    void (*moe_seq_counts)(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k,
                           int E, int seq_len);

    // keep[t,j] = 1 if assignment (t,j) survives the capacity limit, else 0.
    // capacity <= 0 keeps everything. scratch [2*T*k] ints.
    void (*moe_capacity_keep)(moe_backend *be, int *keep, int *scratch, const int *topk_idx,
                              const real *weights, const int *counts, int T, int k, int E,
                              int capacity, moe_drop_policy policy);

    // Groups kept assignments by expert, in token order within an expert:
    // offsets[e] = first row of expert e (offsets[E] = rows in all),
    // assign_row[t,j] = row of assignment (t,j) or -1 if dropped, row_token[row] = t.
    // offsets [E+1]; assign_row [T,k]; row_token [T*k] (first offsets[E] used)
    void (*moe_permute_index)(moe_backend *be, int *offsets, int *assign_row, int *row_token,
                              const int *topk_idx, const int *keep, int T, int k, int E);

    // ---- data movement ---------------------------------------------------
    // xp[r,:] = x[row_token[r],:]                          xp [N,d]; x [T,d]
    void (*moe_permute)(moe_backend *be, real *xp, const real *x, const int *row_token, int N,
                        int d);
    // Row blocks: for each chunk c, dst rows [chunks[c].dst, +rows) = src rows [chunks[c].src,
    // +rows), rows of d reals (the expert-parallel reorder between [source rank][local expert]
    // and [local expert][source rank]). chunks is a HOST array of n_chunks; blocks never overlap.
    void (*moe_copy_chunks)(moe_backend *be, real *dst, const real *src,
                            const moe_row_chunk *chunks, int n_chunks, int d);
    // out[t,:] = sum_j weights[t,j] * y[assign_row[t,j],:] (kept only)   out [T,d]; y [N,d]
    void (*moe_combine_forward)(moe_backend *be, real *out, const real *y, const real *weights,
                                const int *assign_row, int T, int k, int d);
    // dy[r,:] = weights[t,j] * dout[t,:]; dweights[t,j] = dout[t,:] . y[r,:] (0 if dropped)
    void (*moe_combine_backward)(moe_backend *be, real *dy, real *dweights, const real *dout,
                                 const real *y, const real *weights, const int *assign_row, int T,
                                 int k, int d);
    // The bf16 layer's twins, each in one pass (the same bits as the fp32 kernel followed by
    // to_bf16 of its row output, on one backend): xe16[r,:] = bf16(x[row_token[r],:]), and
    // dy16[r,:] = bf16(weights[t,j] * dout[t,:]) with dweights as moe_combine_backward's.
    //                               xe16 [N,d] bf16; x [T,d]; dy16 [N,d] bf16; dweights [T,k]
    void (*moe_permute_bf16)(moe_backend *be, moe_bf16 *xe16, const real *x, const int *row_token,
                             int N, int d);
    void (*moe_combine_backward_bf16)(moe_backend *be, moe_bf16 *dy16, real *dweights,
                                      const real *dout, const real *y, const real *weights,
                                      const int *assign_row, int T, int k, int d);
    // dx[t,:] += sum_j dxp[assign_row[t,j],:] (kept only)     dx [T,d]; dxp [N,d]
    void (*moe_unpermute_add)(moe_backend *be, real *dx, const real *dxp, const int *assign_row,
                              int T, int k, int d);

    // ---- SwiGLU ----------------------------------------------------------
    // Rows of h13 [N, 2ff] are [h1 | h3]. act = silu(h1) * h3, silu(a) = a * sigmoid(a).
    // act [N, ff]; h13 [N, 2ff]
    void (*swiglu_forward)(moe_backend *be, real *act, const real *h13, int N, int ff);
    // dh13 = [dh1 | dh3]: dh1 = dact * h3 * silu'(h1), dh3 = dact * silu(h1),
    // silu'(a) = s * (1 + a * (1 - s)), s = sigmoid(a).   dh13 [N, 2ff]; dact [N, ff]
    void (*swiglu_backward)(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                            int ff);
    // The experts' GEMM next to the SwiGLU and its SwiGLU in one call, so that a backend can run
    // the SwiGLU on each expert's rows while they are in cache (the CPU: right after the
    // expert's GEMM, on the same thread). Every tensor is indexed by the absolute row, as the
    // grouped GEMMs' (rows [offsets[0], offsets[E])); the same bits as the two kernels:
    //   expert_swiglu_forward  = expert_matmul_forward (h13 = inp w13^T, kept for the backward),
    //                            then swiglu_forward (act).
    //                            act [N, ff]; h13 [N, 2ff]; inp [N, d]; w13 [E, 2ff, d]
    //   expert_swiglu_backward = expert_matmul_backward_input (dact = dout w2, not accumulated:
    //                            scratch), then swiglu_backward (dh13).
    //                            dh13 [N, 2ff]; dact [N, ff]; dout [N, d]; w2 [E, d, ff];
    //                            h13 [N, 2ff]; offsets: host [E+1]
    void (*expert_swiglu_forward)(moe_backend *be, real *act, real *h13, const real *inp,
                                  const real *w13, const int *offsets, int n_experts, int ff,
                                  int d);
    void (*expert_swiglu_backward)(moe_backend *be, real *dh13, real *dact, const real *dout,
                                   const real *w2, const real *h13, const int *offsets,
                                   int n_experts, int ff, int d);
    // The bf16 layer's SwiGLU, each in one pass (the same values as swiglu_forward followed by
    // to_bf16, and from_bf16 + swiglu_backward + to_bf16, bit for bit on one backend):
    // act16 = bf16(swiglu(h13)), and h13_16 = bf16(h13) unless h13_16 is NULL (kept for the
    // backward).                     act16 [N, ff] bf16; h13_16 [N, 2ff] bf16 or NULL; h13 [N, 2ff]
    void (*swiglu_forward_bf16)(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, const real *h13,
                                int N, int ff);
    // The bf16 layer's first expert GEMM and its SwiGLU in one call, where a backend can fuse
    // them (the CPU's AMX path: h13 never leaves the cache): the same bits as
    // expert_matmul_forward_bf16 (h13 = inp w13^T) followed by swiglu_forward_bf16 on rows
    // [offsets[0], offsets[E]). Every tensor is indexed by the absolute row, as
    // expert_matmul_forward_bf16's; h13 is scratch that a fused backend may leave unwritten.
    //   act16 [N, ff] bf16; h13_16 [N, 2ff] bf16 or NULL; h13 [N, 2ff]; inp [N, d] bf16;
    //   w13 [E, 2ff, d] bf16; offsets: host [E+1]
    void (*expert_swiglu_forward_bf16)(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16,
                                       real *h13, const moe_bf16 *inp, const moe_bf16 *w13,
                                       const int *offsets, int n_experts, int ff, int d);
    // dh13_16 = bf16(swiglu_backward(dact, h13_16 widened)): the gradient rounded once, for its
    // two GEMMs.                     dh13_16 [N, 2ff] bf16; dact [N, ff]; h13_16 [N, 2ff] bf16
    void (*swiglu_backward_bf16)(moe_backend *be, moe_bf16 *dh13_16, const real *dact,
                                 const moe_bf16 *h13_16, int N, int ff);
    // expert_matmul_backward_input_bf16 (dact = dout w2, not accumulated: scratch), then
    // swiglu_backward_bf16 (dh13_16), as expert_swiglu_backward; dh13_16 must not overlap dout.
    //   dh13_16 [N, 2ff] bf16; dact [N, ff]; dout [N, d] bf16; w2 [E, d, ff] bf16;
    //   h13_16 [N, 2ff] bf16; offsets: host [E+1]
    void (*expert_swiglu_backward_bf16)(moe_backend *be, moe_bf16 *dh13_16, real *dact,
                                        const moe_bf16 *dout, const moe_bf16 *w2,
                                        const moe_bf16 *h13_16, const int *offsets, int n_experts,
                                        int ff, int d);

    // ---- router losses ---------------------------------------------------
    // With s' = probs, f_e = counts[e]/(k T), P_e = mean_t s'_e, B = T / seq_len sequences:
    // out [MOE_LOSS_SLOTS], one value per moe_loss_slot: out[MOE_LOSS_AUX] = L_aux, ...
    // (per-sequence f and P for L_seq; seq_counts is read only when hp.seq_aux_coef != 0;
    // hp's coefficients only). probs, logits [T,E]; lse [T]; counts [E]; seq_counts [B,E]
    void (*router_losses)(moe_backend *be, real *out, const real *probs, const real *logits,
                          const real *lse, const int *counts, const int *seq_counts,
                          moe_router_shape shape, moe_router_hparams hp);

    // Gradient of the layer's loss w.r.t. the router logits (written to dlogits [T,E]):
    //   dweights through the combine weights (renormalisation, route_scale), + dloss * the
    //   aux and sequence aux gradients (through P only), through the scoring function, +
    //   dloss * (2 z_coef / T) lse(t) softmax(z)_e (z-loss). Every field of shape and hp.
    // dweights [T,k]; scores, probs, logits [T,E]; lse [T]; topk_idx, weights [T,k];
    // counts [E]; seq_counts [B,E]; dloss host scalar
    void (*router_backward)(moe_backend *be, real *dlogits, const real *dweights,
                            const real *scores, const real *probs, const real *logits,
                            const real *lse, const int *topk_idx, const real *weights,
                            const int *counts, const int *seq_counts, moe_router_shape shape,
                            moe_router_hparams hp, real dloss);

    // Router input jitter: u[i] ~ U(lo, hi), a counter-based function of (key, i), so any
    // backend draws the same numbers.
    void (*uniform_noise)(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi);
    // out (= or +=) a * b elementwise                                   all [n]
    void (*mul)(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate);

    // ---- dense model layers ----------------------------------------------
    // out[t,:] = embed[tokens[t],:]                      out [T,d]; embed [V,d]
    void (*embedding_forward)(moe_backend *be, real *out, const int *tokens, const real *embed,
                              int T, int d);
    // dembed[tokens[t],:] += dout[t,:]
    void (*embedding_backward)(moe_backend *be, real *dembed, const real *dout, const int *tokens,
                               int T, int d);

    // out = inp * rstd * weight, rstd[t] = 1 / sqrt(mean_i inp[t,i]^2 + eps)
    // out [T,d]; rstd [T]; inp [T,d]; weight [d]
    void (*rmsnorm_forward)(moe_backend *be, real *out, real *rstd, const real *inp,
                            const real *weight, int T, int d, real eps);
    // dinp += rstd * (w*dout - n * mean_i(w*dout*n)), n = inp*rstd; dweight += sum_t dout*n
    void (*rmsnorm_backward)(moe_backend *be, real *dinp, real *dweight, const real *dout,
                             const real *inp, const real *weight, const real *rstd, int T, int d);

    // q/k norm (DESIGN.md §2.1): RMSNorm of the n_heads segments of hd reals inside each of T
    // rows of `stride` reals, all with the one weight [hd]: for t < T, h < n_heads, x = the
    // hd reals at inp + t*stride + h*hd,
    //   out = x * r * weight, r = rstd[t*n_heads + h] = 1 / sqrt(mean_i x_i^2 + eps)
    // (per head: n_heads heads of hd; the whole projection: n_heads 1, hd its width). Only the
    // segments are written. out, inp [T, stride] (out != inp); rstd [T, n_heads]; weight [hd]
    void (*head_rmsnorm_forward)(moe_backend *be, real *out, real *rstd, const real *inp,
                                 const real *weight, int T, int stride, int n_heads, int hd,
                                 real eps);
    // Its backward over the same segments, n = x * r:
    //   dinp = r * (w*dout - n * mean_i(w*dout*n))   (written; dinp may be dout: in place)
    //   dweight += sum_{t,h} dout * n
    // dinp, dout, inp [T, stride]; weight, dweight [hd]; rstd [T, n_heads]
    void (*head_rmsnorm_backward)(moe_backend *be, real *dinp, real *dweight, const real *dout,
                                  const real *inp, const real *weight, const real *rstd, int T,
                                  int stride, int n_heads, int hd);
    // Linear biases: out[t,:] += bias; dbias += sum_t dout[t,:]     out, dout [T,n]; bias [n]
    void (*bias_add)(moe_backend *be, real *out, const real *bias, int T, int n);
    void (*bias_backward)(moe_backend *be, real *dbias, const real *dout, int T, int n);
    // The shared expert's gate (Qwen2-MoE), s_t = sigmoid(z[t]):
    //   forward   out[t,:] += s_t * y[t,:]
    //   backward  dy[t,:] = s_t * dout[t,:] (written), dz[t] = s_t (1 - s_t) <dout[t,:], y[t,:]>
    //             (written)                   out, y, dout, dy [T,d]; z, dz [T]
    void (*sigmoid_gate_forward)(moe_backend *be, real *out, const real *z, const real *y, int T,
                                 int d);
    void (*sigmoid_gate_backward)(moe_backend *be, real *dy, real *dz, const real *dout,
                                  const real *z, const real *y, int T, int d);

    // Rotary embedding, HF rotate_half convention, on the first n_rot heads of each row of
    // n_heads heads of size hd (the q and k heads of a qkv row; v is copied unchanged).
    // Token t has position pos0 + t % S. For i < hd/2, (a, b) = (x[i], x[i+hd/2]):
    //   a' = a cos - b sin, b' = b cos + a sin,  angle = pos * theta^(-2i/hd)
    // inverse=1 rotates by -angle (the backward); the sizes: the fields of ra (moe_rope_args).
    // out, inp [T, n_heads*hd] (out may be inp); cos, sin [max_pos, hd/2]
    void (*rope)(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin,
                 moe_rope_args ra);

    // Causal self-attention with GQA, flash-style: nothing of size S x S is kept.
    // Rows qkv [T = B*S, (H + 2KV)*hd] = [q | k | v]; query head h uses kv head h / (H/KV)
    // (B, S, H, KV, hd: the fields of sh, moe_attention_shape).
    //   S_ij = q_i . k_j * hd^-1/2 (j <= i),  lse_i = log sum_{j<=i} exp(S_ij),
    //   P_ij = exp(S_ij - lse_i),  o_i = sum_j P_ij v_j
    // out [T, H*hd] = o; lse [B, H, S] (saved for the backward, with out);
    // scratch [scratch_size] reals of work space, scratch_size >= attention_scratch_size(S, hd)
    // (the CPU: one [2, 64, S] slot per thread, threads beyond the slots stay idle).
    void (*attention_forward)(moe_backend *be, real *out, real *lse, const real *qkv,
                              moe_attention_shape sh, real *scratch, size_t scratch_size);
    // Recomputes P = exp(S - lse) block by block (FlashAttention-2 backward):
    //   D_i = do_i . o_i,  dP = do v^T,  dS = P * (dP - D),
    //   dq = dS k hd^-1/2,  dk = dS^T q hd^-1/2,  dv = P^T do  (kv heads sum their query heads)
    // dqkv [T, (H+2KV)*hd] (written); dout, out [T, H*hd]; qkv [T, (H+2KV)*hd]; lse [B, H, S];
    // scratch as for the forward. Deterministic: fixed summation order, no atomics.
    void (*attention_backward)(moe_backend *be, real *dqkv, const real *dout, const real *qkv,
                               const real *out, const real *lse, moe_attention_shape sh,
                               real *scratch, size_t scratch_size);
    // bf16 twins (DESIGN.md §5b), as FlashAttention-2 runs in bf16: q, k, v (and do, o) are
    // read as bf16, every product is a bf16 GEMM with fp32 accumulation, and what enters a
    // product is rounded once. Scores, the softmax statistics, D and dS are fp32:
    //   m_i = max_j S_ij,  E_ij = exp(S_ij - m_i),  l_i = sum_j E_ij (unrounded),
    //   o_i = (sum_j bf16(E_ij) v_j) / l_i,  lse_i = m_i + log l_i
    // out [T, H*hd] fp32; lse [B, H, S]; qkv16 [T, (H+2KV)*hd] bf16; scratch as above.
    void (*attention_forward_bf16)(moe_backend *be, real *out, real *lse, const moe_bf16 *qkv16,
                                   moe_attention_shape sh, real *scratch, size_t scratch_size);
    //   P = exp(S - lse),  D_i = do_i . o_i,  dP = do v^T,  dS = P * (dP - D) hd^-1/2,
    //   dv = bf16(P)^T do,  dq = bf16(dS) k,  dk = bf16(dS)^T q
    // dqkv [T, (H+2KV)*hd] fp32 (written); dout16, out16 [T, H*hd] bf16 (out16 = bf16 of the
    // forward's out); qkv16 [T, (H+2KV)*hd] bf16; lse [B, H, S]. Deterministic.
    void (*attention_backward_bf16)(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                    const moe_bf16 *qkv16, const moe_bf16 *out16, const real *lse,
                                    moe_attention_shape sh, real *scratch, size_t scratch_size);
    // Reals of scratch that the attention kernels (fp32 and bf16) need for sequences of up to
    // S tokens and heads of hd with the backend's current thread count (CPU: threads x the
    // larger of the fp32 slot [2, 64, S] and the bf16 one, which adds the bf16 roundings and
    // the emulated bf16 GEMM's operands).
    size_t (*attention_scratch_size)(moe_backend *be, int S, int hd);

    // Attention of n new tokens of one sequence, at positions pos0..pos0+n-1, over a KV cache
    // that already holds positions 0..pos0+n-1 (the new ones included): causal, GQA.
    // out [n, H*hd]; q = the q part of qkv rows [n, (H+2KV)*hd]; k_cache, v_cache
    // [>= pos0+n, KV*hd]; scratch [H, n, pos0+n]
    void (*attention_cached_forward)(moe_backend *be, real *out, real *scratch, const real *qkv,
                                     const real *k_cache, const real *v_cache, int n, int pos0,
                                     int H, int KV, int hd);
    // Copies the k and v parts of qkv rows [n, (H+2KV)*hd] into the caches at rows
    // pos0..pos0+n-1 (k_cache, v_cache [max_pos, KV*hd]).
    void (*kv_cache_append)(moe_backend *be, real *k_cache, real *v_cache, const real *qkv, int n,
                            int pos0, int H, int KV, int hd);

    // losses[t] = logsumexp(logits[t]) - logits[t, targets[t]]     logits [T,V]
    void (*cross_entropy_forward)(moe_backend *be, real *losses, const real *logits,
                                  const int *targets, int T, int V);
    // dlogits[t,:] = dloss * (softmax(logits[t]) - onehot(targets[t]))
    void (*cross_entropy_backward)(moe_backend *be, real *dlogits, const real *logits,
                                   const int *targets, int T, int V, real dloss);

    // ---- elementwise and reductions --------------------------------------
    // out = a + b (out may alias a or b)                                 all [n]
    void (*add)(moe_backend *be, real *out, const real *a, const real *b, size_t n);
    // host_out[0] = sum_i x[i]^2, resp. sum_i x[i] (accumulated in double); NaN/Inf propagate.
    // The result is written to host memory when the call returns (a device synchronises).
    void (*sum_squares)(moe_backend *be, double *host_out, const real *x, size_t n);
    void (*sum)(moe_backend *be, double *host_out, const real *x, size_t n);

    // ---- optimizer updates (optim/ decides what to call with what) --------
    // AdamW (decoupled weight decay, as torch.optim.AdamW), with g = grad_scale * grads:
    //   p -= lr*wd*p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
    //   p -= lr * (m / bc1) / (sqrt(v / bc2) + eps),  bc1 = 1 - b1^t, bc2 = 1 - b2^t
    // (the scalars: the fields of hp, moe_adamw_hparams). params, m, v (updated), grads [n].
    // params16 [n] (NULL: none) is written bf16(p) of the updated p in the same pass: the bf16
    // weights of the next forward without a second read of params (to_bf16's bits exactly).
    void (*adamw_update)(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                         const real *grads, size_t n, moe_adamw_hparams hp);
    // SGD without momentum: p -= lr * grad_scale * g; params16 as in adamw_update
    void (*sgd_update)(moe_backend *be, real *params, moe_bf16 *params16, const real *grads,
                       size_t n, real lr, real grad_scale);
};

// An entry a backend may leave NULL (a kernel it does not implement, e.g. a bf16 twin the CUDA
// backend does not have yet): MOE_OK when be->fn exists, else MOE_EINVAL "<fn> is not
// supported by backend <name>". Call it where a config selects such a kernel, before using it.
#define MOE_BACKEND_REQUIRE(be, fn) \
    ((be)->fn ? MOE_OK              \
              : moe_error(MOE_EINVAL, "%s is not supported by backend %s", #fn, (be)->name))

// The backend named `name` ("cpu", "cpu-strict"; see moe_backend_names), created with opt
// (NULL: defaults) into *out. MOE_EINVAL naming the known backends when there is none of that
// name in this build; MOE_ENOMEM. Destroy with moe_backend_destroy.
moe_status moe_backend_create(moe_backend **out, const char *name, const moe_backend_options *opt);
void moe_backend_destroy(moe_backend *be); // NULL is a no-op
// The names moe_backend_create knows in this build, comma-separated ("cpu, cpu-strict").
const char *moe_backend_names(void);

#endif
