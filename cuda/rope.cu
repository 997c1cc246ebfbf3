// RoPE on the GPU, twin of layers/cpu/rope.c (HF rotate_half): one thread per rotated pair
// on cuda/bodies.h's pair body, then the unrotated heads copied.
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
#include "cuda/bodies.h"

static __global__ void k_rope(real *out, const real *inp, const real *cos, const real *sin,
                              size_t T, int S, int pos0, int n_rot, int n_heads, int hd,
                              real sign) {
    const int half = hd / 2;
    const size_t row = (size_t)n_heads * hd;
    GRID_STRIDE(p, T * n_rot * half) {
        const size_t t = p / ((size_t)n_rot * half);
        const int h = (int)(p / half % n_rot), i = (int)(p % half);
        const size_t pos = (size_t)pos0 + t % S;
        const real *x = inp + t * row + (size_t)h * hd;
        real *o = out + t * row + (size_t)h * hd;
        const real a = x[i], b = x[i + half];
        moe_hd_rope_pair(&o[i], &o[i + half], a, b, cos[pos * half + i],
                         sign * sin[pos * half + i]);
    }
    if (out != inp) {
        const size_t rest = row - (size_t)n_rot * hd;
        GRID_STRIDE(p, T * rest) {
            const size_t at = p / rest * row + (size_t)n_rot * hd + p % rest;
            out[at] = inp[at];
        }
    }
}
void cuda_rope(moe_backend *be, real *out, const real *inp, const real *cos, const real *sin,
               moe_rope_args ra) {
    const size_t n = (size_t)ra.T * ra.n_heads * ra.hd;
    if (!n) return;
    k_rope<<<cuda_grid(n / 2 + 1, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(
        out, inp, cos, sin, (size_t)ra.T, ra.S, ra.pos0, ra.n_rot, ra.n_heads, ra.hd,
        ra.inverse ? -1.0f : 1.0f);
    CUDA_LAUNCHED(be, "k_rope");
}
