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
#include "layers/rng.h"

void cpu_router_topk(moe_backend *be, real *scores, real *probs, real *lse, int *topk_idx,
                     real *weights, const real *logits, const real *bias, int T, int E, int k,
                     moe_scoring scoring, int norm_topk_prob, real route_scale) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * E))
    for (int t = 0; t < T; t++) {
        const real *z = logits + (size_t)t * E;
        real *s = scores + (size_t)t * E, *p = probs + (size_t)t * E;
        int *idx = topk_idx + (size_t)t * k;
        real *w = weights + (size_t)t * k;

        // lse = max + log(sum exp(z - max)); softmax p = exp(z - lse)
        real zmax = z[0];
        for (int e = 1; e < E; e++) zmax = z[e] > zmax ? z[e] : zmax;
        real sum = 0;
        for (int e = 0; e < E; e++) sum += real_exp(z[e] - zmax);
        lse[t] = zmax + real_log(sum);
        if (scoring == MOE_SCORE_SOFTMAX) {
            for (int e = 0; e < E; e++) s[e] = p[e] = real_exp(z[e] - zmax) / sum;
        } else {
            real ssum = 0;
            for (int e = 0; e < E; e++) ssum += s[e] = 1 / (1 + real_exp(-z[e]));
            for (int e = 0; e < E; e++) p[e] = s[e] / ssum;
        }

        // top-k by repeated selection (k is small); strict '>' keeps the lower index on ties
        real sel_sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            real best_v = 0;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= idx[i] == e;
                real v = bias ? s[e] + bias[e] : s[e];
                if (!taken && (best < 0 || v > best_v)) best = e, best_v = v;
            }
            idx[j] = best;
            w[j] = s[best];
            sel_sum += s[best];
        }
        for (int j = 0; j < k; j++) w[j] = route_scale * (norm_topk_prob ? w[j] / sel_sum : w[j]);
    }
}

void cpu_moe_seq_counts(moe_backend *be, int *seq_counts, const int *topk_idx, int T, int k, int E,
                        int seq_len) {
    CPU_KERNEL(be);
    const int B = T / seq_len;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * E))
    for (int b = 0; b < B; b++) {
        int *c = seq_counts + (size_t)b * E;
        for (int e = 0; e < E; e++) c[e] = 0;
        for (size_t s = (size_t)b * seq_len * k; s < (size_t)(b + 1) * seq_len * k; s++)
            c[topk_idx[s]]++;
    }
}

// dL/ds'_e(t) = aux_coef E f_e / T + seq_aux_coef E f_{b,e} / (B seq_len), with
// f_e = c_e / (k T) and f_{b,e} = c_{b,e} / (k seq_len): gradients through P only.
void cpu_router_backward(moe_backend *be, real *dlogits, const real *dweights, const real *scores,
                         const real *probs, const real *logits, const real *lse,
                         const int *topk_idx, const real *weights, const int *counts,
                         const int *seq_counts, int T, int E, int k, int seq_len,
                         moe_scoring scoring, int norm_topk_prob, real route_scale, real aux_coef,
                         real seq_aux_coef, real z_coef, real dloss) {
    CPU_KERNEL(be);
    const int B = T / seq_len;
    const real aux_scale = dloss * aux_coef * (real)E / ((real)k * (real)T * (real)T);
    const real seq_scale =
        dloss * seq_aux_coef * (real)E / ((real)B * (real)k * (real)seq_len * (real)seq_len);
    const real z_scale = dloss * 2 * z_coef / (real)T;
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * E))
    for (int t = 0; t < T; t++) {
        const real *s = scores + (size_t)t * E, *p = probs + (size_t)t * E,
                   *z = logits + (size_t)t * E;
        const int *idx = topk_idx + (size_t)t * k, *sc = seq_counts + (size_t)(t / seq_len) * E;
        const real *w = weights + (size_t)t * k, *dw = dweights + (size_t)t * k;
        real *g = dlogits + (size_t)t * E; // dL/dp' first, then dL/ds, then dL/dz

        // balancing losses, through the distribution s'
        for (int e = 0; e < E; e++)
            g[e] = aux_scale * (real)counts[e] + (seq_aux_coef != 0 ? seq_scale * (real)sc[e] : 0);
        if (scoring ==
            MOE_SCORE_SIGMOID) { // s' = s / sum(s): dL/ds_e = (g_e - sum_j g_j s'_j) / sum(s)
            real ssum = 0, dot = 0;
            for (int e = 0; e < E; e++) ssum += s[e], dot += g[e] * p[e];
            for (int e = 0; e < E; e++) g[e] = (g[e] - dot) / ssum;
        }
        // combine weights: w_j = rs s_j / S  =>  dL/ds_i = (rs dw_i - sum_j dw_j w_j) / S;
        // unnormalised: dL/ds_i = rs dw_i
        if (norm_topk_prob) {
            real sel_sum = 0, dot = 0;
            for (int j = 0; j < k; j++) sel_sum += s[idx[j]], dot += dw[j] * w[j];
            for (int j = 0; j < k; j++) g[idx[j]] += (route_scale * dw[j] - dot) / sel_sum;
        } else {
            for (int j = 0; j < k; j++) g[idx[j]] += route_scale * dw[j];
        }
        // scores to logits: softmax dz_e = p_e (g_e - sum_i p_i g_i); sigmoid dz = g s (1 - s)
        if (scoring == MOE_SCORE_SOFTMAX) {
            real pg = 0;
            for (int e = 0; e < E; e++) pg += p[e] * g[e];
            for (int e = 0; e < E; e++) g[e] = p[e] * (g[e] - pg);
        } else {
            for (int e = 0; e < E; e++) g[e] *= s[e] * (1 - s[e]);
        }
        // z-loss: d/dz_e of z_coef mean_t lse^2 = (2 z_coef / T) lse softmax(z)_e
        for (int e = 0; e < E; e++) g[e] += z_scale * lse[t] * real_exp(z[e] - lse[t]);
    }
}

void cpu_uniform_noise(moe_backend *be, real *u, size_t n, uint64_t key, real lo, real hi) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) {
        // counter-based: the value of element i depends only on (key, i)
        const uint64_t x = moe_mix64(key ^ (MOE_GOLDEN_GAMMA * (i + 1)));
        u[i] = lo + (hi - lo) * (real)((double)(x >> 40) * 0x1.0p-24);
    }
}
