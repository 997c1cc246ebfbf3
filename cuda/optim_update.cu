// The optimizer updates on the GPU, twin of layers/cpu/optim_update.c: one thread per
// parameter (AdamW on cuda/bodies.h's body), the bf16 copy written in the same pass.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/bodies.h"
#include "layers/bf16.h"

static __global__ void k_adamw(real *params, moe_bf16 *params16, real *m, real *v,
                               const real *grads, size_t n, moe_adamw_hparams hp) {
    GRID_STRIDE(i, n) {
        moe_hd_adamw(&params[i], &m[i], &v[i], grads[i], hp);
        if (params16) params16[i] = moe_f32_to_bf16((float)params[i]);
    }
}
void cuda_adamw_update(moe_backend *be, real *params, moe_bf16 *params16, real *m, real *v,
                       const real *grads, size_t n, moe_adamw_hparams hp) {
    if (!n) return;
    k_adamw<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(params, params16, m,
                                                                              v, grads, n, hp);
    CUDA_LAUNCHED(be, "k_adamw");
}
static __global__ void k_sgd(real *params, moe_bf16 *params16, const real *grads, size_t n, real lr,
                             real grad_scale) {
    GRID_STRIDE(i, n) {
        params[i] -= lr * grad_scale * grads[i];
        if (params16) params16[i] = moe_f32_to_bf16((float)params[i]);
    }
}
void cuda_sgd_update(moe_backend *be, real *params, moe_bf16 *params16, const real *grads, size_t n,
                     real lr, real grad_scale) {
    if (!n) return;
    k_sgd<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(params, params16, grads,
                                                                            n, lr, grad_scale);
    CUDA_LAUNCHED(be, "k_sgd");
}
