// Elementwise sums and reductions.
#include "layers/cpu/cpu_kernels.h"

void cpu_add(moe_backend *be, real *out, const real *a, const real *b, size_t n) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void cpu_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n) {
    CPU_KERNEL(be);
    double acc = 0;
#pragma omp parallel for schedule(static) reduction(+ : acc) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) acc += (double)x[i] * x[i];
    *host_out = acc;
}

// Serial, in index order: the loss of a step is a sum of at most a few thousand per-token
// values, and the same order on every thread count keeps resumed runs bit-exact.
void cpu_sum(moe_backend *be, double *host_out, const real *x, size_t n) {
    CPU_KERNEL(be);
    double acc = 0;
    for (size_t i = 0; i < n; i++) acc += x[i];
    *host_out = acc;
}
