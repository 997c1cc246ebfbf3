// Router: softmax + top-k + renormalisation, and its backward (with the aux and z terms).
#include <math.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_router_softmax_topk(real *probs, real *lse, int *topk_idx, real *weights,
                             const real *logits, int T, int E, int k, int norm_topk_prob) {
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const real *z = logits + (size_t)t * E;
        real *p = probs + (size_t)t * E;
        int *idx = topk_idx + (size_t)t * k;
        real *w = weights + (size_t)t * k;

        // p = exp(z - max) / sum, lse = max + log(sum)
        real zmax = z[0];
        for (int e = 1; e < E; e++) zmax = z[e] > zmax ? z[e] : zmax;
        real sum = 0;
        for (int e = 0; e < E; e++) {
            p[e] = real_exp(z[e] - zmax);
            sum += p[e];
        }
        for (int e = 0; e < E; e++) p[e] /= sum;
        lse[t] = zmax + real_log(sum);

        // top-k by repeated selection (k is small); strict '>' keeps the lower index on ties.
        real sel_sum = 0;
        for (int j = 0; j < k; j++) {
            int best = -1;
            for (int e = 0; e < E; e++) {
                int taken = 0;
                for (int i = 0; i < j; i++) taken |= idx[i] == e;
                if (!taken && (best < 0 || p[e] > p[best])) best = e;
            }
            idx[j] = best;
            w[j] = p[best];
            sel_sum += p[best];
        }
        if (norm_topk_prob)
            for (int j = 0; j < k; j++) w[j] /= sel_sum;
    }
}

void cpu_router_backward(real *dlogits, const real *dweights, const real *probs,
                         const real *lse, const int *topk_idx, const real *weights,
                         const int *counts, int T, int E, int k, int norm_topk_prob,
                         real aux_coef, real z_coef, real dloss) {
    // d L_aux / d p_e(t) = aux_coef * E * f_e / T with f_e = c_e / (k T)
    const real aux_scale = dloss * aux_coef * (real)E / ((real)k * (real)T * (real)T);
    const real z_scale = dloss * 2 * z_coef / (real)T;
#pragma omp parallel for schedule(static)
    for (int t = 0; t < T; t++) {
        const real *p = probs + (size_t)t * E;
        const int *idx = topk_idx + (size_t)t * k;
        const real *w = weights + (size_t)t * k;
        const real *dw = dweights + (size_t)t * k;
        real *dz = dlogits + (size_t)t * E; // holds dL/dp first, then dL/dz

        for (int e = 0; e < E; e++) dz[e] = aux_scale * (real)counts[e];
        if (norm_topk_prob) {
            // w_j = p_j / S, S = sum_sel p  =>  dL/dp_j = (dw_j - sum_i dw_i w_i) / S
            real sel_sum = 0, dot = 0;
            for (int j = 0; j < k; j++) {
                sel_sum += p[idx[j]];
                dot += dw[j] * w[j];
            }
            for (int j = 0; j < k; j++) dz[idx[j]] += (dw[j] - dot) / sel_sum;
        } else {
            for (int j = 0; j < k; j++) dz[idx[j]] += dw[j];
        }
        // softmax backward: dz_e = p_e (dp_e - sum_i p_i dp_i); then z-loss
        real pdp = 0;
        for (int e = 0; e < E; e++) pdp += p[e] * dz[e];
        for (int e = 0; e < E; e++) dz[e] = p[e] * (dz[e] - pdp) + z_scale * lse[t] * p[e];
    }
}
