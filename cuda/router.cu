// The router on the GPU, twin of layers/cpu/router.c: one thread per token runs the CPU's own
// per-token bodies (layers/router_rows.h: scores, top-k with its tie rule, combine weights, the
// gradient), so selection and ties are the CPU's; the jitter noise is the same counter-based
// function of (key, i).
#include "cuda/cuda_kernels.cuh" // first: the C headers as C++
extern "C" {
#include "layers/router_rows.h"
}

static __global__ void k_router_topk(real *scores, real *probs, real *lse, int *topk_idx,
                                     real *weights, const real *logits, const real *bias, size_t T,
                                     int E, int k, moe_router_hparams hp) {
    GRID_STRIDE(t, T) {
        moe_router_topk_row(scores + t * E, probs + t * E, lse + t, topk_idx + t * k,
                            weights + t * k, logits + t * E, bias, E, k, hp);
    }
}

void cuda_router_topk(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                      real *weights, const real *logits, const real *bias, moe_router_shape sh,
                      moe_router_hparams hp) {
    if (sh.T <= 0) return;
    k_router_topk<<<cuda_grid((size_t)sh.T, 128), 128, 0, cuda_stream(be)>>>(
        scores, probs, lse, topk_idx, weights, logits, bias, (size_t)sh.T, sh.E, sh.k, hp);
    CUDA_LAUNCHED(be, "k_router_topk");
}

static __global__ void k_router_backward(real *dlogits, const real *dweights, const real *scores,
                                         const real *probs, const real *logits, const real *lse,
                                         const int *topk_idx, const real *weights,
                                         const int *counts, const int *seq_counts, size_t T, int E,
                                         int k, int seq_len, moe_router_hparams hp,
                                         moe_router_grad_scales gs) {
    GRID_STRIDE(t, T) {
        const size_t te = t * E, tk = t * k;
        moe_router_backward_row(dlogits + te, dweights + tk, scores + te, probs + te, logits + te,
                                lse[t], topk_idx + tk, weights + tk, counts,
                                seq_counts + (t / seq_len) * E, E, k, hp, gs);
    }
}

void cuda_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                          const real *probs, const real *logits, const real *lse,
                          const int *topk_idx, const real *weights, const int *counts,
                          const int *seq_counts, moe_router_shape sh, moe_router_hparams hp,
                          real dloss) {
    if (sh.T <= 0) return;
    const moe_router_grad_scales gs = moe_router_grad_scales_of(sh, hp, dloss);
    k_router_backward<<<cuda_grid((size_t)sh.T, 128), 128, 0, cuda_stream(be)>>>(
        dlogits, dweights, scores, probs, logits, lse, topk_idx, weights, counts, seq_counts,
        (size_t)sh.T, sh.E, sh.k, sh.seq_len, hp, gs);
    CUDA_LAUNCHED(be, "k_router_backward");
}

static __global__ void k_noise(real *u, size_t n, uint64_t key, real lo, real hi) {
    GRID_STRIDE(i, n) u[i] = moe_noise_value(key, i, lo, hi);
}
void cuda_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi) {
    if (!n) return;
    k_noise<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(u, n, key, lo, hi);
    CUDA_LAUNCHED(be, "k_noise");
}
