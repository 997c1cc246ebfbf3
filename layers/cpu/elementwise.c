// Elementwise sums and reductions.
#include <stdlib.h>

#include "layers/cpu/cpu_kernels.h"

void cpu_add(moe_backend *be, real *out, const real *a, const real *b, size_t n) {
    CPU_KERNEL(be);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

// sum x_i^2 in double, in a fixed order whatever the thread count: blocks of SQ_BLOCK values,
// each summed in SQ_LANES interleaved lanes (lane l: i = l mod SQ_LANES, so the compiler keeps
// the lanes in one vector register and the loop runs at memory speed, not at the latency of
// one chain of adds), the lanes then the tail added in order, then the blocks in order.
#define SQ_LANES 8
#define SQ_BLOCK 8192

static double sum_squares_block(const real *x, size_t n) {
    double lane[SQ_LANES] = {0};
    size_t i = 0;
    for (; i + SQ_LANES <= n; i += SQ_LANES)
        for (int l = 0; l < SQ_LANES; l++) lane[l] += (double)x[i + l] * x[i + l];
    double acc = 0;
    for (int l = 0; l < SQ_LANES; l++) acc += lane[l];
    for (; i < n; i++) acc += (double)x[i] * x[i];
    return acc;
}

void cpu_sum_squares(moe_backend *be, double *host_out, const real *x, size_t n) {
    CPU_KERNEL(be);
    const size_t blocks = (n + SQ_BLOCK - 1) / SQ_BLOCK;
    double small[64], *part = blocks <= 64 ? small : malloc(blocks * sizeof(double));
    if (!part) moe_fatal("cpu: sum_squares: cannot allocate %zu partial sums", blocks);
#pragma omp parallel for schedule(static) if (cpu_parallel_worth(n))
    for (size_t b = 0; b < blocks; b++) {
        const size_t lo = b * SQ_BLOCK, len = n - lo < SQ_BLOCK ? n - lo : SQ_BLOCK;
        part[b] = sum_squares_block(x + lo, len);
    }
    double acc = 0;
    for (size_t b = 0; b < blocks; b++) acc += part[b];
    if (part != small) free(part);
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
