// The bf16 GEMMs (DESIGN.md §5b), twins of layers/cpu/gemm_bf16.c: bf16 operands
// (CUDA_R_16BF), fp32 output and accumulation (CUBLAS_COMPUTE_32F: bf16 tensor cores with fp32
// sums), on gemm.cu's GEMMs (cuda/gemm.cuh); the expert GEMMs always run as the loop, since
// cublasGemmGroupedBatchedEx has no bf16-in/fp32-out mode. And the fp32 <-> bf16 conversions:
// layers/bf16.h's bodies (round to nearest even on the bits, quiet NaN with its sign), so the
// CPU's and the GPU's bf16 values are the same bits.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/gemm.cuh"
#include "layers/bf16.h"

// ---- conversions ------------------------------------------------------------------------
static __global__ void k_to_bf16(moe_bf16 *out, const real *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = moe_f32_to_bf16((float)in[i]);
}
static __global__ void k_from_bf16(real *out, const moe_bf16 *in, size_t n) {
    GRID_STRIDE(i, n) out[i] = (real)moe_bf16_to_f32(in[i]);
}
void cuda_to_bf16(moe_backend *be, moe_bf16 *out, const real *in, size_t n) {
    if (!n) return;
    k_to_bf16<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, in, n);
    CUDA_LAUNCHED(be, "k_to_bf16");
}
void cuda_from_bf16(moe_backend *be, real *out, const moe_bf16 *in, size_t n) {
    if (!n) return;
    k_from_bf16<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, in, n);
    CUDA_LAUNCHED(be, "k_from_bf16");
}

// ---- GEMMs --------------------------------------------------------------------------------
void cuda_matmul_bf16(moe_backend *be, real *c, const moe_bf16 *a, const moe_bf16 *b, int m, int n,
                      int kd, int trans_a, int trans_b, real beta) {
    cuda_matmul_typed(be, c, a, b, m, n, kd, trans_a, trans_b, beta, CUDA_R_16BF);
}

void cuda_expert_matmul_forward_bf16(moe_backend *be, real *out, const moe_bf16 *inp,
                                     const moe_bf16 *weight, const int *offsets, int n_experts,
                                     int n_out, int n_in) {
    cuda_expert_forward_typed(be, out, inp, weight, offsets, n_experts, n_out, n_in, CUDA_R_16BF,
                              sizeof(moe_bf16));
}
// The composition the contract names (cuBLAS then the SwiGLU kernel): no fused form on CUDA yet.
void cuda_expert_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, real *h13,
                                     const moe_bf16 *inp, const moe_bf16 *w13, const int *offsets,
                                     int n_experts, int ff, int d) {
    cuda_expert_matmul_forward_bf16(be, h13, inp, w13, offsets, n_experts, 2 * ff, d);
    const size_t r0 = (size_t)offsets[0];
    cuda_swiglu_forward_bf16(be, act16 + r0 * ff, h13_16 ? h13_16 + r0 * 2 * ff : NULL,
                             h13 + r0 * 2 * ff, offsets[n_experts] - offsets[0], ff);
}
void cuda_expert_matmul_backward_input_bf16(moe_backend *be, real *dinp, const moe_bf16 *dout,
                                            const moe_bf16 *weight, const int *offsets,
                                            int n_experts, int n_out, int n_in, int accumulate) {
    cuda_expert_backward_input_typed(be, dinp, dout, weight, offsets, n_experts, n_out, n_in,
                                     accumulate, CUDA_R_16BF, sizeof(moe_bf16));
}
void cuda_expert_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, real *dact,
                                      const moe_bf16 *dout, const moe_bf16 *w2,
                                      const moe_bf16 *h13_16, const int *offsets, int n_experts,
                                      int ff, int d) {
    cuda_expert_matmul_backward_input_bf16(be, dact, dout, w2, offsets, n_experts, d, ff, 0);
    const size_t r0 = (size_t)offsets[0];
    cuda_swiglu_backward_bf16(be, dh13_16 + r0 * 2 * ff, dact + r0 * ff, h13_16 + r0 * 2 * ff,
                              offsets[n_experts] - offsets[0], ff);
}
void cuda_expert_matmul_backward_weight_bf16(moe_backend *be, real *dweight, const moe_bf16 *dout,
                                             const moe_bf16 *inp, const int *offsets, int n_experts,
                                             int n_out, int n_in) {
    cuda_expert_backward_weight_typed(be, dweight, dout, inp, offsets, n_experts, n_out, n_in,
                                      CUDA_R_16BF, sizeof(moe_bf16));
}
