// SwiGLU on the GPU, twin of layers/cpu/expert.c: one thread per element of act, on
// cuda/bodies.h's element bodies (act = silu(h1) * h3 and its gradient); the bf16 layer's
// twins round with layers/bf16.h on the same bodies.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/bodies.h"
#include "layers/bf16.h"

static __global__ void k_swiglu(real *act, const real *h13, size_t N, int ff) {
    GRID_STRIDE(i, N * ff) {
        const size_t r = i / ff, c = i % ff;
        const real *h = h13 + r * 2 * ff;
        act[i] = moe_hd_swiglu(h[c], h[ff + c]);
    }
}
static __global__ void k_swiglu_backward(real *dh13, const real *dact, const real *h13, size_t N,
                                         int ff) {
    GRID_STRIDE(i, N * ff) {
        const size_t r = i / ff, c = i % ff;
        const real *h = h13 + r * 2 * ff;
        real *dh = dh13 + r * 2 * ff;
        moe_hd_swiglu_backward(&dh[c], &dh[ff + c], dact[i], h[c], h[ff + c]);
    }
}

// The bf16 layer's: layers/bf16.h's rounding on the same element bodies.
static __global__ void k_swiglu_bf16(moe_bf16 *act16, moe_bf16 *h13_16, const real *h13, size_t N,
                                     int ff) {
    GRID_STRIDE(i, N * ff) {
        const size_t r = i / ff, c = i % ff;
        const real *h = h13 + r * 2 * ff;
        act16[i] = moe_f32_to_bf16((float)moe_hd_swiglu(h[c], h[ff + c]));
        if (h13_16) {
            h13_16[r * 2 * ff + c] = moe_f32_to_bf16((float)h[c]);
            h13_16[r * 2 * ff + ff + c] = moe_f32_to_bf16((float)h[ff + c]);
        }
    }
}
static __global__ void k_swiglu_backward_bf16(moe_bf16 *dh13_16, const real *dact,
                                              const moe_bf16 *h13_16, size_t N, int ff) {
    GRID_STRIDE(i, N * ff) {
        const size_t r = i / ff, c = i % ff;
        const moe_bf16 *h = h13_16 + r * 2 * ff;
        real d1, d3;
        moe_hd_swiglu_backward(&d1, &d3, dact[i], (real)moe_bf16_to_f32(h[c]),
                               (real)moe_bf16_to_f32(h[ff + c]));
        dh13_16[r * 2 * ff + c] = moe_f32_to_bf16((float)d1);
        dh13_16[r * 2 * ff + ff + c] = moe_f32_to_bf16((float)d3);
    }
}

void cuda_swiglu_forward(moe_backend *be, real *act, const real *h13, int N, int ff) {
    const size_t n = (size_t)N * ff;
    if (!n) return;
    k_swiglu<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(act, h13, (size_t)N,
                                                                               ff);
    CUDA_LAUNCHED(be, "k_swiglu");
}
void cuda_swiglu_backward(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                          int ff) {
    const size_t n = (size_t)N * ff;
    if (!n) return;
    k_swiglu_backward<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        dh13, dact, h13, (size_t)N, ff);
    CUDA_LAUNCHED(be, "k_swiglu_backward");
}
void cuda_swiglu_forward_bf16(moe_backend *be, moe_bf16 *act16, moe_bf16 *h13_16, const real *h13,
                              int N, int ff) {
    const size_t n = (size_t)N * ff;
    if (!n) return;
    k_swiglu_bf16<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        act16, h13_16, h13, (size_t)N, ff);
    CUDA_LAUNCHED(be, "k_swiglu_bf16");
}
void cuda_swiglu_backward_bf16(moe_backend *be, moe_bf16 *dh13_16, const real *dact,
                               const moe_bf16 *h13_16, int N, int ff) {
    const size_t n = (size_t)N * ff;
    if (!n) return;
    k_swiglu_backward_bf16<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        dh13_16, dact, h13_16, (size_t)N, ff);
    CUDA_LAUNCHED(be, "k_swiglu_backward_bf16");
}
