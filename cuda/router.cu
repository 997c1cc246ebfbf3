// The router on the GPU: one thread per token runs the CPU's own per-token bodies
// (layers/router_rows.h: scores, top-k with its tie rule, combine weights, the gradient), so
// selection and ties are the CPU's; the losses are block reductions in double; the jitter
// noise is the same counter-based function of (key, i).
#include "cuda/cuda_kernels.cuh"
#include "cuda/reduce.cuh"
extern "C" {
#include "layers/router_rows.h"
}

#define GRID_STRIDE(i, n)                                                   \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (size_t)gridDim.x * blockDim.x)

__global__ void k_router_topk(real *scores, real *probs, real *lse, int *topk_idx, real *weights,
                              const real *logits, const real *bias, size_t T, int E, int k,
                              moe_scoring scoring, int norm_topk_prob, real route_scale) {
    GRID_STRIDE(t, T) {
        moe_router_topk_row(scores + t * E, probs + t * E, lse + t, topk_idx + t * k,
                            weights + t * k, logits + t * E, bias, E, k, scoring, norm_topk_prob,
                            route_scale);
    }
}

void cuda_router_topk(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                      real *weights, const real *logits, const real *bias, int T, int E, int k,
                      moe_scoring scoring, int norm_topk_prob, real route_scale) {
    if (T <= 0) return;
    k_router_topk<<<cuda_grid((size_t)T, 128), 128, 0, cuda_stream(be)>>>(
        scores, probs, lse, topk_idx, weights, logits, bias, (size_t)T, E, k, scoring,
        norm_topk_prob, route_scale);
    CUDA_LAUNCHED(be, "k_router_topk");
}

__global__ void k_router_backward(real *dlogits, const real *dweights, const real *scores,
                                  const real *probs, const real *logits, const real *lse,
                                  const int *topk_idx, const real *weights, const int *counts,
                                  const int *seq_counts, size_t T, int E, int k, int seq_len,
                                  moe_scoring scoring, int norm_topk_prob, real route_scale,
                                  moe_router_grad_scales gs) {
    GRID_STRIDE(t, T) {
        const size_t te = t * E, tk = t * k;
        moe_router_backward_row(dlogits + te, dweights + tk, scores + te, probs + te, logits + te,
                                lse[t], topk_idx + tk, weights + tk, counts,
                                seq_counts + (t / seq_len) * E, E, k, scoring, norm_topk_prob,
                                route_scale, gs);
    }
}

void cuda_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                          const real *probs, const real *logits, const real *lse,
                          const int *topk_idx, const real *weights, const int *counts,
                          const int *seq_counts, int T, int E, int k, int seq_len,
                          moe_scoring scoring, int norm_topk_prob, real route_scale, real aux_coef,
                          real seq_aux_coef, real z_coef, real dloss) {
    if (T <= 0) return;
    const moe_router_grad_scales gs =
        moe_router_grad_scales_of(T, E, k, seq_len, aux_coef, seq_aux_coef, z_coef, dloss);
    k_router_backward<<<cuda_grid((size_t)T, 128), 128, 0, cuda_stream(be)>>>(
        dlogits, dweights, scores, probs, logits, lse, topk_idx, weights, counts, seq_counts,
        (size_t)T, E, k, seq_len, scoring, norm_topk_prob, route_scale, gs);
    CUDA_LAUNCHED(be, "k_router_backward");
}

// One block: layers/router_rows.h's per-token sums in double (a fixed-shape tree per field),
// then its formulas, as on the CPU.
__global__ void k_router_losses(real *out, const real *probs, const real *logits, const real *lse,
                                const int *counts, const int *seq_counts, int T, int E, int k,
                                int seq_len, real aux_coef, real seq_aux_coef, real z_coef) {
    moe_router_loss_sums s = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int t = threadIdx.x; t < T; t += blockDim.x)
        s = moe_router_loss_sums_add(
            s, moe_router_loss_row(probs + (size_t)t * E, logits + (size_t)t * E, lse[t], counts,
                                   seq_counts + (size_t)(t / seq_len) * E, E, seq_aux_coef != 0));
    s.aux = block_sum(s.aux), s.seq = block_sum(s.seq), s.ent = block_sum(s.ent);
    s.z = block_sum(s.z), s.lse = block_sum(s.lse);
    s.zsum = block_sum(s.zsum), s.zsq = block_sum(s.zsq), s.zmax = block_max(s.zmax);
    if (threadIdx.x == 0)
        moe_router_losses_of(out, s, T, E, k, seq_len, aux_coef, seq_aux_coef, z_coef);
}

void cuda_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                        const real *lse, const int *counts, const int *seq_counts, int T, int E,
                        int k, int seq_len, real aux_coef, real seq_aux_coef, real z_coef) {
    k_router_losses<<<1, 512, 0, cuda_stream(be)>>>(out, probs, logits, lse, counts, seq_counts, T,
                                                    E, k, seq_len, aux_coef, seq_aux_coef, z_coef);
    CUDA_LAUNCHED(be, "k_router_losses");
}

__global__ void k_noise(real *u, size_t n, uint64_t key, real lo, real hi) {
    GRID_STRIDE(i, n) u[i] = moe_noise_value(key, i, lo, hi);
}
void cuda_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi) {
    if (!n) return;
    k_noise<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(u, n, key, lo, hi);
    CUDA_LAUNCHED(be, "k_noise");
}

__global__ void k_mul(real *out, const real *a, const real *b, size_t n, int accumulate) {
    GRID_STRIDE(i, n) out[i] = (accumulate ? out[i] : 0) + a[i] * b[i];
}
void cuda_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate) {
    if (!n) return;
    k_mul<<<cuda_grid(n, CUDA_THREADS), CUDA_THREADS, 0, cuda_stream(be)>>>(out, a, b, n,
                                                                            accumulate);
    CUDA_LAUNCHED(be, "k_mul");
}
