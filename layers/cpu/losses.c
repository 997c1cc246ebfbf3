// Router losses (values) and router statistics.
#include <math.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_router_losses(moe_backend *be, real *out, const real *probs, const real *logits,
                       const real *lse, const int *counts, const int *seq_counts, int T, int E,
                       int k, int seq_len, real aux_coef, real seq_aux_coef, real z_coef) {
    CPU_KERNEL(be);
    // sum_e f_e P_e = sum_t sum_e c_e s'_e(t) / (k T^2); per sequence likewise with its own
    // counts and tokens. Accumulated in double.
    const int B = T / seq_len;
    double aux_sum = 0, seq_sum = 0, z_sum = 0, ent_sum = 0, zsum = 0, zsq = 0, zmax = 0,
           lse_sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : aux_sum, seq_sum, z_sum, ent_sum, zsum, zsq, lse_sum) reduction(max : zmax) if (cpu_parallel_worth((size_t)T * E))
    for (int t = 0; t < T; t++) {
        const real *p = probs + (size_t)t * E, *z = logits + (size_t)t * E;
        const int *sc = seq_counts + (size_t)(t / seq_len) * E;
        double a = 0, sa = 0, h = 0;
        for (int e = 0; e < E; e++) {
            a += (double)counts[e] * p[e];
            if (seq_aux_coef != 0) sa += (double)sc[e] * p[e];
            if (p[e] > 0) h -= (double)p[e] * log((double)p[e]);
            zsum += z[e], zsq += (double)z[e] * z[e];
            if (fabs(z[e]) > zmax || z[e] != z[e]) zmax = fabs(z[e]);
        }
        aux_sum += a;
        seq_sum += sa;
        ent_sum += h;
        z_sum += (double)lse[t] * lse[t];
        lse_sum += lse[t];
    }
    double n = (double)T * E, mean = zsum / n;
    out[MOE_LOSS_AUX] = (real)((double)aux_coef * E * aux_sum / ((double)k * T * T));
    out[MOE_LOSS_Z] = (real)((double)z_coef * z_sum / T);
    out[MOE_LOSS_ENTROPY] = (real)(ent_sum / T);
    out[MOE_LOSS_SEQ_AUX] =
        (real)((double)seq_aux_coef * E * seq_sum / ((double)B * k * seq_len * seq_len));
    out[MOE_LOSS_LOGIT_MEAN] = (real)mean;
    out[MOE_LOSS_LOGIT_STD] = (real)sqrt(fmax(zsq / n - mean * mean, 0));
    out[MOE_LOSS_LOGIT_MAX_ABS] = (real)zmax;
    out[MOE_LOSS_LSE_MEAN] = (real)(lse_sum / T);
}

void cpu_mul(moe_backend *be, real *out, const real *a, const real *b, size_t n, int accumulate) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = (accumulate ? out[i] : 0) + a[i] * b[i];
}
