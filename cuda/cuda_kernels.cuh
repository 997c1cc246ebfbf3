// The CUDA kernels: each has the signature, the name (cuda_ for cpu_) and the contract of its
// table entry in layers/backend.h and of its CPU twin in layers/cpu/cpu_kernels.h, and is in
// the file of its twin's stem: the twin of a kernel of layers/cpu/X.c is in cuda/X.cu.
#ifndef MOE_CUDA_KERNELS_CUH
#define MOE_CUDA_KERNELS_CUH

#include "cuda/cuda_common.cuh"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// gemm.cu
void cuda_matmul(moe_backend *be, real *c, const real *a, const real *b, int m, int n, int kd,
                 int trans_a, int trans_b, real beta);
void cuda_expert_matmul_forward(moe_backend *be, real *out, const real *inp, const real *weight,
                                const int *offsets, int n_experts, int n_out, int n_in);
void cuda_expert_matmul_backward_input(moe_backend *be, real *dinp, const real *dout,
                                       const real *weight, const int *offsets, int n_experts,
                                       int n_out, int n_in, int accumulate);
void cuda_expert_matmul_backward_weight(moe_backend *be, real *dweight, const real *dout,
                                        const real *inp, const int *offsets, int n_experts,
                                        int n_out, int n_in);

// gemm_bf16.cu: the bf16 twins (bf16 operands, fp32 output and accumulation), the conversions
void cuda_matmul_bf16(moe_backend *be, real *c, const moe_bf16 *a, const moe_bf16 *b, int m, int n,
                      int kd, int trans_a, int trans_b, real beta);
void cuda_expert_matmul_forward_bf16(moe_backend *be, real *out, const moe_bf16 *inp,
                                     const moe_bf16 *weight, const int *offsets, int n_experts,
                                     int n_out, int n_in);
void cuda_expert_matmul_backward_input_bf16(moe_backend *be, real *dinp, const moe_bf16 *dout,
                                            const moe_bf16 *weight, const int *offsets,
                                            int n_experts, int n_out, int n_in, int accumulate);
void cuda_expert_matmul_backward_weight_bf16(moe_backend *be, real *dweight, const moe_bf16 *dout,
                                             const moe_bf16 *inp, const int *offsets, int n_experts,
                                             int n_out, int n_in);
void cuda_to_bf16(moe_backend *be, moe_bf16 *out, const real *in, size_t n);
void cuda_from_bf16(moe_backend *be, real *out, const moe_bf16 *in, size_t n);

// exchange_nccl.cu (MOE_NCCL): the backend's device_comm entry (no CPU twin: the CPU's rows
// travel by layers/exchange_mpi.c)
moe_status cuda_device_comm(moe_backend *be, struct moe_comm *host, struct moe_comm **out);

// router.cu
void cuda_router_topk(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                      real *weights, const real *logits, const real *bias, moe_router_shape sh,
                      moe_router_hparams hp);
void cuda_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                          const real *probs, const real *logits, const real *lse,
                          const int *topk_idx, const real *weights, const int *counts,
                          const int *seq_counts, moe_router_shape sh, moe_router_hparams hp,
                          real dloss);
void cuda_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi);

// dispatch.cu
void cuda_moe_dispatch_counts(moe_backend *be, int *counts, const int *topk_idx, int T, int k,
                              int E);
void cuda_moe_seq_counts(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k, int E,
                         int seq_len);
void cuda_moe_capacity_keep(moe_backend *be, int *keep, int *scratch, const int *topk_idx,
                            const real *weights, const int *counts, int T, int k, int E,
                            int capacity, moe_drop_policy policy);
void cuda_moe_permute_index(moe_backend *be, int *offsets, int *assign_row, int *row_token,
                            const int *topk_idx, const int *keep, int T, int k, int E);
void cuda_moe_permute(moe_backend *be, real *xp, const real *x, const int *row_token, int N, int d);
void cuda_moe_permute_bf16(moe_backend *be, moe_bf16 *xe16, const real *x, const int *row_token,
                           int N, int d);
void cuda_moe_copy_chunks(moe_backend *be, real *dst, const real *src, const moe_row_chunk *chunks,
                          int n_chunks, int d);
void cuda_moe_combine_forward(moe_backend *be, real *out, const real *y, const real *weights,
                              const int *assign_row, int T, int k, int d);
void cuda_moe_combine_backward(moe_backend *be, real *dy, real *dweights, const real *dout,
                               const real *y, const real *weights, const int *assign_row, int T,
                               int k, int d);
void cuda_moe_combine_backward_bf16(moe_backend *be, moe_bf16 *dy16, real *dweights,
                                    const real *dout, const real *y, const real *weights,
                                    const int *assign_row, int T, int k, int d);
void cuda_moe_unpermute_add(moe_backend *be, real *dx, const real *dxp, const int *assign_row,
                            int T, int k, int d);

// expert.cu: SwiGLU
void cuda_swiglu_forward(moe_backend *be, real *act, const real *h13, int N, int ff);
void cuda_expert_swiglu_forward(moe_backend *be, real *act, real *h13, const real *inp,
                                const real *w13, const int *offsets, int n_experts, int ff, int d);
void cuda_expert_swiglu_backward(moe_backend *be, real *dh13, real *dact, const real *dout,
                                 const real *w2, const real *h13, const int *offsets, int n_experts,
                                 int ff, int d);
void cuda_expert_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, real *dact,
                                      const moe_bf16 *dout, const moe_bf16 *w2,
                                      const moe_bf16 *h13_16, const int *offsets, int n_experts,
                                      int ff, int d);
void cuda_expert_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, real *h13,
                                     const moe_bf16 *inp, const moe_bf16 *w13, const int *offsets,
                                     int n_experts, int ff, int d);
void cuda_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, const real *h13,
                              int N, int ff);
void cuda_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, const real *dact,
                               const moe_bf16 *h13_16, int N, int ff);
void cuda_swiglu_backward(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                          int ff);

// losses.cu: the router losses, mul
void cuda_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                        const real *lse, const int *counts, const int *seq_counts,
                        moe_router_shape sh, moe_router_hparams hp);
void cuda_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate);

// embedding.cu
void cuda_embedding_forward(moe_backend *be, real *out, const int *tokens, const real *embed, int T,
                            int d);
void cuda_embedding_backward(moe_backend *be, real *dembed, const real *dout, const int *tokens,
                             int T, int d);
// rmsnorm.cu
void cuda_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                          const real *weight, int T, int d, real eps);
void cuda_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                           const real *inp, const real *weight, const real *rstd, int T, int d);
void cuda_head_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                               const real *weight, int T, int stride, int n_heads, int hd,
                               real eps);
void cuda_head_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                                const real *inp, const real *weight, const real *rstd, int T,
                                int stride, int n_heads, int hd);
// rope.cu
void cuda_rope(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin,
               moe_rope_args ra);
// attention.cu
void cuda_attention_cached_forward(moe_backend *be, real *out, real *scratch, const real *qkv,
                                   const real *k_cache, const real *v_cache, int n, int pos0, int H,
                                   int KV, int hd);
void cuda_kv_cache_append(moe_backend *be, real *k_cache, real *v_cache, const real *qkv, int n,
                          int pos0, int H, int KV, int hd);
void cuda_attention_forward(moe_backend *be, real *out, real *lse, const real *qkv,
                            moe_attention_shape sh, real *scratch, size_t scratch_size);
void cuda_attention_backward(moe_backend *be, real *dqkv, const real *dout, const real *qkv,
                             const real *out, const real *lse, moe_attention_shape sh,
                             real *scratch, size_t scratch_size);
void cuda_attention_forward_bf16(moe_backend *be, real *out, real *lse, const moe_bf16 *qkv16,
                                 moe_attention_shape sh, real *scratch, size_t scratch_size);
void cuda_attention_backward_bf16(moe_backend *be, real *dqkv, const moe_bf16 *dout16,
                                  const moe_bf16 *qkv16, const moe_bf16 *out16, const real *lse,
                                  moe_attention_shape sh, real *scratch, size_t scratch_size);
size_t cuda_attention_scratch_size(moe_backend *be, int S, int hd);
// model.attention = "cudnn": routes the bf16 attention entries through cuDNN's fused attention
// (attention.cu, cuda/attention_cudnn.h); an error naming what is missing in a build without
// cuDNN (MOE_CUDNN) or where cuDNN cannot start
moe_status cuda_cudnn_enable(moe_backend *be);
void cuda_cudnn_destroy(struct cudnn_attention *a);
const char *cuda_cudnn_describe(struct cudnn_attention *a);
// cross_entropy.cu
void cuda_cross_entropy_forward(moe_backend *be, real *losses, const real *logits,
                                const int *targets, int T, int V);
void cuda_cross_entropy_backward(moe_backend *be, real *dlogits, const real *logits,
                                 const int *targets, int T, int V, real dloss);

// elementwise.cu
void cuda_add(moe_backend *be, real *out, const real *a, const real *b, size_t n);
void cuda_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n);
void cuda_sum(moe_backend *be, double *host_out, const real *x, size_t n);
void cuda_bias_add(moe_backend *be, real *out, const real *bias, int T, int n);
void cuda_bias_backward(moe_backend *be, real *dbias, const real *dout, int T, int n);
void cuda_sigmoid_gate_forward(moe_backend *be, real *out, const real *z, const real *y, int T,
                               int d);
void cuda_sigmoid_gate_backward(moe_backend *be, real *dy, real *dz, const real *dout,
                                const real *z, const real *y, int T, int d);
// Not a table entry (rmsnorm.cu's and the bias gradient's second stage): grad[i] +=
// the chunk partials part [chunks, n] of column i summed in chunk order (layers/dense_rows.h).
void cuda_grad_chunks_add(moe_backend *be, real *grad, const double *part, int chunks, int n);
// optim_update.cu
void cuda_adamw_update(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                       const real *grads, size_t n, moe_adamw_hparams hp);
void cuda_sgd_update(moe_backend *be, real *params, moe_bf16 *params16, const real *grads, size_t n,
                     real lr, real grad_scale);

#pragma GCC visibility pop

#endif
