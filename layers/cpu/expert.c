// SwiGLU, the expert activation: act = silu(h1) * h3, with [h1 | h3] one row of h13.
#include "layers/cpu/cpu_kernels.h"
#include "layers/cpu/vec_math.h"

void cpu_swiglu_forward(moe_backend *be, real *act, const real *h13, int N, int ff) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)N * ff))
    for (int r = 0; r < N; r++) {
        const real *h1 = h13 + (size_t)r * 2 * ff, *h3 = h1 + ff;
        real *a = act + (size_t)r * ff;
        for (int i = 0; i < ff; i++) a[i] = h1[i] / (1 + vec_exp(-h1[i])) * h3[i];
    }
}

void cpu_swiglu_backward(moe_backend *be, real *dh13, const real *dact, const real *h13, int N,
                         int ff) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth((size_t)N * ff))
    for (int r = 0; r < N; r++) {
        const real *h1 = h13 + (size_t)r * 2 * ff, *h3 = h1 + ff, *g = dact + (size_t)r * ff;
        real *dh1 = dh13 + (size_t)r * 2 * ff, *dh3 = dh1 + ff;
        for (int i = 0; i < ff; i++) {
            real a = h1[i];
            real s = 1 / (1 + vec_exp(-a)); // sigmoid(a)
            dh1[i] = g[i] * h3[i] * s * (1 + a * (1 - s));
            dh3[i] = g[i] * a * s;
        }
    }
}
