// Elementwise sums and reductions.
#include "layers/cpu/cpu_kernels.h"

void cpu_add(real *out, const real *a, const real *b, size_t n) {
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_sum_squares(double *host_out, const real *x, size_t n) {
    double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
    *host_out = acc;
}
