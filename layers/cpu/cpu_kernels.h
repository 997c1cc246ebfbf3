// The CPU kernels: the reference implementation of layers/backend.h.
// Each function here has the contract written next to its pointer in backend.h, and its CUDA
// twin (cuda_ for cpu_, cuda/cuda_kernels.cuh) is in the .cu file of the same stem: the twin
// of a kernel of layers/cpu/X.c is in cuda/X.cu.
#ifndef MOE_CPU_KERNELS_H
#define MOE_CPU_KERNELS_H

#include "layers/backend.h"
#include "layers/cpu/cpu_backend.h"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// Every CPU kernel begins with CPU_KERNEL(be). In strict mode ("cpu-strict") it opens the
// backend's memory to the host for the duration of the call; the cleanup attribute closes it
// again on every return path. On the plain CPU backend it is one test of a flag.
// It also opens the kernel's MOE_PROFILE scope (layers/cpu/profile.c: a time table at exit).
#define CPU_KERNEL(be)                                                                       \
    moe_backend *cpu_kernel_scope_ __attribute__((cleanup(cpu_strict_close), unused)) =      \
        (cpu_strict_open(be), (be));                                                         \
    static int cpu_profile_slot_ = -1;                                                       \
    cpu_profile_scope cpu_profile_scope_ __attribute__((cleanup(cpu_profile_end), unused)) = \
        cpu_profile_begin(__func__, &cpu_profile_slot_)

// MOE_PROFILE's scope of one kernel call (slot NULL: not counted; depth_taken 0: not even nested).
typedef struct {
    int *slot;
    double t0;
    int depth_taken; // 1: this call took a level of the nesting depth
} cpu_profile_scope;
cpu_profile_scope cpu_profile_begin(const char *name, int *slot);
void cpu_profile_end(cpu_profile_scope *s);

// Threads are forked only for loops that touch enough elements to pay for it. A parallel region
// costs microseconds on an idle machine and can cost a scheduler time slice (milliseconds) when
// the cores are shared or the container's CPU quota is below the core count; an element of a
// loop costs about a nanosecond. Small shapes (decode steps, tests, tiny models) stay serial.
#define CPU_PARALLEL_MIN_WORK ((size_t)1 << 15)
static inline int cpu_parallel_worth(size_t elements) { return elements >= CPU_PARALLEL_MIN_WORK; }

// gemm.c: the grouped GEMMs' loop, written once for fp32 and bf16. For each expert e with its
// rows [offsets[e], offsets[e+1]) (offsets a host array of n_experts+1), in largest-first
// order and spread over the threads when there are at least four experts per thread, one call
// of gemm_e (on the thread that runs it) with the operands at their element offsets (elem
// bytes per element of x and y):
//   CPU_EXPERT_FORWARD          c = out [N, n_out], x = inp [N, n_in], y = weight [E, n_out, n_in]
//   CPU_EXPERT_BACKWARD_INPUT   c = dinp [N, n_in] (accumulate: +=), x = dout [N, n_out],
//                               y = weight [E, n_out, n_in]
//   CPU_EXPERT_BACKWARD_WEIGHT  c = dweight [E, n_out, n_in] +=, x = dout [N, n_out],
//                               y = inp [N, n_in] (experts without rows skipped)
// gemm_e computes c [m, n] = op(a) op(b) + beta c (a, b of the caller's element type, row
// strides lda, ldb, ldc); ctx is passed through.
typedef enum {
    CPU_EXPERT_FORWARD,
    CPU_EXPERT_BACKWARD_INPUT,
    CPU_EXPERT_BACKWARD_WEIGHT,
} cpu_expert_pass;
typedef void (*cpu_expert_gemm_fn)(void *ctx, int trans_a, int trans_b, int m, int n, int kd,
                                   const void *a, int lda, const void *b, int ldb, real beta,
                                   real *c, int ldc);
void cpu_expert_gemms(cpu_expert_pass pass, real *c, const void *x, const void *y, size_t elem,
                      const int *offsets, int n_experts, int n_out, int n_in, int accumulate,
                      cpu_expert_gemm_fn gemm_e, void *ctx);

// gemm.c: gemm_e for cpu_expert_gemms that runs `gemm` (with gemm_ctx), then rows(rows_ctx, r,
// m) on the m output rows it wrote, r = the first one's index in c0 (rows of c_row reals): a
// row kernel right after each expert's GEMM, on the same thread, its rows still in cache.
typedef struct {
    cpu_expert_gemm_fn gemm;
    void *gemm_ctx;
    const real *c0;
    size_t c_row;
    void (*rows)(const void *rows_ctx, size_t r, int m);
    const void *rows_ctx;
} cpu_gemm_then_rows;
void cpu_expert_gemm_then_rows(void *ctx, int trans_a, int trans_b, int m, int n, int kd,
                               const void *a, int lda, const void *b, int ldb, real beta, real *c,
                               int ldc);

// gemm.c: c [m, n] = alpha op(a) op(b) + beta c (row strides lda, ldb, ldc of the operands as
// stored), every output one sum in l order, so that a row's bits never depend on m: a and b
// are real, or moe_bf16 (widened exactly) when bf16. The fp32 GEMMs of a row-invariant backend
// and the bf16 reference path (cpu_gemm_bf16).
void cpu_gemm_ordered(int bf16, int trans_a, int trans_b, int m, int n, int kd, real alpha,
                      const void *a, int lda, const void *b, int ldb, real beta, real *c, int ldc);

// gemm.c: the table's fp32 GEMMs
void cpu_matmul(moe_backend *be, real *c, const real *a, const real *b, int m, int n, int kd,
                int trans_a, int trans_b, real beta);
void cpu_expert_matmul_forward(moe_backend *be, real *out, const real *inp, const real *weight,
                               const int *offsets, int n_experts, int n_out, int n_in);
void cpu_expert_matmul_backward_input(moe_backend *be, real *dinp, const real *dout,
                                      const real *weight, const int *offsets, int n_experts,
                                      int n_out, int n_in, int accumulate);
void cpu_expert_matmul_backward_weight(moe_backend *be, real *dweight, const real *dout,
                                       const real *inp, const int *offsets, int n_experts,
                                       int n_out, int n_in);
void cpu_expert_swiglu_forward(moe_backend *be, real *act, real *h13, const real *inp,
                               const real *w13, const int *offsets, int n_experts, int ff, int d);
void cpu_expert_swiglu_backward(moe_backend *be, real *dh13, real *dact, const real *dout,
                                const real *w2, const real *h13, const int *offsets, int n_experts,
                                int ff, int d);

// gemm_bf16.c
void cpu_matmul_bf16(moe_backend *be, real *c, const moe_bf16 *a, const moe_bf16 *b, int m, int n,
                     int kd, int trans_a, int trans_b, real beta);
void cpu_expert_matmul_forward_bf16(moe_backend *be, real *out, const moe_bf16 *inp,
                                    const moe_bf16 *weight, const int *offsets, int n_experts,
                                    int n_out, int n_in);
void cpu_expert_matmul_backward_input_bf16(moe_backend *be, real *dinp, const moe_bf16 *dout,
                                           const moe_bf16 *weight, const int *offsets,
                                           int n_experts, int n_out, int n_in, int accumulate);
void cpu_expert_matmul_backward_weight_bf16(moe_backend *be, real *dweight, const moe_bf16 *dout,
                                            const moe_bf16 *inp, const int *offsets, int n_experts,
                                            int n_out, int n_in);
void cpu_to_bf16(moe_backend *be, moe_bf16 *out, const real *in, size_t n);
void cpu_from_bf16(moe_backend *be, real *out, const moe_bf16 *in, size_t n);

// router.c
void cpu_router_topk(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                     real *weights, const real *logits, const real *bias, moe_router_shape sh,
                     moe_router_hparams hp);
void cpu_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                         const real *probs, const real *logits, const real *lse,
                         const int *topk_idx, const real *weights, const int *counts,
                         const int *seq_counts, moe_router_shape sh, moe_router_hparams hp,
                         real dloss);
void cpu_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi);

// dispatch.c
void cpu_moe_dispatch_counts(moe_backend *be, int *counts, const int *topk_idx, int T, int k,
                             int E);
void cpu_moe_seq_counts(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k, int E,
                        int seq_len);
void cpu_moe_capacity_keep(moe_backend *be, int *keep, int *scratch, const int *topk_idx,
                           const real *weights, const int *counts, int T, int k, int E,
                           int capacity, moe_drop_policy policy);
void cpu_moe_permute_index(moe_backend *be, int *offsets, int *assign_row, int *row_token,
                           const int *topk_idx, const int *keep, int T, int k, int E);
void cpu_moe_permute(moe_backend *be, real *xp, const real *x, const int *row_token, int N, int d);
void cpu_moe_permute_bf16(moe_backend *be, moe_bf16 *xe16, const real *x, const int *row_token,
                          int N, int d);
void cpu_moe_copy_chunks(moe_backend *be, real *dst, const real *src, const moe_row_chunk *chunks,
                         int n_chunks, int d);
void cpu_moe_combine_forward(moe_backend *be, real *out, const real *y, const real *weights,
                             const int *assign_row, int T, int k, int d);
void cpu_moe_combine_backward(moe_backend *be, real *dy, real *dweights, const real *dout,
                              const real *y, const real *weights, const int *assign_row, int T,
                              int k, int d);
void cpu_moe_combine_backward_bf16(moe_backend *be, moe_bf16 *dy16, real *dweights,
                                   const real *dout, const real *y, const real *weights,
                                   const int *assign_row, int T, int k, int d);
void cpu_moe_unpermute_add(moe_backend *be, real *dx, const real *dxp, const int *assign_row, int T,
                           int k, int d);

// expert.c
void cpu_swiglu_forward(moe_backend *be, real *act, const real *h13, int N, int ff);
// expert.c: the SwiGLU kernels' work over N rows, callable from inside a kernel (spread over the
// threads unless already in a parallel region): swiglu_forward, swiglu_backward and their bf16
// twins
void cpu_swiglu_rows(real *act, const real *h13, int N, int ff);
void cpu_swiglu_grad_rows(real *dh13, const real *dact, const real *h13, int N, int ff);
void cpu_swiglu_rows_bf16(moe_bf16 *act16, moe_bf16 *h13_16, const real *h13, int N, int ff);
void cpu_swiglu_grad_rows_bf16(moe_bf16 *dh13_16, const real *dact, const moe_bf16 *h13_16, int N,
                               int ff);
// gemm_bf16.c: the grouped first expert GEMM with its SwiGLU (backend.h)
void cpu_expert_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, real *h13,
                                    const moe_bf16 *inp, const moe_bf16 *w13, const int *offsets,
                                    int n_experts, int ff, int d);
void cpu_expert_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, real *dact,
                                     const moe_bf16 *dout, const moe_bf16 *w2,
                                     const moe_bf16 *h13_16, const int *offsets, int n_experts,
                                     int ff, int d);
void cpu_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, const real *h13,
                             int N, int ff);
void cpu_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, const real *dact,
                              const moe_bf16 *h13_16, int N, int ff);
void cpu_swiglu_backward(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                         int ff);

// losses.c
void cpu_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                       const real *lse, const int *counts, const int *seq_counts,
                       moe_router_shape sh, moe_router_hparams hp);
void cpu_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate);

// embedding.c
void cpu_embedding_forward(moe_backend *be, real *out, const int *tokens, const real *embed, int T,
                           int d);
void cpu_embedding_backward(moe_backend *be, real *dembed, const real *dout, const int *tokens,
                            int T, int d);
// rmsnorm.c
void cpu_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                         const real *weight, int T, int d, real eps);
void cpu_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                          const real *inp, const real *weight, const real *rstd, int T, int d);
void cpu_head_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                              const real *weight, int T, int stride, int n_heads, int hd, real eps);
void cpu_head_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                               const real *inp, const real *weight, const real *rstd, int T,
                               int stride, int n_heads, int hd);
// rope.c
void cpu_rope(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin,
              moe_rope_args ra);
// attention.c
void cpu_attention_cached_forward(moe_backend *be, real *out, real *scratch, const real *qkv,
                                  const real *k_cache, const real *v_cache, int n, int pos0, int H,
                                  int KV, int hd);
void cpu_kv_cache_append(moe_backend *be, real *k_cache, real *v_cache, const real *qkv, int n,
                         int pos0, int H, int KV, int hd);
void cpu_attention_forward(moe_backend *be, real *out, real *lse, const real *qkv,
                           moe_attention_shape sh, real *scratch, size_t scratch_size);
void cpu_attention_backward(moe_backend *be, real *dqkv, const real *dout, const real *qkv,
                            const real *out, const real *lse, moe_attention_shape sh, real *scratch,
                            size_t scratch_size);
void cpu_attention_forward_bf16(moe_backend *be, real *out, real *lse, const moe_bf16 *qkv16,
                                moe_attention_shape sh, real *scratch, size_t scratch_size);
void cpu_attention_backward_bf16(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                 const moe_bf16 *qkv16, const moe_bf16 *out16, const real *lse,
                                 moe_attention_shape sh, real *scratch, size_t scratch_size);
size_t cpu_attention_scratch_size(moe_backend *be, int S, int hd);
// attention_gemm.c: the fp32 kernels' block products, on one thread.
// cpu_attention_gemm: c [m, n] = alpha sum_l a(i, l) b[l, :] + beta c (beta 0 or 1), with
// a(i, l) = a[i ars + l als] (one of ars, als is 1: a [m, kd] or a^T), b [kd, n] (row stride
// ldb). The causal triangle of a query block whose row 0 is query diag, modes:
//   CPU_ATTN_CAUSAL_COLS  only c's entries (i, j) with j < 16 ceil((diag + i + 1) / 16) are
//                         sure to be written (attention.c's row widths);
//   CPU_ATTN_CAUSAL_L_HI  a(i, l) is 0 for l > diag + i (p v, ds k: the sum stops there);
//   CPU_ATTN_CAUSAL_L_LO  a(i, l) is 0 for i > diag + l (p^T do, ds^T q: it starts there).
// cpu_attention_transpose: bt [kd, j] = b [j, kd]^T for the columns j0 <= j < j1 (row strides
// ldbt, ldb): k^T and v^T for q k^T and do v^T (as b of cpu_attention_gemm).
typedef enum {
    CPU_ATTN_CAUSAL_NONE,
    CPU_ATTN_CAUSAL_COLS,
    CPU_ATTN_CAUSAL_L_HI,
    CPU_ATTN_CAUSAL_L_LO,
} cpu_attn_causal;
void cpu_attention_gemm(cpu_attn_causal causal, int diag, int m, int n, int kd, real alpha,
                        const real *a, size_t ars, size_t als, const real *b, int ldb, real beta,
                        real *c, int ldc);
void cpu_attention_transpose(real *bt, int ldbt, const real *b, int ldb, int j0, int j1, int kd);
// cross_entropy.c
void cpu_cross_entropy_forward(moe_backend *be, real *losses, const real *logits,
                               const int *targets, int T, int V);
void cpu_cross_entropy_backward(moe_backend *be, real *dlogits, const real *logits,
                                const int *targets, int T, int V, real dloss);

// elementwise.c
void cpu_add(moe_backend *be, real *out, const real *a, const real *b, size_t n);
void cpu_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n);
void cpu_sum(moe_backend *be, double *host_out, const real *x, size_t n);
void cpu_bias_add(moe_backend *be, real *out, const real *bias, int T, int n);
void cpu_bias_backward(moe_backend *be, real *dbias, const real *dout, int T, int n);
void cpu_sigmoid_gate_forward(moe_backend *be, real *out, const real *z, const real *y, int T,
                              int d);
void cpu_sigmoid_gate_backward(moe_backend *be, real *dy, real *dz, const real *dout, const real *z,
                               const real *y, int T, int d);
// optim_update.c
void cpu_adamw_update(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                      const real *grads, size_t n, moe_adamw_hparams hp);
void cpu_sgd_update(moe_backend *be, real *params, moe_bf16 *params16, const real *grads, size_t n,
                    real lr, real grad_scale);

#pragma GCC visibility pop

#endif
