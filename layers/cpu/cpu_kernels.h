// The CPU kernels: the reference implementation of layers/backend.h.
// Each function here has the contract written next to its pointer in backend.h.
#ifndef MOE_CPU_KERNELS_H
#define MOE_CPU_KERNELS_H

#include "layers/backend.h"
#include "layers/cpu/cpu_backend.h"

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

// MOE_PROFILE's scope of one kernel call (slot NULL: not counted).
typedef struct {
    int *slot;
    double t0;
} cpu_profile_scope;
cpu_profile_scope cpu_profile_begin(const char *name, int *slot);
void cpu_profile_end(cpu_profile_scope *s);

// Threads are forked only for loops that touch enough elements to pay for it. A parallel region
// costs microseconds on an idle machine and can cost a scheduler time slice (milliseconds) when
// the cores are shared or the container's CPU quota is below the core count; an element of a
// loop costs about a nanosecond. Small shapes (decode steps, tests, tiny models) stay serial.
#define CPU_PARALLEL_MIN_WORK ((size_t)1 << 15)
static inline int cpu_parallel_worth(size_t elements) { return elements >= CPU_PARALLEL_MIN_WORK; }

// gemm.c
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
                     real *weights, const real *logits, const real *bias, int T, int E, int k,
                     moe_scoring scoring, int norm_topk_prob, real route_scale);
void cpu_moe_seq_counts(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k, int E,
                        int seq_len);
void cpu_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                         const real *probs, const real *logits, const real *lse,
                         const int *topk_idx, const real *weights, const int *counts,
                         const int *seq_counts, int T, int E, int k, int seq_len,
                         moe_scoring scoring, int norm_topk_prob, real route_scale, real aux_coef,
                         real seq_aux_coef, real z_coef, real dloss);
void cpu_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi);

// dispatch.c
void cpu_moe_dispatch_counts(moe_backend *be, int *counts, const int *topk_idx, int T, int k,
                             int E);
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
void cpu_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, const real *h13,
                             int N, int ff);
void cpu_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, const real *dact,
                              const moe_bf16 *h13_16, int N, int ff);
void cpu_swiglu_backward(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                         int ff);

// losses.c
void cpu_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                       const real *lse, const int *counts, const int *seq_counts, int T, int E,
                       int k, int seq_len, real aux_coef, real seq_aux_coef, real z_coef);
void cpu_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate);

// embedding.c, rmsnorm.c, rope.c, attention.c, cross_entropy.c
void cpu_embedding_forward(moe_backend *be, real *out, const int *tokens, const real *embed, int T,
                           int d);
void cpu_embedding_backward(moe_backend *be, real *dembed, const real *dout, const int *tokens,
                            int T, int d);
void cpu_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                         const real *weight, int T, int d, real eps);
void cpu_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                          const real *inp, const real *weight, const real *rstd, int T, int d);
void cpu_rope(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin, int T,
              int S, int pos0, int n_rot, int n_heads, int hd, int inverse);
void cpu_attention_cached_forward(moe_backend *be, real *out, real *scratch, const real *qkv,
                                  const real *k_cache, const real *v_cache, int n, int pos0, int H,
                                  int KV, int hd);
void cpu_kv_cache_append(moe_backend *be, real *k_cache, real *v_cache, const real *qkv, int n,
                         int pos0, int H, int KV, int hd);
void cpu_attention_forward(moe_backend *be, real *out, real *lse, const real *qkv, int B, int S,
                           int H, int KV, int hd, real *scratch, size_t scratch_size);
void cpu_attention_backward(moe_backend *be, real *dqkv, const real *dout, const real *qkv,
                            const real *out, const real *lse, int B, int S, int H, int KV, int hd,
                            real *scratch, size_t scratch_size);
void cpu_attention_forward_bf16(moe_backend *be, real *out, real *lse, const moe_bf16 *qkv16, int B,
                                int S, int H, int KV, int hd, real *scratch, size_t scratch_size);
void cpu_attention_backward_bf16(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                 const moe_bf16 *qkv16, const moe_bf16 *out16, const real *lse,
                                 int B, int S, int H, int KV, int hd, real *scratch,
                                 size_t scratch_size);
size_t cpu_attention_scratch_size(moe_backend *be, int S, int hd);
void cpu_cross_entropy_forward(moe_backend *be, real *losses, const real *logits,
                               const int *targets, int T, int V);
void cpu_cross_entropy_backward(moe_backend *be, real *dlogits, const real *logits,
                                const int *targets, int T, int V, real dloss);

// elementwise.c, optim_update.c
void cpu_add(moe_backend *be, real *out, const real *a, const real *b, size_t n);
void cpu_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n);
void cpu_sum(moe_backend *be, double *host_out, const real *x, size_t n);
void cpu_adamw_update(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                      const real *grads, size_t n, real lr, real beta1, real beta2, real eps,
                      real weight_decay, real bc1, real bc2, real grad_scale);
void cpu_sgd_update(moe_backend *be, real *params, moe_bf16 *params16, const real *grads, size_t n,
                    real lr, real grad_scale);

// The order in which the grouped GEMMs (gemm.c, gemm_bf16.c) hand their experts to the threads:
// most rows first (longest-processing-time first), so that the dynamic schedule ends
// balanced when routing is skewed (real text at initialisation: max/mean 3; measured on the
// bf16 shakespeare step: experts 37.3 -> 35.7 ms). Each expert's GEMM writes its own rows,
// so the order changes no result. Beyond EXPERT_ORDER_MAX experts: the natural order.
#define EXPERT_ORDER_MAX 1024
static inline void largest_first(int *order, const int *offsets, int n_experts) {
    for (int t = 0; t < n_experts; t++) {
        const int rows = offsets[t + 1] - offsets[t]; // insertion sort, stable
        int u = t;
        for (; u > 0 && offsets[order[u - 1] + 1] - offsets[order[u - 1]] < rows; u--)
            order[u] = order[u - 1];
        order[u] = t;
    }
}
#define EXPERT_ORDER                                   \
    int order[EXPERT_ORDER_MAX];                       \
    const int ordered = n_experts <= EXPERT_ORDER_MAX; \
    if (ordered) largest_first(order, offsets, n_experts)
#define EXPERT_AT(t) (ordered ? order[t] : (t))

#endif
