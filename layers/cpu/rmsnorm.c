// RMSNorm: out = x * rstd * w, rstd = 1 / sqrt(mean(x^2) + eps).
#include <math.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_rmsnorm_forward(moe_backend *be, real *out, real *rstd, const real *inp,
                         const real *weight, int T, int d, real eps) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int t = 0; t < T; t++) {
        const real *x = inp + (size_t)t * d;
        real *o = out + (size_t)t * d;
        double ss = 0;
        for (int i = 0; i < d; i++) ss += (double)x[i] * x[i];
        real r = (real)(1.0 / sqrt(ss / d + eps));
        for (int i = 0; i < d; i++) o[i] = x[i] * r * weight[i];
        rstd[t] = r;
    }
}

// With n = x * rstd and g = w * dout:
//   dx = rstd * (g - n * mean_i(g_i n_i)),   dw = sum_t dout * n
void cpu_rmsnorm_backward(moe_backend *be, real *dinp, real *dweight, const real *dout,
                          const real *inp, const real *weight, const real *rstd, int T, int d) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int t = 0; t < T; t++) {
        const real *x = inp + (size_t)t * d, *g = dout + (size_t)t * d;
        real *dx = dinp + (size_t)t * d;
        real r = rstd[t];
        double dot = 0;
        for (int i = 0; i < d; i++) dot += (double)weight[i] * g[i] * x[i] * r;
        real mean = (real)(dot / d);
        for (int i = 0; i < d; i++) dx[i] += r * (weight[i] * g[i] - x[i] * r * mean);
    }
    // weight gradient: a reduction over tokens, split over columns
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)T * d))
    for (int i = 0; i < d; i++) {
        real acc = 0;
        for (int t = 0; t < T; t++)
            acc += dout[(size_t)t * d + i] * inp[(size_t)t * d + i] * rstd[t];
        dweight[i] += acc;
    }
}
