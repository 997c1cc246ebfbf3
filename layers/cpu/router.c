// Router: scores, top-k selection and combine weights, and the backward of everything
// that reaches the router logits (combine weights, load-balancing losses, z-loss).
//
// Scores s (softmax: p = softmax(z); sigmoid: s = sigmoid(z), DeepSeek-V3) and the
// per-token expert distribution s' used by the balancing losses (softmax: p; sigmoid:
// s / sum_e s_e). Selection: top-k of s + bias (ties: lower expert index); combine weights
// from the unbiased scores: w = route_scale * s_sel / sum(s_sel) if norm_topk_prob, else
// route_scale * s_sel.
#include <math.h>

#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"
#include "layers/router_rows.h"

void cpu_router_topk(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                     real *weights, const real *logits, const real *bias, moe_router_shape sh,
                     moe_router_hparams hp) {
    CPU_KERNEL(be);
    const int T = sh.T, E = sh.E, k = sh.k;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * E))
    for (int t = 0; t < T; t++)
        moe_router_topk_row(scores + (size_t)t * E, probs + (size_t)t * E, lse + t,
                            topk_idx + (size_t)t * k, weights + (size_t)t * k,
                            logits + (size_t)t * E, bias, E, k, hp);
}

// The gradient of one token: layers/router_rows.h (moe_router_backward_row).
void cpu_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                         const real *probs, const real *logits, const real *lse,
                         const int *topk_idx, const real *weights, const int *counts,
                         const int *seq_counts, moe_router_shape sh, moe_router_hparams hp,
                         real dloss) {
    CPU_KERNEL(be);
    const int T = sh.T, E = sh.E, k = sh.k, seq_len = sh.seq_len;
    const moe_router_grad_scales gs = moe_router_grad_scales_of(sh, hp, dloss);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * E))
    for (int t = 0; t < T; t++) {
        const size_t te = (size_t)t * E, tk = (size_t)t * k;
        moe_router_backward_row(dlogits + te, dweights + tk, scores + te, probs + te, logits + te,
                                lse[t], topk_idx + tk, weights + tk, counts,
                                seq_counts + (size_t)(t / seq_len) * E, E, k, hp, gs);
    }
}

void cpu_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++)
        u[i] = moe_noise_value(key, i, lo, hi); // counter-based: depends only on (key, i)
}
