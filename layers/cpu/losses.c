// Router losses (values): load-balancing aux loss, z-loss, and the router entropy.
#include <math.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_router_losses(real *out, const real *probs, const real *lse, const int *counts,
                       int T, int E, int k, real aux_coef, real z_coef) {
    // sum_e f_e P_e = sum_t sum_e c_e p_e(t) / (k T^2); accumulated in double.
    double aux_sum = 0, z_sum = 0, ent_sum = 0;
#pragma omp parallel for schedule(static) reduction(+ : aux_sum, z_sum, ent_sum)
    for (int t = 0; t < T; t++) {
        const real *p = probs + (size_t)t * E;
        double a = 0, h = 0;
        for (int e = 0; e < E; e++) {
            a += (double)counts[e] * p[e];
            if (p[e] > 0) h -= (double)p[e] * log((double)p[e]);
        }
        aux_sum += a;
        ent_sum += h;
        z_sum += (double)lse[t] * lse[t];
    }
    out[0] = (real)((double)aux_coef * E * aux_sum / ((double)k * T * T));
    out[1] = (real)((double)z_coef * z_sum / T);
    out[2] = (real)(ent_sum / T);
}
