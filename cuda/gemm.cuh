// Internal to cuda/: gemm.cu's GEMMs of any operand type, which gemm.cu's fp32 kernels and
// gemm_bf16.cu's bf16 twins call. Operands a, b (x, y) of type ab (CUDA_R_32F or CUDA_R_16BF),
// `size` bytes per element; the output c is fp32. Shapes and accumulation are those of the
// table entries (layers/backend.h): matmul, expert_matmul_forward, _backward_input,
// _backward_weight; offsets is the host array of n_experts + 1 row offsets.
#ifndef MOE_CUDA_GEMM_CUH
#define MOE_CUDA_GEMM_CUH

#include "cuda/cuda_common.cuh"

// Not installed: what this header declares stays inside libmoe (hidden in libmoe.so).
#pragma GCC visibility push(hidden)

// c [m,n] = op(a) @ op(b) + beta * c        a [m,kd] (or [kd,m]); b [kd,n] (or [n,kd])
void cuda_matmul_typed(moe_backend *be, real *c, const void *a, const void *b, int m, int n, int kd,
                       int trans_a, int trans_b, real beta, cudaDataType_t ab);
// out [N, n_out] = inp [N, n_in] @ weight[e]^T per expert      weight [E, n_out, n_in]
void cuda_expert_forward_typed(moe_backend *be, real *out, const void *inp, const void *weight,
                               const int *offsets, int n_experts, int n_out, int n_in,
                               cudaDataType_t ab, size_t size);
// dinp [N, n_in] (= or +=) dout [N, n_out] @ weight[e]
void cuda_expert_backward_input_typed(moe_backend *be, real *dinp, const void *dout,
                                      const void *weight, const int *offsets, int n_experts,
                                      int n_out, int n_in, int accumulate, cudaDataType_t ab,
                                      size_t size);
// dweight[e] [n_out, n_in] += dout[rows_e]^T @ inp[rows_e]      dout [N, n_out]; inp [N, n_in]
void cuda_expert_backward_weight_typed(moe_backend *be, real *dweight, const void *dout,
                                       const void *inp, const int *offsets, int n_experts,
                                       int n_out, int n_in, cudaDataType_t ab, size_t size);

#pragma GCC visibility pop

#endif
